"""The coding reward (CoLLM F.2, CoopHumanEval weights) and the static analysis behind it, by hand."""

import pytest

from collab.envs.coding.reward import RewardWeights, coding_reward
from collab.envs.coding.static import analyze, clean_response, select_definitions

AUX = "def aux(n):\n    return n * 2\n"
MAIN = "def f(n):\n    d = aux(n)\n    return d + 1\n"


def reward(aux, main, passed=5, total=5, weights=None):
    return coding_reward(analyze(aux, main, "f"), passed, total, weights)


# -- one example per level -------------------------------------------------------------------------
def test_full_marks_is_four():
    total, stage, parts = reward(AUX, MAIN)
    assert stage == "complete"
    assert parts == pytest.approx({"structure": 1.0, "syntax": 0.5, "tests": 1.0, "cooperation": 1.5})
    assert total == pytest.approx(4.0) == RewardWeights().maximum


def test_structure_level_aux_missing_is_not_a_stop():
    total, stage, parts = reward("", MAIN)  # no aux: 0.6 + 0.5 + 1.0, and no cooperation bonus
    assert stage == "complete"
    assert parts["structure"] == pytest.approx(0.6) and parts["cooperation"] == 0.0
    assert total == pytest.approx(2.1)


def test_aux_without_return_is_not_defined():
    total, _, parts = reward("def aux(n):\n    print(n)\n", MAIN)
    assert parts["structure"] == pytest.approx(0.6) and parts["cooperation"] == 0.0


def test_tests_level_scales_with_pass_rate():
    total, stage, parts = reward(AUX, MAIN, passed=3, total=5)
    assert parts["tests"] == pytest.approx(0.6)
    assert total == pytest.approx(0.4 + 0.6 + 0.5 + 0.6 + 1.5)


def test_cooperation_thin_wrapper_gets_only_the_call_bonus():
    total, _, parts = reward(AUX, "def f(n):\n    return aux(n)\n")
    assert parts["cooperation"] == pytest.approx(0.5)
    assert total == pytest.approx(3.0)


def test_cooperation_result_assigned_then_returned_is_still_a_wrapper():
    _, _, parts = reward(AUX, 'def f(n):\n    """Doc."""\n    r = aux(n)\n    return r\n')
    assert parts["cooperation"] == pytest.approx(0.5)


def test_cooperation_no_call_no_bonus():
    _, _, parts = reward(AUX, "def f(n):\n    return n * 2 + 1\n")
    assert parts["cooperation"] == 0.0


# -- the discarded-return penalty ----------------------------------------------------------------------
def test_discard_penalty_fires_for_a_bare_call():
    total, _, parts = reward(AUX, "def f(n):\n    aux(n)\n    return n * 2 + 1\n")
    assert parts["cooperation"] == pytest.approx(0.5 + 1.0 - 0.5)
    assert total == pytest.approx(3.5)


def test_discard_penalty_fires_for_an_unused_assignment():
    facts = analyze(AUX, "def f(n):\n    unused = aux(n)\n    return n * 2 + 1\n", "f")
    assert facts.discards_aux
    assert coding_reward(facts, 5, 5)[2]["cooperation"] == pytest.approx(1.0)


def test_no_penalty_when_the_value_is_used_later():
    facts = analyze(AUX, "def f(n):\n    d = aux(n)\n    if n > 3:\n        return d\n    return 0\n", "f")
    assert not facts.discards_aux and not facts.thin_wrapper


def test_penalty_weight_is_configurable():
    _, _, parts = reward(
        AUX, "def f(n):\n    aux(n)\n    return 2 * n + 1\n", weights=RewardWeights(discard_penalty=1.5)
    )
    assert parts["cooperation"] == pytest.approx(0.0)


# -- termination rules -----------------------------------------------------------------------------------
def test_stop_when_main_is_missing():
    total, stage, parts = reward(AUX, "def g(n):\n    return aux(n)\n")
    assert stage == "structure"
    assert total == pytest.approx(0.4)  # aux's structure points only; nothing after the stop


def test_stop_when_main_has_no_return():
    total, stage, _ = reward(AUX, "def f(n):\n    print(aux(n))\n")
    assert stage == "structure" and total == pytest.approx(0.4)


def test_stop_on_syntax_error_of_the_combined_code():
    # aux's response is broken beyond repair: the concatenated program does not parse. aux is still
    # defined with a return (read from the text), so structure earns 0.4 + 0.6 before the stop
    total, stage, parts = reward("def aux(n) return n", MAIN)
    assert stage == "syntax"
    assert parts == pytest.approx({"structure": 1.0, "syntax": 0.0, "tests": 0.0, "cooperation": 0.0})


def test_stop_when_no_test_passes():
    total, stage, parts = reward(AUX, MAIN, passed=0, total=5)
    assert stage == "tests"
    assert total == pytest.approx(1.5)  # structure 1.0 + syntax 0.5; no cooperation bonus


# -- cleaning the responses --------------------------------------------------------------------------------
def test_markdown_fences_and_prose_are_removed():
    text = "Here is the code:\n```python\ndef aux(n):\n    return n\n```\nThis doubles n."
    assert clean_response(text) == "def aux(n):\n    return n"


def test_leading_prose_without_fences_is_skipped():
    assert clean_response("Sure! Here it is.\ndef aux(n):\n    return n\n") == "def aux(n):\n    return n"


def test_trailing_prose_is_trimmed():
    code = select_definitions("def aux(n):\n    return n\nThis function returns n.", drop="f")
    assert code == "def aux(n):\n    return n"


def test_main_redefining_aux_keeps_the_partners_aux():
    facts = analyze(AUX, "def aux(n):\n    return 0\n\ndef f(n):\n    return aux(n) + 1\n", "f")
    assert facts.program.count("def aux") == 1 and "n * 2" in facts.program


def test_imports_come_first():
    facts = analyze(AUX, MAIN, "f", imports="from typing import List")
    assert facts.program.startswith("from typing import List\n\ndef aux")


# -- code that does not parse as written, prose-only replies ----------------------------------------------
def test_broken_last_line_of_main_fails_the_syntax_level():
    # dropping "return y +" would leave a working program; the response as written does not compile
    main = "def f(n):\n    y = aux(n) + 1\n    return y\n    return y +\n"
    total, stage, parts = reward(AUX, main)
    assert stage == "syntax"
    assert total == pytest.approx(1.0, rel=1e-9)  # aux 0.4 + main 0.6, then the stop


def test_a_stray_closing_fence_is_markdown_not_code():
    assert select_definitions("def aux(n):\n    return n\n```", drop="f") == "def aux(n):\n    return n"


def test_broken_code_before_trailing_prose_is_not_cut_either():
    main = "def f(n):\n    y = aux(n) + 1\n    return y +\nThis adds one to aux's value."
    facts = analyze(AUX, main, "f")
    assert facts.main_defined and not facts.syntax_ok


def test_aux_reply_without_code_is_aux_missing_not_a_syntax_error():
    main = "def f(n):\n    return n * 2 + 1\n"
    facts = analyze("I cannot help with that.", main, "f")
    assert not facts.aux_defined and facts.syntax_ok and facts.aux_code == ""
    total, stage, _ = coding_reward(facts, 5, 5)
    assert stage == "complete" and total == pytest.approx(2.1, rel=1e-9)  # main 0.6 + syntax 0.5 + tests 1.0


def test_fenced_prose_is_not_code_either():
    facts = analyze("```\nSorry, no helper is needed here.\n```", "def f(n):\n    return n * 2 + 1\n", "f")
    assert facts.aux_code == "" and facts.syntax_ok


def test_main_with_a_syntax_error_reaches_the_syntax_level():
    total, stage, parts = reward(AUX, "def f(n):\n    d = aux(n\n    return d + 1\n")
    assert stage == "syntax"
    assert parts == pytest.approx({"structure": 1.0, "syntax": 0.0, "tests": 0.0, "cooperation": 0.0}, rel=1e-9)
    assert total == pytest.approx(1.0, rel=1e-9)


def test_aux_with_a_syntax_error_is_defined_and_fails_the_syntax_level():
    total, stage, parts = reward("def aux(n):\n    return n *\n", MAIN)
    assert stage == "syntax" and total == pytest.approx(1.0, rel=1e-9)


def test_broken_def_without_a_return_is_still_missing():
    total, stage, _ = reward(AUX, "def f(n):\n    print(aux(n)\n")
    assert stage == "structure" and total == pytest.approx(0.4, rel=1e-9)
