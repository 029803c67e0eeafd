"""The coding env's visible tests and its ``run_tests`` tool: the feedback of a turn moved inside it, the reward on
the hidden tests (HumanEval/0: 7 tests; the first 2 shown)."""

from __future__ import annotations

import json

import pytest

from collab.envs import make_env
from collab.envs.coding.tasks import canonical_code
from collab.errors import UserError
from collab.policy.models import encode_chat
from collab.policy.sampling import GenerationRequest
from collab.tools.calls import CALL_CLOSE, CALL_OPEN, RESULT_OPEN
from collab.tools.turns import generate_with_tools
from tests.tools.test_turns import Scripted

# passes HumanEval/0's first two tests (threshold 0.3 -> True, 0.05 -> False), not the hidden ones
GAMED = "def has_close_elements(numbers, threshold):\n    return threshold == 0.3\n"


@pytest.fixture(scope="module")
def env():
    return make_env("coding", visible_tests=2, tools={1: ["run_tests"]}, eval_split="[:1]", workers=2)


def test_the_first_tests_are_shown_and_the_reward_counts_the_others(env):
    task = env.tasks("eval")[0]
    assert len(task["visible_tests"]) == 2 and len(task["tests"]) == 5
    assert all(t in env.observe(task)[1] for t in task["visible_tests"])
    assert not any(t in env.observe(task)[1] for t in task["tests"])
    right = "def aux(x):\n    return x\n\n\n" + canonical_code(task)
    gamed = "def aux(x):\n    return x\n\n\n" + GAMED
    (good, bad) = env.score_batch([env.reset(task)] * 2, [[right, right], [right, gamed]])
    assert good.info["solved"] == 1.0 and good.info["pass_rate"] == 1.0
    assert bad.info["solved"] == 0.0 and bad.info["pass_rate"] < 1.0  # the hidden tests catch it
    plain = make_env("coding", eval_split="[:1]").tasks("eval")[0]
    assert "visible_tests" not in plain and len(plain["tests"]) == 7


def test_run_tests_runs_an_agents_code_on_its_tasks_visible_tests(env):
    task = env.tasks("eval")[0]
    tool = env.tools.by_agent[1]["run_tests"]
    assert tool({"code": GAMED}).startswith("error: this problem has no visible tests")  # no task bound
    bound = tool.for_task(task)
    assert bound({"code": GAMED}) == "2/2 visible tests passed"
    wrong = bound({"code": "def has_close_elements(numbers, threshold):\n    return False\n"})
    assert wrong.startswith("1/2 visible tests passed\nassert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True")
    assert "expected True, got False" in wrong


def test_a_turn_calls_run_tests_on_the_task_of_its_request(env, tiny_tokenizer):
    task = env.tasks("eval")[0]
    call = json.dumps({"name": "run_tests", "arguments": {"code": GAMED}})
    team = Scripted(tiny_tokenizer, [f"{CALL_OPEN}{call}{CALL_CLOSE}", GAMED])
    prompt = encode_chat(tiny_tokenizer, [{"role": "user", "content": env.observe(task)[1]}])
    tools = {0: env.tools.by_agent[1]}  # the scripted team's one agent as the main coder
    (c,) = generate_with_tools(team, [GenerationRequest(0, prompt, 1, task=task)], tools)[0]
    assert [u.result for u in c.tool_calls] == ["2/2 visible tests passed"]
    assert f"{RESULT_OPEN}\n2/2 visible tests passed" in c.text


def test_bad_visible_tests_are_one_line():
    with pytest.raises(UserError, match="visible_tests must be a whole number >= 0, got -1"):
        make_env("coding", visible_tests=-1)
    with pytest.raises(UserError, match="visible_tests needs reward_mode paper"):
        make_env("coding", visible_tests=1, reward_mode="reference")
    with pytest.raises(UserError, match="unknown tool 'run_tests'; valid: calculator, python, search "):
        make_env("math", tools=["run_tests"])
    with pytest.raises(UserError, match="unknown tool 'run_test'; valid: calculator, python, run_tests, search "):
        make_env("coding", tools=["run_test"])
