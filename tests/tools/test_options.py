"""Giving agents tools through any env's options (collab.tools.options, make_env): the env's ToolSetup, the team a
rollout plays and the calls it charges (collab.tools.setup)."""

from __future__ import annotations

import pytest

from collab.envs import make_env
from collab.errors import UserError
from collab.tools.options import agent_tools, tool_budget
from collab.tools.setup import Budget, ToolSetup
from collab.tools.team import ToolTeam


def test_tools_for_every_agent_or_each_its_own(tmp_path):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("Paris\nThe capital of France.\n")
    everyone = agent_tools(["calculator", "python"], 2)
    assert {a: sorted(t) for a, t in everyone.items()} == {0: ["calculator", "python"], 1: ["calculator", "python"]}
    mine = agent_tools({1: ["calculator", {"name": "search", "corpus": str(corpus)}]}, 2)
    assert list(mine) == [1] and sorted(mine[1]) == ["calculator", "search"]
    assert sorted(agent_tools("[calculator]", 2)[0]) == ["calculator"]  # text from the command line, as YAML
    assert tool_budget({"calls": 2}) == Budget(calls=2) and tool_budget(None) == Budget()


@pytest.mark.parametrize(
    "tools, budget, message",
    [
        ("calculator", None, "expected a list of tools (e.g. [calculator, python]), got 'calculator'"),
        (["abacus"], None, "unknown tool 'abacus'; valid: calculator, python, search"),
        ({2: ["calculator"]}, None, "agent 2 is not one of the team's 0-1"),
        ([{"corpus": "x"}], None, "a tool is a name or {name: NAME, option: value}"),
        (["calculator"], {"turns": 3}, "tool_budget: expected a mapping of calls, tool_seconds, tokens, context"),
    ],
)
def test_bad_tool_options_are_one_line(tools, budget, message):
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        make_env("math", tools=tools, tool_budget=budget)


def test_every_budget_field_has_its_range():
    from dataclasses import fields

    from collab.tools.options import BUDGET_RANGES

    assert list(BUDGET_RANGES) == [f.name for f in fields(Budget)]


@pytest.mark.parametrize(
    "key, value, valid",
    [
        ("calls", -1, "an integer >= 0"),
        ("calls", 1.5, "an integer >= 0"),
        ("calls", True, "an integer >= 0"),
        ("calls", "2", "an integer >= 0"),
        ("calls", None, "an integer >= 0"),
        ("tool_seconds", 0, "a number of seconds > 0"),
        ("tool_seconds", -2.5, "a number of seconds > 0"),
        ("tool_seconds", float("nan"), "a number of seconds > 0"),
        ("tool_seconds", "10", "a number of seconds > 0"),
        ("tool_seconds", False, "a number of seconds > 0"),
        ("tool_seconds", None, "a number of seconds > 0"),
        ("tokens", 0, "an integer >= 1 or null"),
        ("tokens", -3, "an integer >= 1 or null"),
        ("tokens", 2.0, "an integer >= 1 or null"),
        ("tokens", True, "an integer >= 1 or null"),
        ("context", 0, "an integer >= 1 or null"),
        ("context", "4k", "an integer >= 1 or null"),
        ("end_after_calls", "yes", "true or false"),
        ("end_after_calls", 1, "true or false"),
        ("end_after_calls", None, "true or false"),
    ],
)
def test_a_bad_budget_field_is_one_line_naming_it_and_its_range(key, value, valid):
    with pytest.raises(UserError) as e:
        make_env("math", tools=["calculator"], tool_budget={key: value})
    line = str(e.value)
    assert line.startswith(f"env option tool_budget.{key} must be {valid}") and "\n" not in line
    assert line.endswith(f", got {value!r}")


@pytest.mark.parametrize(
    "budget",
    [
        {"calls": 0},
        {"calls": 100},
        {"tool_seconds": 0.001},
        {"tool_seconds": 1},
        {"tool_seconds": float("inf")},
        {"tokens": 1, "context": 1},
        {"tokens": None, "context": None},
        {"end_after_calls": True, "calls": 1},
        {"end_after_calls": False},
    ],
)
def test_the_edges_of_each_range_are_accepted(budget):
    assert make_env("math", tools=["calculator"], tool_budget=budget).tools.budget == Budget(**budget)


def test_a_budget_given_as_text_is_checked_as_read():
    """On the command line the option is YAML text (``--data.env_options.tool_budget '{calls: -1}'``)."""
    with pytest.raises(UserError, match=r"tool_budget.calls must be an integer >= 0 .*, got -1$"):
        tool_budget("{calls: -1}")
    assert tool_budget("{tool_seconds: .inf, tokens: null}") == Budget(tool_seconds=float("inf"))


def test_an_env_without_tools_plays_the_bare_team():
    plain = make_env("math")
    assert not plain.tools and plain.tools.acting("team") == "team"
    assert not make_env("math", tool_budget={"calls": 1}, call_penalty=0.5).tools  # no agent has a tool
    tooled = make_env("math", tools=["calculator"], tool_budget={"calls": 1})
    team = tooled.tools.acting("team")
    assert isinstance(team, ToolTeam) and team.budget == Budget(calls=1) and sorted(team.tools) == [0, 1]
    assert team.team == "team" and tooled.tools.acting("other").team == "other"  # a view of the team it is given


def test_calls_are_counted_and_charged():
    """A joint reward pays for the team's calls, per-agent rewards for each agent's own; errors are counted."""
    from types import SimpleNamespace

    from collab.envs.base import EnvState, StepResult
    from collab.tools.turns import ToolUse

    use = lambda result: ToolUse("calculator", {}, result, 0.0)  # noqa: E731
    joint = [SimpleNamespace(tool_calls=[use("2"), use("error: division by zero")]), SimpleNamespace(tool_calls=[])]
    step = StepResult(EnvState({}, ((), ())), (1.0, 1.0), True, {"solved": 1.0})
    charge = ToolSetup(call_penalty=0.1).charge
    team = charge(step, joint, SimpleNamespace(joint_reward=True), {})
    assert team.rewards == pytest.approx((0.8, 0.8)) and team.info == {
        "solved": 1.0,
        "tool_calls": 2.0,
        "tool_errors": 1.0,
    }
    own = charge(step, joint, SimpleNamespace(joint_reward=False), {})
    assert own.rewards == pytest.approx((0.8, 1.0))
    free = ToolSetup().charge(step, joint, SimpleNamespace(joint_reward=True), {})
    assert free.rewards == (1.0, 1.0) and free.info["tool_calls"] == 2.0
    # the math env judges a call right when its result is the problem's answer: 2 is, an error never is
    math = make_env("math", dataset="large_arithmetic", tools=["calculator"])
    judged = math.tools.charge(
        step, joint + [SimpleNamespace(tool_calls=[use("2.0"), use("3")])], math, {"answer": "2"}
    )
    assert judged.info["tool_right"] == 2.0 and judged.info["tool_calls"] == 4.0
    assert math.tools.charge(step, [SimpleNamespace(tool_calls=[])] * 2, math, {"answer": "2"}).info["tool_right"] == 0
    assert make_env("math", tools=["calculator"], call_penalty=0.25).tools.call_penalty == 0.25
    with pytest.raises(UserError, match="call_penalty must be a number >= 0"):
        make_env("math", tools=["calculator"], call_penalty=-1)


def test_tool_choice_names_the_tool_a_turn_opens_with():
    both = make_env("math", tools={0: ["calculator"], 1: ["calculator", "python"]}, tool_choice="calculator")
    assert both.tools.choice == {0: "calculator", 1: "calculator"}
    assert both.tools.acting("team").choice == {0: "calculator", 1: "calculator"}
    assert make_env("math", tools={1: ["python"]}, tool_choice="python").tools.choice == {1: "python"}
    assert make_env("math", tools=["calculator"], tool_choice="auto").tools.choice == {}
    assert make_env("math", tools=["calculator"], tool_choice={1: "calculator"}).tools.choice == {1: "calculator"}
    assert make_env("math", tools=["calculator"]).tools.choice == {} and make_env("math").tools.choice == {}
    with pytest.raises(UserError, match="no agent has tool 'python'; valid: auto, calculator"):
        make_env("math", tools=["calculator"], tool_choice="python")
    with pytest.raises(UserError, match="agent 0 has no tool 'calculator'; its tools: none"):
        make_env("math", tools={1: ["calculator"]}, tool_choice={0: "calculator"})


def test_the_tool_cells_config_composes_into_a_calculator_duo(capsys):
    """conf/compare/math_tools.yaml (the learning-with-tools cells): the duo on large operands, the Actor
    opening its turn with a calculator call, one call a turn."""
    from pathlib import Path

    import yaml

    from collab.fit import print_config

    config = Path(__file__).resolve().parents[2] / "conf" / "compare" / "math_tools.yaml"
    with pytest.raises(SystemExit):
        print_config("marft_a", ["--config", str(config), "--print_config"])
    data = yaml.safe_load(capsys.readouterr().out)["data"]
    env = make_env(data["env"], **data["env_options"])
    assert (env.dataset, [r.name for r in env.roles]) == ("large_arithmetic", ["reasoner", "actor"])
    tools = env.tools
    assert (
        list(tools.by_agent) == [1] and list(tools.by_agent[1]) == ["calculator"] and tools.choice == {1: "calculator"}
    )
    assert tools.budget == Budget(calls=1)
