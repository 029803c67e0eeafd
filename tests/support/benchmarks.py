"""Load a script of ``benchmarks/`` (not a package) as a module, for the tests of its pure parts; read its markdown
reports."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` as the module ``NAME_benchmark``."""
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", ROOT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def section(report: str, title: str) -> str:
    """The text under a benchmark report's ``## title`` heading, up to the next one."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", report, re.S | re.M)
    assert match, f"no section {title!r} in:\n{report}"
    return match.group(1)


def rows(text: str) -> dict[str, list[str]]:
    """A section's first markdown table: its first cell -> the row's cells."""
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    return {r[0]: r for r in cells[1:]}
