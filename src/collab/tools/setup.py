"""The agents' tools as a rollout applies them: one :class:`ToolSetup`, read once from the env options ``tools``,
``tool_budget``, ``tool_choice`` and ``call_penalty`` (:func:`collab.tools.options.tool_setup`, called by
``make_env``) and held as the env's ``tools``. The rollout (:mod:`collab.rollout.episodes`,
:mod:`collab.rollout.tree`) is its only user: it plays the team :meth:`ToolSetup.acting` gives and charges each
turn's calls with :meth:`ToolSetup.charge`; an algorithm never sees it.

Each step's info gains ``tool_calls`` and ``tool_errors`` (results that were ``error: ...``), and ``tool_right``
where the env has a ``right_call(task, use)`` method (the math env's); ``call_penalty`` is taken a call from every
agent's reward under a joint reward, from the caller's own otherwise (docs/environments.md#tools-within-a-turn).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from collab.tools.base import Budget, Tool


@dataclass(frozen=True)
class ToolSetup:
    """Each agent's tools, the turn's budget, the forced calls and the price of a call (the module docstring)."""

    by_agent: Mapping[int, Mapping[str, Tool]] = field(default_factory=dict)
    """The tools each agent may call within its turn, by agent and name (an agent absent has none)."""
    budget: Budget = Budget()
    choice: Mapping[int, str] = field(default_factory=dict)
    """The tool whose call opens an agent's turn, by agent (none: the agent decides)."""
    call_penalty: float = 0.0

    def __bool__(self) -> bool:
        """Whether any agent has a tool: without one, the rollout plays and scores exactly as without tools."""
        return bool(self.by_agent)

    def acting(self, team) -> Any:
        """The team a rollout plays: ``team`` itself without tools, else a :class:`~collab.tools.team.ToolTeam` over
        it (a view holding references only, so one per rollout costs nothing)."""
        if not self:
            return team
        from collab.tools.team import ToolTeam

        return ToolTeam(team, self.by_agent, self.budget, self.choice)

    def charge(self, step, joint: Sequence, env, task: Mapping[str, Any]):
        """``step`` (a :class:`~collab.envs.base.StepResult`) with the calls of ``joint`` (the turn's completions on
        ``task``) counted, and charged at ``call_penalty`` each."""
        calls = [len(getattr(c, "tool_calls", ())) for c in joint]
        uses = [u for c in joint for u in getattr(c, "tool_calls", ())]
        errors = sum(u.result.startswith("error:") for u in uses)
        info = {**step.info, "tool_calls": float(sum(calls)), "tool_errors": float(errors)}
        right_call = getattr(env, "right_call", None)
        if callable(right_call):
            info["tool_right"] = float(sum(bool(right_call(task, u)) for u in uses))
        rewards = step.rewards
        if self.call_penalty and any(calls):
            charged = [sum(calls)] * len(calls) if env.joint_reward else calls
            rewards = tuple(r - self.call_penalty * n for r, n in zip(rewards, charged))
        return replace(step, rewards=rewards, info=info)
