"""docs/options.md's tables are the comments of conf/base.yaml and conf/algo/ALGO.yaml, as scripts/options_doc.py
writes them: an option is described once, in its file, and the page cannot drift from it."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("options_doc", ROOT / "scripts" / "options_doc.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_page_is_what_the_script_writes():
    doc = load()
    text = doc.DOC.read_text()
    assert doc.page(text) == text, (
        "docs/options.md differs from the comments in conf/: run PYTHONPATH=src python scripts/options_doc.py"
    )


def test_every_option_has_a_comment():
    doc = load()
    files = [ROOT / "conf" / "base.yaml", *sorted((ROOT / "conf" / "algo").glob("*.yaml"))]
    bare = [f"{path.name}: {row.keys}" for path in files for row in doc.rows(path) if not row.comment]
    assert not bare, f"options without a comment above them (their description): {bare}"


def test_a_comment_describes_the_keys_below_it(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text(
        "# the file's header\n\nmodel:\n  # both incentives\n  alpha0: 0.0\n  alpha1: 1.0\n  # the group\n  ppo:\n"
        "    # discount\n    gamma: 0.5\n  agents:\n    # inside a list: not an option\n    - lr: 1.0\n  # after\n"
        "  clip: 0.2\n"
    )
    rows = [(row.keys, " ".join(row.comment), row.group) for row in load().rows(path)]
    assert rows == [
        (["model.alpha0", "model.alpha1"], "both incentives", False),
        (["model.ppo"], "the group", True),
        (["model.ppo.gamma"], "discount", False),
        (["model.agents"], "", False),
        (["model.clip"], "after", False),
    ]
