"""Flex-MG environments: one global text state that every agent observes (MARFT, Section 3.1).

In a Flexible Markov Game the environment holds a state s_t; agent i observes it through its profile
(system prompt) together with the actions of the agents it depends on at the same step (the
dependency function D, fused by concatenation: :mod:`collab.rollout.protocol`). After the joint
action a_t the environment grades the answer of the profile's graded agent (the last one marked
``with_answer``), gives the team reward r_t = R(s_t, a_t) to every agent (Dec-POMDP: a joint reward)
and moves to

    s_{t+1} = s_t + every agent's action labelled by its role + "Judge: correct" | "Judge: incorrect"

(the "judge" line of MARFT's math environment). The episode ends when the answer is solved (reward
>= ``solve_threshold``) or at the horizon. Agents' histories are therefore not dialogs that grow
turn by turn: at every step each agent's history is ``[its profile prompt, s_t]``.

Subclasses set :attr:`domain` (which profiles apply) and supply :meth:`tasks`, :meth:`problem` (s_0)
and :meth:`grade` (or :meth:`grade_batch`, to grade many answers at once).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from collab.envs.base import AgentRole, Env, EnvState, Message, Score
from collab.envs.profiles import answer_agent, load_profile


class SharedStateEnv(Env):
    """Base of the Flex-MG environments (``math``, ``competitive_coding``)."""

    domain: ClassVar[str]
    """``math`` or ``coding``: the profiles that apply (``duo`` means ``<domain>_duo``)."""
    reward_max = 1.0
    solve_threshold: float = 1.0
    """A graded reward at or above this solves the task and ends the episode."""
    default_max_new_tokens: int | None = None

    def __init__(self, profile: str = "duo", horizon: int = 1) -> None:
        super().__init__(horizon)
        self.profile = load_profile(profile, self.domain)
        self.roles = tuple(AgentRole(p.role, p.prompt, self.default_max_new_tokens) for p in self.profile)
        self.answer_agent = answer_agent(self.profile)

    # -- what a subclass supplies ------------------------------------------------------------------
    @abstractmethod
    def problem(self, task: Mapping[str, Any]) -> str:
        """The initial state s_0: the problem statement as the agents read it."""

    @abstractmethod
    def grade(self, task: Mapping[str, Any], answer: str) -> tuple[float, dict[str, float]]:
        """The reward of the graded agent's ``answer`` (in [0, 1]) and named diagnostics to log."""

    def grade_batch(
        self, tasks: Sequence[Mapping[str, Any]], answers: Sequence[str]
    ) -> list[tuple[float, dict[str, float]]]:
        """:meth:`grade` of many answers (override to grade them in parallel)."""
        return [self.grade(t, a) for t, a in zip(tasks, answers, strict=True)]

    # -- the Env protocol --------------------------------------------------------------------------
    def observe(self, task: Mapping[str, Any]) -> list[str]:
        return [self.problem(task)] * self.n_agents

    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        return self.score_batch([state], [actions])[0]

    def score_batch(self, states: Sequence[EnvState], actions: Sequence[Sequence[str]]) -> list[Score]:
        graded = self.grade_batch([s.task for s in states], [a[self.answer_agent] for a in actions])
        out = []
        for reward, info in graded:
            solved = reward >= self.solve_threshold
            out.append(
                Score((float(reward),) * self.n_agents, terminated=solved, info={**info, "solved": float(solved)})
            )
        return out

    def state_text(self, state: EnvState) -> str:
        """s_t: the last user message of every agent's history."""
        return state.histories[0][-1]["content"]

    def transition(self, state: EnvState, actions: Sequence[str], score: Score) -> str:
        """s_{t+1}: s_t, the joint action labelled by role, and the judge's verdict (when there is one)."""
        acted = "\n\n".join(f"{role.name}: {a.strip()}" for role, a in zip(self.roles, actions))
        verdict = self.verdict(score)
        return f"{self.state_text(state)}\n\n{acted}" + (f"\n\nJudge: {verdict}" if verdict is not None else "")

    def verdict(self, score: Score) -> str | None:
        """The judge line's verdict (an environment may add detail, e.g. tests passed); None: no judge line."""
        return "correct" if score.terminated else "incorrect"

    def next_histories(
        self, state: EnvState, actions: Sequence[str], score: Score, done: bool
    ) -> list[tuple[Message, ...]]:
        if done:  # the final actions, kept for logs and evaluation
            return [h + ({"role": "assistant", "content": a},) for h, a in zip(state.histories, actions)]
        nxt = self.transition(state, actions, score)
        return [
            tuple(m for m in h if m["role"] == "system") + ({"role": "user", "content": nxt},) for h in state.histories
        ]
