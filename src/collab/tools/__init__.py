"""Tools an agent may call within its turn, and their registry: ``make_tool("calculator")``,
``make_tool("search", corpus="docs.jsonl")``, ``make_tool("my_tools:Weather")`` (a tool of one's own by class
path, as envs and algorithms: docs/extending.md).

- :mod:`~collab.tools.base`: :class:`Tool` (name, description, JSON schema of its arguments, ``run``) and
  :class:`ToolError` (a refused call: its message is the agent's result);
- :mod:`~collab.tools.calls`: the call format (``<tool_call>`` JSON), reading a call, running it, the prompt and
  result messages;
- :mod:`~collab.tools.turns`: a turn with calls, decoded in rounds under a :class:`~collab.tools.setup.Budget`;
- the seam with the rollout: :mod:`~collab.tools.options` reads the env options into one
  :class:`~collab.tools.setup.ToolSetup` (the env's ``tools``), whose ``acting`` gives the team a rollout plays
  (:class:`~collab.tools.team.ToolTeam`) and whose ``charge`` counts and prices a turn's calls;
- the tools: ``python`` (:mod:`~collab.tools.python`, the sandbox), ``calculator``
  (:mod:`~collab.tools.calculator`, exact arithmetic), ``search`` (:mod:`~collab.tools.search`, BM25 over a local
  corpus).
"""

from __future__ import annotations

from collab.errors import UserError, registered_class
from collab.tools.base import Tool, ToolError

__all__ = ["Tool", "ToolError", "make_tool", "tool_class", "tool_names"]

# name -> "module:Class"; a tool's module is imported only when it is built.
_TOOLS = {
    "python": "collab.tools.python:Python",
    "calculator": "collab.tools.calculator:Calculator",
    "search": "collab.tools.search:Search",
}


def tool_class(name: str) -> type[Tool]:
    """The class of tool ``name``: a built-in name, or a class path ``module:Class`` naming a :class:`Tool`
    subclass importable from the working directory. An unknown name is a UserError listing the valid ones."""
    return registered_class(name, _TOOLS, Tool, "tool", "tool")


def tool_names() -> list[str]:
    return sorted(_TOOLS)


def make_tool(name: str, **options) -> Tool:
    """Build tool ``name`` with its options (bad options end in a UserError naming the valid ones)."""
    import inspect

    cls = tool_class(name)
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    valid = [p.name for p in inspect.signature(cls.__init__).parameters.values() if p.kind in named][1:]  # no self
    bad = sorted(set(options) - set(valid))
    if bad:
        raise UserError(
            f"tool {name!r} has no option {', '.join(map(repr, bad))}; its options: {', '.join(valid) or 'none'}"
        )
    return cls(**options)
