"""What a tool is: a name, a description, the JSON schema of its arguments and a function from arguments to text.

A tool's result is always text for the agent's context: bad arguments raise :class:`ToolError`, which the caller
(:func:`Tool.__call__`) turns into an ``error: ...`` result, so that a malformed call costs the agent a turn's
tokens, never the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar


class ToolError(Exception):
    """A call the tool cannot run (missing or ill-typed arguments, an expression it refuses): the message is
    what the agent reads."""


class Tool:
    """A tool an agent may call within its turn. Subclasses set :attr:`name`, :attr:`description`,
    :attr:`parameters` (JSON schema of the arguments, as chat templates' ``tools=`` take it) and
    :meth:`run`."""

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]

    def run(self, arguments: dict[str, Any]) -> str:
        raise NotImplementedError

    def for_task(self, task: Mapping[str, Any] | None) -> Tool:
        """The tool as an agent acting on the env's ``task`` calls it (None: the task is not known): itself, unless
        the tool reads the task (the coding env's ``run_tests`` runs the task's visible tests)."""
        return self

    def schema(self) -> dict[str, Any]:
        """The tool as a chat template's ``tools=`` entry (the OpenAI function format)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def __call__(self, arguments: Any) -> str:
        """The result text of a call; a call the tool refuses gives ``error: REASON``."""
        if not isinstance(arguments, dict):
            return f"error: {self.name} takes an object of arguments, got {type(arguments).__name__}"
        try:
            return self.run(arguments)
        except ToolError as e:
            return f"error: {e}"

    def argument(self, arguments: dict[str, Any], key: str, kind: type, default: Any = ...) -> Any:
        """``arguments[key]`` checked against ``kind`` (a ToolError naming the tool's parameters otherwise)."""
        if key not in arguments:
            if default is not ...:
                return default
            raise ToolError(f"{self.name} needs the argument {key!r} ({', '.join(self.parameters['properties'])})")
        value = arguments[key]
        if kind is int and isinstance(value, bool) or not isinstance(value, kind):
            raise ToolError(f"{self.name}'s {key!r} must be a {kind.__name__}, got {type(value).__name__}")
        return value


@dataclass(frozen=True)
class Budget:
    """What one agent's turn may spend on tools (:mod:`collab.tools.turns`; a run's from ``tool_budget``)."""

    calls: int = 4
    tool_seconds: float = 30.0
    tokens: int | None = None
    """The agent's own tokens in the turn (None: its ``max_new_tokens``)."""
    context: int | None = None
    """Tokens of prompt and turn together (None: the model's ``max_position_embeddings``, where it says)."""
    end_after_calls: bool = False
    """End the turn with the result of its last allowed call (``calls``), the agent writing nothing after it: an
    agent whose part is to make the call, such as the duo's Reasoner, whose turn is then its call and the result
    the agents after it read."""
