"""The README and the docs/ pages point at things that exist, and the README's quick start is CI's.

- every relative link (``[text](target)``, ``![alt](target)``) of ``README.md`` and ``docs/*.md`` names an
  existing file or folder, and its ``#anchor``, where it has one, a heading of the page it names;
- every repository path the pages name in code (``conf/presets/x.yaml``, ``tests/.../test_x.py``,
  ``benchmarks/x.py``, ...; a ``*`` must match at least one file) exists, and every ``collab.x.y`` module
  (or ``collab.x.y.Name``) they name is a module of ``src/collab`` (or a name it defines): moving a module
  without fixing the docs fails here. The logs (``docs/measurements.md``, ``docs/comparison.md``) are
  records of their day and are checked for links only;
- the README's quick start is one ``bash`` block of exactly the two commands: the set-up with the main
  job, and the test command that ``.ci/run`` runs verbatim.

Plain text only: no model, no torch; well under a second.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LOGS = {"measurements.md", "comparison.md"}
QUICK_START = [
    "bash scripts/setup.sh && .venv/bin/python -m collab.fit --algo marft_a",
    "bash scripts/setup.sh --with-vllm && .venv/bin/python -m pytest -q -n 2 --dist loadfile",
]

FENCE = re.compile(r"^(```|~~~)(\w*)\n(.*?)^\1[ \t]*$", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
CODE = re.compile(r"(`+)(.+?)\1", re.S)
TOP = ("src/", "tests/", "benchmarks/", "conf/", "scripts/", "notebooks/", "docs/", ".ci/")
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(t) for t in TOP) + r")[\w./*-]*)")
MODULE = re.compile(r"(?<![\w./-])(collab(?:\.[A-Za-z_]\w*)+)")


def prose(text: str) -> str:
    """The page without its fenced blocks and inline code (where a link is no link)."""
    return CODE.sub("", FENCE.sub("", text))


def code(text: str) -> list[str]:
    """The page's inline code spans and fenced blocks (where paths and modules are named)."""
    spans = [m.group(3) for m in FENCE.finditer(text)]
    return spans + [m.group(2) for m in CODE.finditer(FENCE.sub("", text))]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped (underscores kept, as GitHub keeps
    them), spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", FENCE.sub("", page.read_text()), re.M)}


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(prose(page.read_text()))]


def test_pages_are_found():
    names = {p.name for p in PAGES}
    assert "README.md" in names and "references.md" in names and len(PAGES) > 5


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    bad = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)


def module_ok(dotted: str) -> bool:
    """``collab.a.b`` is a module or package of src/, or ``collab.a.b.Name`` a name defined in one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT / "src" / Path(*parts[:cut])
        for file in (base.with_suffix(".py"), base / "__init__.py"):
            if file.is_file():
                rest = parts[cut:]
                if not rest:
                    return True
                return len(rest) == 1 and rest[0] in defined(file)
    return False


def defined(file: Path) -> set[str]:
    """The names a module defines or imports at its top level (classes, functions, assignments, imports)."""
    names = set()
    for node in ast.parse(file.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


@pytest.mark.parametrize("page", [p for p in PAGES if p.name not in LOGS], ids=lambda p: p.name)
def test_named_paths_and_modules_exist(page):
    bad = []
    for span in code(page.read_text()):
        for path in PATH.findall(span):
            path = path.rstrip(".")
            if re.search(r"[A-Z]{2,}|<|\.\.\.", path):  # placeholders: conf/algo/NAME.yaml, <algo>, ...
                continue
            if not (list(ROOT.glob(path.rstrip("/"))) if "*" in path else (ROOT / path).exists()):
                bad.append(path)
        bad += [m for m in MODULE.findall(span) if not module_ok(m.rstrip("."))]
    assert not bad, f"{page.relative_to(ROOT)} names what does not exist: {sorted(set(bad))}"


def quick_start() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"^## Quick start\n(.*?)(?=^## )", readme, re.S | re.M)
    assert section, "README.md has no '## Quick start' section"
    block = FENCE.search(section.group(1))
    assert block and block.group(2) == "bash", "the quick start's first block is not a bash block"
    return [line for line in block.group(3).splitlines() if line.strip()]


def test_quick_start_is_the_two_commands():
    assert quick_start() == QUICK_START


def test_ci_runs_the_readme_test_command_verbatim():
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    assert quick_start()[1] in ci


def test_quick_start_commands_exist():
    setup = (ROOT / "scripts/setup.sh").read_text()
    assert "--with-vllm" in setup and ".venv" in setup
    algo = re.search(r"--algo (\w+)", quick_start()[0]).group(1)
    assert (ROOT / "conf" / "algo" / f"{algo}.yaml").is_file()
