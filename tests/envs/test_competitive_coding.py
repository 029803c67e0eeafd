"""collab.envs.competitive_coding: CodeForces-style problems judged by test pass rate (MARFT, 5.1, E.2)."""

from __future__ import annotations

import json
import time

import pytest

from collab.envs import make_env
from collab.envs.competitive_coding import judge as judge_module
from collab.envs.competitive_coding.env import CompetitiveCodingEnv, default_splits
from collab.envs.competitive_coding.judge import compiles, extract_program
from collab.envs.competitive_coding.problems import check_output, guess_checker, load_problems
from collab.errors import UserError

FAST = {"timeout": 1.0, "workers": 4}  # the endless loop costs one timeout

DOUBLE = "print(2 * int(input()))\n"


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def local_set(tmp_path):
    """Two local-format problems: double a number (4 tests) and YES/NO parity (2 tests, case-insensitive)."""
    return write_jsonl(
        tmp_path / "local.jsonl",
        [
            {
                "id": "double",
                "statement": "Print twice n.",
                "tests": [{"input": f"{n}\n", "output": f"{2 * n}\n"} for n in (1, 2, 3, 0)],
            },
            {
                "id": "parity",
                "statement": "YES if n is even.",
                "checker": "tokens_ci",
                "tests": [{"input": "4\n", "output": "YES\n"}, {"input": "3\n", "output": "NO\n"}],
            },
        ],
    )


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}```\nIt reads n and prints the answer."


# -- loading --------------------------------------------------------------------------------------------
CF_RECORD = {
    "contest_id": "2030",
    "index": "A",
    "title": "Sakurako's Exam",
    "rating": 800,
    "time_limit": 1.0,
    "memory_limit": 256.0,
    "description": "Place '+' or '-' before each of $$$a$$$ ones and $$$b$$$ twos so that the sum is $$$0$$$.",
    "input_format": "The first line contains $$$t$$$ -- the number of test cases.",
    "output_format": 'For each test case, output "Yes" or "No".\n\nYou can output each letter in any case.',
    "note": "1. $$$a=0, b=1$$$: impossible.",
    "examples": [{"input": "2\n0 1\n2 0\n", "output": "NO\nYES\n"}],
    "official_tests": [{"input": "2\n0 1\n2 0\n", "output": "NO\nYES\n"}, {"input": "1\n0 3\n", "output": "NO\n"}],
    "interaction_format": None,
    "generated_checker": None,
}


def test_codeforces_records_map_to_problems_in_the_e2_layout(tmp_path):
    path = write_jsonl(
        tmp_path / "cf.jsonl",
        [
            CF_RECORD,
            {**CF_RECORD, "index": "B", "examples": [], "official_tests": []},  # no tests
            {**CF_RECORD, "index": "C", "interaction_format": "Interact with the jury."},
            {**CF_RECORD, "index": "D", "generated_checker": "def check(...): ..."},
        ],
    )
    problems, skipped = load_problems(path)
    assert dict(skipped) == {"no tests": 1, "interactive": 1, "special judge": 1}
    (p,) = problems
    assert p["id"] == "2030/A" and p["source"] == "codeforces" and p["title"] == "Sakurako's Exam"
    assert (p["time_limit"], p["memory_limit"], p["rating"]) == (1.0, 256.0, 800)
    assert p["checker"] == "tokens_ci"  # "in any case"
    assert p["tests"] == [{"input": "2\n0 1\n2 0\n", "output": "NO\nYES\n"}, {"input": "1\n0 3\n", "output": "NO\n"}]
    s = p["statement"]
    assert s.startswith("Execution time limit: 1.0 seconds\nMemory limit: 256.0 MB\n\n# Problem\n\nPlace '+'")
    sections = ["# Problem", "## Input Format", "## Output Format", "## Examples", "## Note"]
    assert [s.index(h) for h in sections] == sorted(s.index(h) for h in sections)
    assert "```input\n2\n0 1\n2 0\n```\n\n```output\nNO\nYES\n```" in s
    assert s.endswith("## Note\n\n1. $$$a=0, b=1$$$: impossible.")


def test_null_sections_are_left_out(tmp_path):
    (p,), _ = load_problems(write_jsonl(tmp_path / "cf.jsonl", [{**CF_RECORD, "input_format": None, "note": None}]))
    assert "## Input Format" not in p["statement"] and "## Note" not in p["statement"]
    assert "## Output Format" in p["statement"]


def test_local_records_json_list_and_defaults(tmp_path):
    path = tmp_path / "local.json"
    path.write_text(
        json.dumps(
            [
                {"statement": "Echo.", "tests": [{"input": "x\n", "output": "x\n"}]},
                {
                    "id": 7,
                    "statement": "Sum.",
                    "tests": [{"input": "1 2", "output": "3"}],
                    "checker": "float",
                    "time_limit": 3,
                },
            ]
        )
    )
    (a, b), skipped = load_problems(path)
    assert not skipped
    assert (a["id"], a["source"], a["statement"], a["checker"], a["time_limit"]) == (
        "0",
        "local",
        "Echo.",
        "tokens",
        2.0,
    )
    assert (b["id"], b["checker"], b["time_limit"]) == ("7", "float", 3.0)


def test_guess_checker():
    assert guess_checker("You may print the answer in any register.") == "tokens_ci"
    assert guess_checker("The absolute or relative error must not exceed 1e-6.") == "float"
    assert guess_checker("Print the number.") == "tokens"


@pytest.mark.parametrize(
    "records, message",
    [
        ([{k: v for k, v in CF_RECORD.items() if k != "input_format"}], "record 0 (id 2030/A) has no 'input_format'"),
        ([{"id": "q", "tests": []}], "has no 'description'"),
        ([{"statement": "S"}], "has no 'tests'"),
        ([{"statement": "S", "tests": []}], "no usable problems"),
        ([{"statement": "S", "tests": [{"in": "1"}]}], "tests must be a list"),
        (
            [{"statement": "S", "tests": [{"input": "1", "output": "1"}], "checker": "exact"}],
            "valid: float, tokens, tokens_ci",
        ),
        (["not an object"], "record 0 is a str"),
    ],
)
def test_bad_records_are_one_line_user_errors(tmp_path, records, message):
    path = write_jsonl(tmp_path / "bad.jsonl", records)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        load_problems(path)
    assert "\n" not in str(e.value)
    if "has no" in message:
        assert "it has:" in str(e.value)


# -- checkers -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "got, want, checker, ok",
    [
        ("1 2\n3", "1\n2 3\n", "tokens", True),
        ("  7  ", "7", "tokens", True),
        ("yes", "YES", "tokens", False),
        ("1 2", "1 2 3", "tokens", False),
        ("yEs\nno", "YES\nNO", "tokens_ci", True),
        ("YES", "NO", "tokens_ci", False),
        ("2.3333334", "2.3333333333", "float", True),
        ("2.334", "2.3333333333", "float", False),
        ("1000002.0", "1000000.0", "float", False),  # relative error 2e-6
        ("1000000.5", "1000000.0", "float", True),  # relative error 5e-7
        ("1000000000.0001", "1000000000", "float", True),  # relative error 1e-13
        ("0.0000001", "0", "float", True),
        ("abc 1.0", "abc 1", "float", True),
        ("abd 1.0", "abc 1", "float", False),
        ("nan", "0.5", "float", False),
        ("1.0", "1.0 2.0", "float", False),
    ],
)
def test_checkers(got, want, checker, ok):
    assert check_output(got, want, checker) is ok


# -- extracting the program -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "response, program",
    [
        ("```python\nprint(1)\n```", "print(1)\n"),
        ("Plan.\n```python\nprint(1)\n```\nBetter:\n```py\nprint(2)\n```\nDone.", "print(2)\n"),
        ("```\nprint(3)\n```", "print(3)\n"),
        ("Example:\n```input\n5\n```\n```output\n10\n```\n```python\nprint(4)\n```\n```output\n4\n```", "print(4)\n"),
        ("Coder: ```python\nprint(5)\n```", "print(5)\n"),
        ("Draft:\n```python\nprint(0)\n```\nAnswer:\n```python\nprint(6)\n```\nThe code prints 6.", "print(6)\n"),
        ("**Answer:**\nn = int(input())\nprint(n)\n\nThis reads n.", "n = int(input())\nprint(n)\n"),
        (
            "Review: the coder's code fails for n = 0.\n```python\nprint(0)\n```\n"
            "Final Answer:\n```python\nprint(7)\n```",
            "print(7)\n",
        ),
        ("Review: looks right.\n```python\nprint(8)\n```\nFinal Answer: no changes needed.", "print(8)\n"),
        (
            "Here is the program:\nn = int(input())\nfor i in range(n):\n    print(i)\nThis prints the numbers.",
            "n = int(input())\nfor i in range(n):\n    print(i)\n",
        ),
        ("```python\nprint(9)\n", "print(9)\n"),  # never closed
        ("I could not solve this problem.", ""),
        ("", ""),
    ],
)
def test_extract_program(response, program):
    assert extract_program(response) == program


def test_unfenced_code_that_never_compiles_is_kept_and_fails():
    code = extract_program("My program:\ndef solve(:\n    return\nsolve(")
    assert code == "def solve(:\n    return\nsolve(\n" and not compiles(code)


def test_prose_that_looks_like_code_is_skipped():
    response = "for each number we print its double\nn = int(input())\nprint(2 * n)\nThat is all."
    assert extract_program(response) == "n = int(input())\nprint(2 * n)\n"


# -- grading --------------------------------------------------------------------------------------------
def test_grading_runs_every_test_of_the_batch_in_one_pool_map(local_set, monkeypatch):
    calls = []

    class SpyPool(judge_module.Pool):
        def map(self, codes, stdins=None):
            calls.append(len(codes))
            return super().map(codes, stdins)

    monkeypatch.setattr(judge_module, "Pool", SpyPool)
    env = make_env("competitive_coding", dataset=str(local_set), **FAST)
    double = next(t for t in env.tasks("train") + env.tasks("eval") if t["id"] == "double")
    parity = next(t for t in env.tasks("train") + env.tasks("eval") if t["id"] == "parity")
    answers = {
        "correct": fenced(DOUBLE),
        "again": fenced(DOUBLE),  # identical program: its runs are shared
        "wrong": fenced("print(int(input()) + 100)\n"),
        "partial": fenced("print(int(input()) + 2)\n"),  # n + 2 == 2n only for n = 2: 1/4
        "crash": fenced("n = int(input())\nprint(2 * n)\nraise SystemExit(3)\n"),  # right output, runtime error
        "loop": fenced("while True:\n    pass\n"),
        "syntax": fenced("print(2 * int(input())\n"),
        "none": "I would read n and double it.",
        "parity": fenced("print('yes' if int(input()) % 2 == 0 else 'no')\n"),
    }
    tasks = [parity if k == "parity" else double for k in answers]
    start = time.monotonic()
    graded = dict(zip(answers, env.grade_batch(tasks, list(answers.values()))))
    assert time.monotonic() - start < 10
    assert calls == [4 * 5 + 2]  # one map: double x (correct, wrong, partial, crash, loop), parity x 1
    reward = {k: r for k, (r, _) in graded.items()}
    assert reward == {
        "correct": 1.0,
        "again": 1.0,
        "wrong": 0.0,
        "partial": 0.25,
        "crash": 0.0,
        "loop": 0.0,
        "syntax": 0.0,
        "none": 0.0,
        "parity": 1.0,
    }
    info = {k: i for k, (_, i) in graded.items()}
    assert info["correct"] == {
        "pass_rate": 1.0,
        "compiled": 1.0,
        "has_code": 1.0,
        "timeouts": 0.0,
        "tests_passed": 4.0,
        "tests_total": 4.0,
    }
    assert info["partial"]["tests_passed"] == 1.0
    assert info["loop"]["timeouts"] == 1.0 and info["crash"]["timeouts"] == 0.0
    assert (info["syntax"]["compiled"], info["syntax"]["has_code"]) == (0.0, 1.0)
    assert (info["none"]["compiled"], info["none"]["has_code"]) == (0.0, 0.0)


def test_timeout_none_uses_each_problems_time_limit(tmp_path):
    slow = "import time\ntime.sleep(0.6)\nprint(1)\n"
    path = write_jsonl(
        tmp_path / "limits.jsonl",
        [
            {"id": "tight", "statement": "S", "time_limit": 0.3, "tests": [{"input": "", "output": "1"}]},
            {"id": "loose", "statement": "S", "time_limit": 2.0, "tests": [{"input": "", "output": "1"}]},
        ],
    )
    env = CompetitiveCodingEnv(dataset=str(path), timeout=None, workers=2, train_split="[:]", eval_split="[:]")
    tight, loose = env.tasks("train")
    (r1, i1), (r2, i2) = env.grade_batch([tight, loose], [fenced(slow), fenced(slow)])
    assert (r1, i1["timeouts"], r2, i2["timeouts"]) == (0.0, 1.0, 1.0, 0.0)


def test_large_expected_outputs_fit_the_output_cap(tmp_path):
    big = "x" * 100_000
    path = write_jsonl(
        tmp_path / "big.jsonl", [{"id": "big", "statement": "S", "tests": [{"input": "", "output": big}]}]
    )
    env = CompetitiveCodingEnv(dataset=str(path), **FAST)
    assert env.grade(env.tasks("train")[0], fenced("print('x' * 100000)\n"))[0] == 1.0


# -- the Flex-MG episode --------------------------------------------------------------------------------
def test_trio_episode_grades_the_reviewer(local_set):
    env = make_env("competitive_coding", dataset=str(local_set), profile="trio", horizon=2, **FAST)
    assert [r.name for r in env.roles] == ["reasoner", "coder", "reviewer"] and env.answer_agent == 2
    double = env.tasks("train")[0]
    state = env.reset(double)
    for history in state.histories:
        assert history[0]["role"] == "system" and history[-1]["content"] == env.problem(double)
    assert env.problem(double).startswith("Print twice n.") and "```python" in env.problem(double)

    plan = "Read n, print 2n."
    coder = f"Answer:\n{fenced(DOUBLE)}"
    partial = f"Review: simpler.\nFinal Answer:\n{fenced('print(int(input()) + 2)' + chr(10))}"
    step = env.step(state, [plan, coder, partial])  # the coder is right, the graded reviewer is not
    assert step.rewards == (0.25, 0.25, 0.25) and not step.done and step.info["solved"] == 0.0
    text = step.state.histories[0][-1]["content"]
    assert "reviewer: Review: simpler." in text and "coder: Answer:" in text
    assert text.endswith("Judge: incorrect (passed 1/4 tests)")
    assert all(len(h) == 2 for h in step.state.histories)  # [profile prompt, s_1]

    fixed = f"Review: fixed.\nFinal Answer:\n{fenced(DOUBLE)}"
    last = env.step(step.state, [plan, coder, fixed])
    assert last.rewards == (1.0, 1.0, 1.0) and last.done and last.info["solved"] == 1.0


def test_verdicts(local_set):
    env = CompetitiveCodingEnv(dataset=str(local_set), profile="solo", **FAST)
    task = env.tasks("train")[0]
    verdict = {
        k: env.verdict(env.score(env.reset(task), [a]))
        for k, a in {"right": fenced(DOUBLE), "syntax": fenced("print(\n"), "none": "no idea"}.items()
    }
    assert verdict == {
        "right": "correct (passed 4/4 tests)",
        "syntax": "incorrect (the program has a syntax error)",
        "none": "incorrect (no Python program found)",
    }


# -- the shipped problem set ----------------------------------------------------------------------------
def test_shipped_set_defaults_and_reference_solutions_pass():
    env = make_env("competitive_coding", workers=4)
    assert env.horizon == 1 and [r.name for r in env.roles] == ["reasoner", "coder"]
    train, evaluation = env.tasks("train"), env.tasks("eval")
    assert (len(train), len(evaluation)) == (32, 8)
    tasks = list(train) + list(evaluation)
    assert len({t["id"] for t in tasks}) == 40
    for t in tasks:
        assert 5 <= len(t["tests"]) <= 8 and t["solution"] and t["source"] == "collab"
        examples = t["statement"].split("## Examples")[1]
        assert t["tests"][0]["input"].strip("\n") in examples  # the examples are among the tests
    graded = env.grade_batch(tasks, [fenced(t["solution"]) for t in tasks])
    assert [t["id"] for t, (r, _) in zip(tasks, graded) if r != 1.0] == []


def test_splits_and_max_tests(local_set):
    assert default_splits(40) == ("[:32]", "[32:]") and default_splits(3) == ("[:]", "[:]")
    env = CompetitiveCodingEnv(dataset=str(local_set), max_tests=2, train_split="[1:]", eval_split="[:1]")
    assert [t["id"] for t in env.tasks("train")] == ["parity"] and [t["id"] for t in env.tasks("eval")] == ["double"]
    assert len(env.tasks("eval")[0]["tests"]) == 2


@pytest.mark.parametrize(
    "options, message",
    [
        ({"timeout": 0}, "timeout must be > 0"),
        ({"max_tests": 0}, "max_tests must be >= 1"),
        ({"workers": 0}, "workers must be >= 1"),
        ({"profile": "quartet"}, "unknown profile 'quartet'"),
        ({"dataset": "/nonexistent/problems.jsonl"}, "data file not found"),
        ({"train_split": "[a:b]"}, "bad split"),
        ({"horizon": 0}, "horizon"),
        ({"checker": "tokens"}, "bad option for env 'competitive_coding'"),
    ],
)
def test_bad_options_are_user_errors(options, message):
    with pytest.raises(UserError, match=message):
        make_env("competitive_coding", **options)


def test_unknown_split():
    with pytest.raises(UserError, match="valid: eval, train"):
        make_env("competitive_coding").tasks("test")
