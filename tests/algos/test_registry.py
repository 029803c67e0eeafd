"""A new algorithm is its file, its ``conf/algo/NAME.yaml``, its line in ``collab.algos.algo_registry()`` and its
row of test settings (``tests/support/algos.py``): every test that runs each algorithm takes its list from the
registry, so none skips the new one."""

import re
import shutil
import sys
from pathlib import Path

import collab.algos
import collab.config
from tests.support.algos import ALGO_TESTS, algos

pytest_plugins = ("pytester",)

ROOT = Path(__file__).resolve().parents[2]
PER_ALGORITHM = [
    "tests/algos/test_one_env_for_all.py",
    "tests/algos/test_skeleton.py",
    "tests/config/test_agent_defaults.py",
    "tests/config/test_compose.py",
    "tests/config/test_defaults.py",
    "tests/config/test_pairs.py",
    "tests/training/test_bad_input.py",
    "tests/training/test_ddp.py",
    "tests/training/test_ddp_more.py",
    "tests/training/test_fsdp.py",
    "tests/training/test_resume.py",
]
"""The test files with a test per algorithm (or per algorithm and something else)."""


def test_every_registered_algorithm_has_its_test_settings():
    missing = [algo for algo in algos() if algo not in ALGO_TESTS]
    assert not missing, f"registered without a row of test settings in tests/support/algos.py: {missing}"
    assert sorted(ALGO_TESTS) == algos(), "rows of tests/support/algos.py for no registered algorithm"


def collected(pytester) -> dict[str, list[str]]:
    """Each test function of :data:`PER_ALGORITHM` -> its parameter ids (a test split over files: one list)."""
    result = pytester.runpytest_inprocess(
        "--collect-only", "-q", "-p", "no:cacheprovider", f"--rootdir={ROOT}", f"-c={ROOT / 'setup.cfg'}",
        *(str(ROOT / path) for path in PER_ALGORITHM),
    )  # fmt: skip
    assert result.ret == 0, "\n".join(result.outlines[-30:])
    tests: dict[str, list[str]] = {}
    for line in result.outlines:
        match = re.fullmatch(r"tests/\S+::(\w+)\[(.+)\]", line.strip())
        if match:
            tests.setdefault(match[1], []).append(match[2])
    return tests


def test_a_registered_algorithm_is_in_every_per_algorithm_test(pytester, monkeypatch, tmp_path):
    """A throwaway algorithm (MAGRPO's class and settings under another name, with a copy of its YAML) registered
    before the test files are collected: each test that has a case for MAGRPO has one for it. Collected only."""
    registry = collab.algos.algo_registry
    monkeypatch.setattr(collab.algos, "algo_registry", lambda: {**registry(), "throwaway": registry()["magrpo"]})
    monkeypatch.setitem(ALGO_TESTS, "throwaway", ALGO_TESTS["magrpo"])
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    shutil.copy(conf / "algo" / "magrpo.yaml", conf / "algo" / "throwaway.yaml")
    monkeypatch.setattr(collab.config, "packaged_conf", lambda: conf)
    for path in PER_ALGORITHM:  # collected anew: their parameter lists are read at import
        monkeypatch.delitem(sys.modules, path.removesuffix(".py").replace("/", "."), raising=False)
    found = collected(pytester)
    per_algorithm = {name: ids for name, ids in found.items() if any(re.search(r"\bmagrpo\b", i) for i in ids)}
    assert len(per_algorithm) >= 12, sorted(found)
    for name, ids in per_algorithm.items():
        assert any(re.search(r"\bthrowaway\b", i) for i in ids), (name, ids)
