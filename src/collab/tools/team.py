"""The team as a rollout sees it when agents have tools: prompts that show each agent its tools, turns with calls.

:class:`ToolTeam` wraps an :class:`~collab.policy.team.AgentTeam`: ``encode`` renders an agent's chat with its tools
(:func:`~collab.tools.calls.encode_with_tools`), ``generate`` decodes turns with calls
(:func:`~collab.tools.turns.generate_with_tools`); everything else is the team's own. The rollout code (episodes,
MAGRPO's tree) is unchanged: it is handed this team instead of the bare one. An agent without tools encodes and
decodes exactly as with the bare team.
"""

from __future__ import annotations

from collab.tools.base import Tool
from collab.tools.calls import encode_with_tools
from collab.tools.turns import Budget, generate_with_tools


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

    def generate(self, requests, max_new_tokens: int = 128):
        return generate_with_tools(self.team, requests, self.tools, self.budget, max_new_tokens, self.choice)

    def __getattr__(self, name: str):
        return getattr(self.team, name)

    def __len__(self) -> int:
        return len(self.team)


def acting_team(team, env):
    """The team a rollout on ``env`` plays: a :class:`ToolTeam` when the env gives agents tools (its ``tools``
    option), else ``team`` itself, unchanged."""
    if not getattr(env, "tools", None):
        return team
    return ToolTeam(team, env.tools, env.tool_budget or Budget(), getattr(env, "tool_choice", None))
