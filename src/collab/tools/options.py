"""The env options that give agents tools (any env, through ``make_env``), read into one
:class:`~collab.tools.setup.ToolSetup` (:func:`tool_setup`): ``tools``, ``tool_budget``, ``tool_choice`` and
``call_penalty`` (:mod:`collab.tools.setup`).

Their forms, ranges (:data:`BUDGET_RANGES`) and examples: docs/environments.md#tools-within-a-turn. A bad name,
option or field ends in one line naming what is valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from collab.errors import UserError
from collab.tools import Tool, make_tool, tool_names
from collab.tools.base import Budget
from collab.tools.setup import ToolSetup


def tool_setup(options: Mapping[str, Any], n_agents: int, offered: Mapping[str, str]) -> ToolSetup:
    """The :class:`ToolSetup` of an env's tool options (``offered``: the env's own tools by name); each option
    checked here, where it is read, so that a bad one ends the run in one line before anything is loaded."""
    tools = agent_tools(options.get("tools"), n_agents, offered)
    budget, choice = tool_budget(options.get("tool_budget")), tool_choice(options.get("tool_choice"), tools)
    return ToolSetup(tools, budget, choice, float(options.get("call_penalty", 0.0)))


def one_tool(entry: Any, offered: Mapping[str, str]) -> Tool:
    """A tool from its entry: a name (collab's, or one the env offers, ``offered``: name -> ``module:Class``) or a
    mapping of its name and options."""
    if isinstance(entry, str):
        entry = {"name": entry}
    if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
        name = entry["name"]
        if name not in offered and name not in tool_names() and ":" not in name:
            valid = ", ".join(sorted([*tool_names(), *offered]))
            raise UserError(f"unknown tool {name!r}; valid: {valid} (or module:Class, a tool of your own)")
        return make_tool(offered.get(name, name), **{k: v for k, v in entry.items() if k != "name"})
    raise UserError(f"env option tools: a tool is a name or {{name: NAME, option: value}}, got {entry!r}")


def tool_list(entries: Any, offered: Mapping[str, str]) -> dict[str, Tool]:
    if not isinstance(entries, list):
        raise UserError(f"env option tools: expected a list of tools (e.g. [calculator, python]), got {entries!r}")
    tools = [one_tool(e, offered) for e in entries]
    return {t.name: t for t in tools}


def read(value: Any) -> Any:
    """A value given as text on the command line (``--data.env_options.tools '[calculator]'``) read as YAML."""
    if not isinstance(value, str):
        return value
    import yaml

    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def agent_tools(value: Any, n_agents: int, offered: Mapping[str, str] | None = None) -> dict[int, dict[str, Tool]]:
    """Each agent's tools by name from the ``tools`` option (None: none); ``offered``: the env's own tools."""
    offered = offered or {}
    value = read(value)
    if value is None:
        return {}
    if isinstance(value, Mapping):
        out = {}
        for agent, entries in value.items():
            if isinstance(agent, bool) or not isinstance(agent, int) or not 0 <= agent < n_agents:
                raise UserError(f"env option tools: agent {agent!r} is not one of the team's 0-{n_agents - 1}")
            out[agent] = tool_list(entries, offered)
        return out
    tools = tool_list(value, offered)
    return {agent: tools for agent in range(n_agents)}


def _count(low: int, nullable: bool = False):
    """A check that a value is an integer >= ``low`` (or null)."""
    return lambda v: (v is None and nullable) or (isinstance(v, int) and not isinstance(v, bool) and v >= low)


BUDGET_RANGES = {
    "calls": (_count(0), "an integer >= 0 (calls a turn; 0: none runs)"),
    "tool_seconds": (
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
        "a number of seconds > 0 (.inf: no limit)",
    ),
    "tokens": (_count(1, nullable=True), "an integer >= 1 or null (null: the agent's max_new_tokens)"),
    "context": (_count(1, nullable=True), "an integer >= 1 or null (null: the model's max_position_embeddings)"),
    "end_after_calls": (lambda v: isinstance(v, bool), "true or false"),
}
"""Each :class:`Budget` field's valid values and how the error line says them. A budget of 0 tokens or context
would read as "none given" where the turn falls back to its default (``budget.tokens or ...``), so those start
at 1; 0 calls is a turn without tools; seconds of 0 would refuse every call, as 0 calls does more plainly."""


def tool_budget(value: Any) -> Budget:
    """The ``tool_budget`` option as a :class:`Budget` (None: the defaults); every field checked here, where the
    option is read, so that a bad one ends the run in one line before anything is loaded."""
    value = read(value)
    if value is None:
        return Budget()
    names = [f.name for f in fields(Budget)]
    if not isinstance(value, Mapping) or set(value) - set(names):
        raise UserError(f"env option tool_budget: expected a mapping of {', '.join(names)}, got {value!r}")
    for key, given in value.items():
        valid, says = BUDGET_RANGES[key]
        if not valid(given):
            raise UserError(f"env option tool_budget.{key} must be {says}, got {given!r}")
    return Budget(**value)


def tool_choice(value: Any, tools: dict[int, dict[str, Tool]]) -> dict[int, str]:
    """The ``tool_choice`` option as the tool each agent's turn opens with a call to (empty: ``auto``)."""
    value = read(value)
    if value is None or value == "auto":
        return {}
    if isinstance(value, str):
        chosen = {agent: value for agent, mine in tools.items() if value in mine}
        if not chosen:
            names = sorted({name for mine in tools.values() for name in mine})
            raise UserError(f"env option tool_choice: no agent has tool {value!r}; valid: auto, {', '.join(names)}")
        return chosen
    if isinstance(value, Mapping):
        for agent, name in value.items():
            mine = tools.get(agent, {}) if isinstance(agent, int) and not isinstance(agent, bool) else {}
            if name not in mine:
                raise UserError(
                    f"env option tool_choice: agent {agent!r} has no tool {name!r}; its tools: "
                    f"{', '.join(sorted(mine)) or 'none'}"
                )
        return dict(value)
    raise UserError(f"env option tool_choice: expected auto, a tool's name or {{agent: name}}, got {value!r}")
