"""The env options that give agents tools: ``tools`` and ``tool_budget`` (any env, through ``make_env``).

``tools``: a list of tools for every agent, or a mapping from an agent's index to its own list; a tool is its name
or a mapping of its name and options::

    --data.env_options '{tools: [calculator]}'
    --data.env_options '{tools: {1: [calculator, {name: search, corpus: docs.jsonl}]}}'     # agent 1 only

``tool_budget``: :class:`~collab.tools.turns.Budget`'s fields (``{calls: 2, tool_seconds: 10}``). A bad name, option
or field ends in one line naming what is valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from collab.errors import UserError
from collab.tools import Tool, make_tool
from collab.tools.turns import Budget


def one_tool(entry: Any) -> Tool:
    if isinstance(entry, str):
        return make_tool(entry)
    if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
        return make_tool(entry["name"], **{k: v for k, v in entry.items() if k != "name"})
    raise UserError(f"env option tools: a tool is a name or {{name: NAME, option: value}}, got {entry!r}")


def tool_list(entries: Any) -> dict[str, Tool]:
    if not isinstance(entries, list):
        raise UserError(f"env option tools: expected a list of tools (e.g. [calculator, python]), got {entries!r}")
    tools = [one_tool(e) for e in entries]
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


def agent_tools(value: Any, n_agents: int) -> dict[int, dict[str, Tool]]:
    """Each agent's tools by name from the ``tools`` option (None: none)."""
    value = read(value)
    if value is None:
        return {}
    if isinstance(value, Mapping):
        out = {}
        for agent, entries in value.items():
            if isinstance(agent, bool) or not isinstance(agent, int) or not 0 <= agent < n_agents:
                raise UserError(f"env option tools: agent {agent!r} is not one of the team's 0-{n_agents - 1}")
            out[agent] = tool_list(entries)
        return out
    tools = tool_list(value)
    return {agent: tools for agent in range(n_agents)}


def tool_budget(value: Any) -> Budget:
    """The ``tool_budget`` option as a :class:`Budget` (None: the defaults)."""
    value = read(value)
    if value is None:
        return Budget()
    names = [f.name for f in fields(Budget)]
    if not isinstance(value, Mapping) or set(value) - set(names):
        raise UserError(f"env option tool_budget: expected a mapping of {', '.join(names)}, got {value!r}")
    return Budget(**value)
