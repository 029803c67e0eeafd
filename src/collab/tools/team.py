"""The team as a rollout sees it when agents have tools: prompts that show each agent its tools, turns with calls.

:class:`ToolTeam` wraps an :class:`~collab.policy.team.AgentTeam` with what a rollout asks of a team: ``encode``
renders an agent's chat with its tools (:func:`~collab.tools.calls.encode_with_tools`), ``generate`` decodes turns
with calls (:func:`~collab.tools.turns.generate_with_tools`), ``acting`` is the team's own. The rollout builds it
from the env's tools (:meth:`collab.tools.setup.ToolSetup.acting`). An agent without tools encodes and decodes
exactly as with the bare team.
"""

from __future__ import annotations

from collab.policy.sampling import Completion, GenerationRequest
from collab.tools.base import Budget, Tool
from collab.tools.calls import encode_with_tools
from collab.tools.turns import generate_with_tools


class ToolTeam:
    def __init__(
        self, team, tools: dict[int, dict[str, Tool]], budget: Budget = Budget(), choice: dict[int, str] | None = None
    ) -> None:
        """``tools[agent]``: the tools team member ``agent`` may call, by name; ``choice[agent]``: the tool whose call
        opens its turn (:func:`~collab.tools.turns.generate_with_tools`)."""
        self.team, self.tools, self.budget, self.choice = team, tools, budget, choice or {}

    def encode(self, agent: int, messages) -> list[int]:
        mine = self.tools.get(agent)
        if not mine:
            return self.team.encode(agent, messages)
        return encode_with_tools(self.team.tokenizer_of(agent), messages, list(mine.values()))

    def generate(self, requests: list[GenerationRequest], max_new_tokens: int = 128) -> list[list[Completion]]:
        return generate_with_tools(self.team, requests, self.tools, self.budget, max_new_tokens, self.choice)

    def acting(self, turn: int, role: int) -> int:
        """The member playing ``role`` at ``turn``: the team's own routing
        (:meth:`collab.policy.team.AgentTeam.acting`), else agent ``role``, as a bare team plays."""
        routed = getattr(self.team, "acting", None)
        return routed(turn, role) if routed else role
