"""``reward_mode: reference``: the reference implementation's CoopHumanEval reward, quirks included.

Every expected value below was computed by hand from the reference's rules (R1-R14 in
``collab/envs/coding/reference.py``), not by running collab; the arithmetic is in the comment of each
case, in the reference's order: aux def+return 0.4, main def+return 0.6 (else stop), combined code
parses 0.5 (else stop), passed/total, then, if a test passed and an aux was extracted, calls aux 0.5,
not a wrapper 1.0, discarded value -0.5. A few cases also give the ``paper`` value (by hand, from
collab's own rules) to show where the modes part. All pairs of a mode run in one batch (one sandboxed
program per pair in reference mode), with a short per-test timeout.
"""

import json

import pytest

from collab.envs import make_env
from collab.envs.coding import reference as ref
from collab.errors import UserError

ADD = (
    "def add_one(n):\n    '''Return n + 1.'''\n",
    "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(5) == 6\n"
    "    assert candidate(-1) == 0\n",
    "add_one",
)
SLOW = (
    "def add_one(n):\n    '''Return n + 1.'''\n",
    "def check(candidate):\n    assert candidate(0) == 1\n    assert candidate(1) == 2\n    assert candidate(2) == 3\n"
    "    assert candidate(10) == 11\n    assert candidate(20) == 21\n",
    "add_one",
)
STATE = (
    "def add_one(n):\n    '''Return n + 1.'''\n",  # asserts the double-call regex does not match
    "def check(candidate):\n    assert candidate(1) + 0 == 2\n    assert candidate(5) + 0 == 6\n",
    "add_one",
)
EXTRACT = (
    "def add_one(n):\n    '''Return n + 1.'''\n",
    "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(1) == 2\n"
    "    assert(candidate(2) == 3)\n    for x in range(3):\n        assert candidate(x) == x + 1\n    assert True\n",
    "add_one",
)
NO_CANDIDATE = ("def add_one(n):\n    '''Return n + 1.'''\n", "def check(f):\n    assert f(1) == 2\n", "add_one")
SHOUT = (
    "def shout(s):\n    '''Return s followed by an exclamation mark.'''\n",
    "def check(candidate):\n    assert candidate('candidate') == 'candidate!'\n"
    "    assert len(candidate('ab')) == len('candidate') - 6\n",
    "shout",
)

AUX = "def aux(n):\n    return n + 1\n"
MAIN = "def add_one(n):\n    r = aux(n)\n    if r is None:\n        return n + 1\n    return r\n"

# (name, problem, aux response, main response, reference reward, paper reward or None)
CASES = [
    # aux 0.4 + main 0.6 + parses 0.5 + 3/3 1.0 + calls aux 0.5 + 4 body lines, not a wrapper 1.0 -> 4.0
    ("full_marks", ADD, AUX, MAIN, 0.4 + 0.6 + 0.5 + 1.0 + 0.5 + 1.0, 4.0),
    # main adds 1 twice for n < 0: 2/3 -> 0.4 + 0.6 + 0.5 + 2/3 + 0.5 + 1.0 = 3.667
    (
        "two_of_three",
        ADD,
        AUX,
        "def add_one(n):\n    r = aux(n)\n    if n < 0:\n        return r + 1\n    return r\n",
        0.4 + 0.6 + 0.5 + 2 / 3 + 0.5 + 1.0,
        None,
    ),
    # defect 2: "return y +" is kept (indented), main has "return ", the combined code does not parse -> 0.4 + 0.6
    ("broken_last_line", ADD, AUX, "def add_one(n):\n    y = aux(n)\n    return y\n    return y +\n", 0.4 + 0.6, 1.0),
    # defect 3: prose cleans to "" (no aux, no bonus gate); main 0.6 + parses 0.5 + 3/3 1.0 -> 2.1
    (
        "prose_aux",
        ADD,
        "I cannot help with that.",
        "def add_one(n):\n    return n + 1\n",
        0.6 + 0.5 + 1.0,
        0.6 + 0.5 + 1.0,
    ),
    # defect 4: main's "aux(n" breaks the syntax; "return d" still makes main defined -> 0.4 + 0.6
    ("main_syntax_error", ADD, AUX, "def add_one(n):\n    d = aux(n\n    return d\n", 0.4 + 0.6, 1.0),
    # R7 math in the namespace: 3/3; lines "base = math.floor(n)", "return aux(base)": not the v = aux(...) form
    # -> 0.4 + 0.6 + 0.5 + 1.0 + 0.5 + 1.0 = 4.0; paper: NameError math, 0/3 -> 0.4 + 0.6 + 0.5 = 1.5
    (
        "math_without_import",
        ADD,
        AUX,
        "def add_one(n):\n    base = math.floor(n)\n    return aux(base)\n",
        0.4 + 0.6 + 0.5 + 1.0 + 0.5 + 1.0,
        1.5,
    ),
    # R9: n = 0, 1, 2 loop forever: 3 timeouts, tests 4-5 skipped, 0/5, no bonus -> 0.4 + 0.6 + 0.5 = 1.5
    # (paper: 2/5 pass -> 0.4 + 0.6 + 0.5 + 0.4 + 0.5 + 1.0 = 3.4; not run here, its 3 timeouts are slow)
    (
        "three_timeouts_stop",
        SLOW,
        AUX,
        "def add_one(n):\n    while n < 3:\n        pass\n    return aux(n)\n",
        0.4 + 0.6 + 0.5,
        None,
    ),
    # R8 double call: add_one(1) is evaluated (seen = [1]) and then asserted (seen = [1, 1] -> 102), every
    # test fails -> 0.4 + 0.6 + 0.5 + 0/3 = 1.5; paper: one call per fresh process, 3/3, 4 lines -> 4.0
    (
        "double_call",
        ADD,
        AUX,
        "def add_one(n, seen=[]):\n    seen.append(n)\n    if len(seen) > 1:\n"
        "        return aux(n) + 100\n    return aux(n)\n",
        0.4 + 0.6 + 0.5,
        4.0,
    ),
    # R7 shared namespace: "+ 0" keeps the double-call regex off; test 1: seen = [1] -> 2 passes; test 2: seen
    # = [1, 5] -> 106 fails: 1/2 -> 0.4 + 0.6 + 0.5 + 0.5 + 0.5 + 1.0 = 3.5; paper 2/2 -> 4.0
    (
        "shared_state",
        STATE,
        AUX,
        "def add_one(n, seen=[]):\n    seen.append(n)\n    if len(seen) > 1:\n"
        "        return aux(n) + 100\n    return aux(n)\n",
        0.4 + 0.6 + 0.5 + 0.5 + 0.5 + 1.0,
        4.0,
    ),
    # R13: one line "return aux(n) + 0" starts with "return " and holds "aux": wrapper, no 1.0
    # -> 0.4 + 0.6 + 0.5 + 1.0 + 0.5 = 3.0; paper: aux(n) + 0 is logic of main's own -> 4.0
    (
        "one_line_return_is_a_wrapper",
        ADD,
        AUX,
        "def add_one(n):\n    return aux(n) + 0\n",
        0.4 + 0.6 + 0.5 + 1.0 + 0.5,
        4.0,
    ),
    # R13 docstring quirk: the closing quotes alone on a line reopen the docstring, every later line is
    # skipped, no lines left: wrapper -> 0.4 + 0.6 + 0.5 + 1.0 + 0.5 = 3.0; paper: 3 statements -> 4.0
    (
        "docstring_closing_line_makes_a_wrapper",
        ADD,
        AUX,
        'def add_one(n):\n    """\n    Add one.\n    """\n    r = aux(n)\n'
        "    if r is None:\n        r = n + 1\n    return r\n",
        0.4 + 0.6 + 0.5 + 1.0 + 0.5,
        4.0,
    ),
    # R12: "aux(n)" in a comment is a call; body "return n + 1" has no aux: not a wrapper; comments are not
    # checked for R14 -> 0.4 + 0.6 + 0.5 + 1.0 + 0.5 + 1.0 = 4.0; paper: no call -> 2.5
    (
        "comment_counts_as_a_call",
        ADD,
        AUX,
        "def add_one(n):\n    # no need for aux(n) here\n    return n + 1\n",
        0.4 + 0.6 + 0.5 + 1.0 + 0.5 + 1.0,
        2.5,
    ),
    # R14: "aux(n)" has no space before "(": no penalty; 2 lines, the first not "v = aux(" -> 4.0
    # paper: the value is discarded -> 0.4 + 0.6 + 0.5 + 1.0 + 0.5 + 1.0 - 0.5 = 3.5
    (
        "bare_call_is_not_penalised",
        ADD,
        AUX,
        "def add_one(n):\n    aux(n)\n    return n + 1\n",
        0.4 + 0.6 + 0.5 + 1.0 + 0.5 + 1.0,
        3.5,
    ),
    # R14: "aux (n)": one space, one character -> 0.4 + 0.6 + 0.5 + 1.0 + 0.5 + 1.0 - 0.5 = 3.5
    (
        "spaced_call_is_penalised",
        ADD,
        AUX,
        "def add_one(n):\n    aux (n)\n    return n + 1\n",
        0.4 + 0.6 + 0.5 + 1.0 + 0.5 + 1.0 - 0.5,
        None,
    ),
    # R14: "aux (nn)": two characters in the parentheses, no penalty -> 4.0
    (
        "spaced_call_with_a_longer_argument",
        ADD,
        AUX,
        "def add_one(nn):\n    aux (nn)\n    return nn + 1\n",
        0.4 + 0.6 + 0.5 + 1.0 + 0.5 + 1.0,
        None,
    ),
    # R4: "return(aux(n))" has no whitespace after return: main not defined, stop -> 0.4
    # paper: defined, "return aux(n)" is a thin wrapper -> 0.4 + 0.6 + 0.5 + 1.0 + 0.5 = 3.0
    ("return_without_space_is_no_return", ADD, AUX, "def add_one(n):\n    return(aux(n))\n", 0.4, 3.0),
    # R4: "# return n + 1 later" makes main defined; it returns None, 0/3 -> 0.4 + 0.6 + 0.5 = 1.5; paper: stop at 0.4
    (
        "return_in_a_comment_counts",
        ADD,
        AUX,
        "def add_one(n):\n    # return n + 1 later\n    print(n)\n",
        0.4 + 0.6 + 0.5,
        0.4,
    ),
    # R2: main's import is dropped, operator undefined, 0/3 -> 1.5; paper keeps it, 3/3, not thin -> 4.0
    (
        "main_import_dropped",
        ADD,
        AUX,
        "import operator\n\ndef add_one(n):\n    return operator.add(aux(n), 0)\n",
        0.4 + 0.6 + 0.5,
        4.0,
    ),
    # R3: only add_one is taken from main; helper undefined, 0/3; "aux(" not in add_one -> 1.5
    # paper: helper kept, 3/3, add_one itself does not call aux -> 0.4 + 0.6 + 0.5 + 1.0 = 2.5
    (
        "main_helper_dropped",
        ADD,
        AUX,
        "def helper(n):\n    return aux(n)\n\ndef add_one(n):\n    r = helper(n)\n    return r\n",
        0.4 + 0.6 + 0.5,
        2.5,
    ),
    # R2: the nested def opens a new block and "    return inner(n)" (4 spaces, not 5) closes it: add_one
    # keeps only "def inner" and returns None; "return aux(m)" made it defined; parses -> 0/3 -> 1.5
    # paper: 3/3, the nested call counts, 2 statements -> 4.0
    (
        "nested_def_cuts_main",
        ADD,
        AUX,
        "def add_one(n):\n    def inner(m):\n        return aux(m)\n    return inner(n)\n",
        0.4 + 0.6 + 0.5,
        4.0,
    ),
    # R2: "    Returns the value." is a sentence without code marks: deleted, the code compiles; what is left,
    # "r = aux(n)" + "return r", is a wrapper -> 0.4 + 0.6 + 0.5 + 1.0 + 0.5 = 3.0; paper: syntax error -> 1.0
    (
        "sentence_line_deleted",
        ADD,
        AUX,
        "def add_one(n):\n    r = aux(n)\n    Returns the value.\n    return r\n",
        0.4 + 0.6 + 0.5 + 1.0 + 0.5,
        1.0,
    ),
    # R6: the duplicate is dropped, "assert(" has no space, "assert True" no candidate; the loop's assert
    # runs alone (x undefined): 1/2 -> 0.4 + 0.6 + 0.5 + 0.5 + 0.5 + 1.0 = 3.5; paper: 5/5 -> 4.0
    ("test_extraction", EXTRACT, AUX, MAIN, 0.4 + 0.6 + 0.5 + 0.5 + 0.5 + 1.0, 4.0),
    # R6: "def check(f):" is not found: no tests, stop after the syntax level -> 0.4 + 0.6 + 0.5 = 1.5
    ("no_check_candidate", NO_CANDIDATE, AUX, MAIN, 0.4 + 0.6 + 0.5, None),
    # R6: "candidate" is renamed in strings too: test 1 becomes shout('shout') == 'shout!' (passes), test 2
    # len('shout') - 6 = -1 != 3 (fails): 1/2; 3 lines -> 0.4 + 0.6 + 0.5 + 0.5 + 0.5 + 1.0 = 3.5
    (
        "candidate_renamed_in_strings",
        SHOUT,
        "def aux(s):\n    return s + '!'\n",
        "def shout(s):\n    t = aux(s)\n    if not s:\n        return '!'\n    return t\n",
        0.4 + 0.6 + 0.5 + 0.5 + 0.5 + 1.0,
        None,
    ),
    # R7: the default 1 // 0 raises while loading: no test counts, no bonus -> 1.5
    ("loading_fails", ADD, AUX, "def add_one(n, k=1 // 0):\n    return aux(n) + k\n", 0.4 + 0.6 + 0.5, 1.5),
    # R11: aux has no return (no 0.4) but was extracted: the gate opens; 3/3, calls, not a wrapper
    # -> 0.6 + 0.5 + 1.0 + 0.5 + 1.0 = 3.6; paper: aux not defined, no cooperation -> 2.1
    (
        "aux_without_return_opens_the_gate",
        ADD,
        "def aux(n):\n    pass\n",
        "def add_one(n):\n    aux(n)\n    return n + 1\n",
        0.6 + 0.5 + 1.0 + 0.5 + 1.0,
        None,
    ),
    # R2: fences removed, the trailing sentence is outside the function -> as full_marks, 4.0
    (
        "markdown_and_prose",
        ADD,
        "```python\ndef aux(n):\n    return n + 1\n```\nThis helper adds one.",
        MAIN,
        0.4 + 0.6 + 0.5 + 1.0 + 0.5 + 1.0,
        4.0,
    ),
    # R4: no add_one in main's reply: stop after aux's 0.4
    ("main_missing", ADD, AUX, "def other(n):\n    return aux(n)\n", 0.4, 0.4),
]


def _tasks(tmp_path_factory):
    problems, seen = [], {}
    for case in CASES:
        prompt, test, entry = case[1]
        key = (prompt, test)
        if key not in seen:
            seen[key] = f"Hand/{len(seen)}"
            problems.append({"task_id": seen[key], "prompt": prompt, "test": test, "entry_point": entry})
    path = tmp_path_factory.mktemp("ref") / "hand.json"
    path.write_text(json.dumps(problems))
    return str(path), seen


def _env(path, mode, timeout):
    return make_env(
        "coding",
        dataset="coophumaneval",
        path=path,
        train_split="[:]",
        eval_split="[:]",
        workers=2,
        test_timeout=timeout,
        reward_mode=mode,
    )


def _score(env, seen, cases):
    by_id = {t["task_id"]: t for t in env.tasks("train")}
    states = [env.reset(by_id[seen[(c[1][0], c[1][1])]]) for c in cases]
    return dict(zip((c[0] for c in cases), env.score_batch(states, [[c[2], c[3]] for c in cases])))


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    return _tasks(tmp_path_factory)


@pytest.fixture(scope="module")
def reference_scores(problems):
    path, seen = problems
    return _score(_env(path, "reference", 0.5), seen, CASES)


@pytest.fixture(scope="module")
def paper_scores(problems):
    path, seen = problems
    return _score(_env(path, "paper", 3.0), seen, [c for c in CASES if c[5] is not None])


def test_at_least_twenty_hand_made_cases():
    assert len(CASES) >= 20 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_reference_reward_by_hand(case, reference_scores):
    score = reference_scores[case[0]]
    assert score.rewards[0] == pytest.approx(case[4], rel=1e-9, abs=1e-12)
    assert score.info["total"] == score.rewards[0]


@pytest.mark.parametrize("case", [c for c in CASES if c[5] is not None], ids=[c[0] for c in CASES if c[5] is not None])
def test_paper_reward_by_hand(case, paper_scores):
    assert paper_scores[case[0]].rewards[0] == pytest.approx(case[5], rel=1e-9, abs=1e-12)


def test_reference_sums_in_the_reference_order(reference_scores):
    # the same float operations in the same order give the very same bits
    assert reference_scores["two_of_three"].rewards[0] == 0.0 + 0.4 + 0.6 + 0.5 + (2 / 3) * 1.0 + 0.5 + 1.0


def test_timeouts_stop_the_tests_and_say_so(reference_scores):
    score = reference_scores["three_timeouts_stop"]
    assert score.info["pass_rate"] == 0.0 and score.info["stage/tests"] == 1.0
    text = score.memory["diagnostics"]
    assert "- Tests: 0/5 passed" in text and "Timeout: the test did not finish within 0.5 s" in text


# -- the static rules on their own (no sandbox) ----------------------------------------------------------
def test_clean_keeps_function_blocks_only():
    text = (
        "Here it is:\n```python\nimport re\nLIMIT = 3\n\ndef aux(n):\n    return n\n```\nExample usage:\nprint(aux(2))"
    )
    assert ref.clean(text) == "def aux(n):\n    return n"
    assert ref.clean("I cannot help with that.") == ""


def test_extract_function_takes_the_first_block_unless_repeated_right_after():
    assert (
        ref.extract_function(
            "def aux(n):\n    return 1\n\ndef g():\n    return 0\n\ndef aux(n):\n    return 2\n", "aux"
        )
        == "def aux(n):\n    return 1"
    )
    assert (
        ref.extract_function("def aux(n):\n    return 1\n\ndef aux(n):\n    return 2\n", "aux")
        == "def aux(n):\n    return 2"
    )


def test_prompt_imports_are_lines_matching_the_patterns():
    prompt = "from typing import List\nimport math, re\n\ndef f(xs: List[int]):\n    '''Doc.\n    import os\n    '''\n"
    assert ref.prompt_imports(prompt) == "from typing import List\nimport math, re\nimport os"


def test_wrapper_forms():
    assert ref.is_wrapper("def f(n):\n    r = aux(n)\n    return r")
    assert not ref.is_wrapper("def f(n):\n    r = aux(n)\n    return r + 1")
    assert ref.is_wrapper("def f(n):\n    return sorted(aux(n))[::-1]")
    assert not ref.is_wrapper('def f(n):\n    """Doc."""\n    r = aux(n)\n    r = r\n    return r')


def test_test_cases_follow_the_reference():
    assert ref.test_cases(EXTRACT[1], "add_one") == ["assert add_one(1) == 2", "assert add_one(x) == x + 1"]
    assert ref.test_cases(NO_CANDIDATE[1], "add_one") == []


def test_reward_mode_is_checked_and_sets_the_default_timeout(problems):
    path, _ = problems
    with pytest.raises(UserError, match="reward_mode 'papr'; valid: paper, reference"):
        make_env("coding", dataset="coophumaneval", path=path, reward_mode="papr")
    env = make_env("coding", dataset="coophumaneval", path=path, reward_mode="reference")
    assert env.limits.timeout_s == 10.0 and env.reward_max == pytest.approx(4.0)
    assert make_env("coding", dataset="coophumaneval", path=path).limits.timeout_s == 8.0
