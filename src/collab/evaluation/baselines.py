"""Prompt-based baselines of CoLLM, §5.2 (no training), on every environment.

``single``, ``parallel``, ``pipeline`` and ``discussion`` (Du et al. 2023's debate), each with the choices made where
the paper is silent or differs: docs/evaluation.md, *Prompt-based baselines*.

:func:`prepare` turns a baseline name into a :class:`Protocol`: the environment to play (the env
itself or a wrapper) and the Flex-MG dependency to play it under.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from collab.envs.base import Env, EnvState, Message, Score, StepResult
from collab.envs.centralized import EnvWrapper, SingleModelEnv
from collab.errors import require, unknown
from collab.rollout.protocol import Dependency

BASELINES = ("single", "parallel", "pipeline", "discussion")
DRAFTING = "discussion/drafting"
"""Memory key of a :class:`DiscussionEnv` state whose next round is the unscored draft."""


DRAFT_REPLY = (
    "The other agents' responses:\n\n{others}\n\n"
    "Using their responses as additional information, give your updated response."
)
"""Each agent's user message after the draft round (one-turn environments)."""
TURN_REPLY = "The other agents' responses in the last turn:\n\n{others}"
"""Appended to each agent's next user message in multi-turn environments."""


class DiscussionEnv(EnvWrapper):
    """``env`` with the others' previous-round outputs shown to each agent (the ``discussion``
    baseline; module docstring). ``draft``: play an unscored draft round first (default: only
    when ``env`` has one turn)."""

    def __init__(self, env: Env, draft: bool | None = None) -> None:
        super().__init__(env)
        self.roles = env.roles
        self.draft = env.horizon == 1 if draft is None else draft
        if callable(getattr(env, "voxels", None)):  # its states are the inner env's: same IoU
            self.voxels = env.voxels

    def observe(self, task: Mapping[str, Any]) -> list[str]:
        return self.inner.observe(task)

    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        return self.inner.score(state, actions)

    def reset(self, task: Mapping[str, Any]) -> EnvState:
        state = self.inner.reset(task)
        return replace(state, memory={**state.memory, DRAFTING: True}) if self.draft else state

    def others(self, actions: Sequence[str], i: int, shown: str = "") -> str:
        """The other agents' outputs as agent ``i`` reads them (``role: text``), leaving out any that
        ``shown`` already contains."""
        names = [role.name for role in self.roles]
        return "\n\n".join(
            f"{names[j]}: {a.strip()}" for j, a in enumerate(actions) if j != i and a.strip() not in shown
        )

    def step_batch(self, states: Sequence[EnvState], actions: Sequence[Sequence[str]]) -> list[StepResult]:
        out: list[StepResult | None] = [None] * len(states)
        scored = [k for k, s in enumerate(states) if not s.memory.get(DRAFTING)]
        for k, s in enumerate(states):
            if s.memory.get(DRAFTING):
                out[k] = self._draft(s, actions[k])
        results = self.inner.step_batch([states[k] for k in scored], [actions[k] for k in scored]) if scored else []
        for k, res in zip(scored, results):
            out[k] = res if res.done else replace(res, state=self._with_others(res.state, actions[k]))
        return out  # type: ignore[return-value]

    def _draft(self, state: EnvState, actions: Sequence[str]) -> StepResult:
        histories = tuple(
            h
            + (
                {"role": "assistant", "content": a},
                {"role": "user", "content": DRAFT_REPLY.format(others=self.others(actions, i))},
            )
            for i, (h, a) in enumerate(zip(state.histories, actions, strict=True))
        )
        nxt = replace(state, histories=histories, memory={**state.memory, DRAFTING: False})  # turn unchanged
        return StepResult(nxt, (0.0,) * self.n_agents, False, {})

    def _with_others(self, state: EnvState, actions: Sequence[str]) -> EnvState:
        histories = []
        for i, h in enumerate(state.histories):
            last: Message = h[-1]
            others = self.others(actions, i, last["content"])
            if others:
                h = tuple(h[:-1]) + ({**last, "content": f"{last['content']}\n\n{TURN_REPLY.format(others=others)}"},)
            histories.append(h)
        return replace(state, histories=tuple(histories))


@dataclass(frozen=True)
class Protocol:
    """How a method plays an environment: the env to play (``env`` or a wrapper of it) and the
    Flex-MG dependency (``None``: all agents at once)."""

    name: str
    env: Env
    dependency: Dependency | None = None

    @property
    def single(self) -> bool:
        return isinstance(self.env, SingleModelEnv)

    @contextmanager
    def applied(self, team, max_new_tokens: int) -> Iterator[None]:
        """While playing: the single model's length budget is the sum of the roles' budgets (each
        agent's own, else ``max_new_tokens``); free-text agents only, restored on exit."""
        if not self.single:
            yield
            return
        n = self.env.inner.n_agents  # type: ignore[attr-defined]
        budget = sum(team.specs[i].sampling.max_new_tokens or max_new_tokens for i in range(min(n, len(team.specs))))
        saved = [spec.sampling for spec in team.specs]
        try:
            for spec in team.specs:
                if not spec.choices:
                    spec.sampling = replace(spec.sampling, max_new_tokens=budget)
            yield
        finally:
            for spec, sampling in zip(team.specs, saved):
                spec.sampling = sampling


def prepare(name: str, env: Env) -> Protocol:
    """The :class:`Protocol` of baseline ``name`` (one of :data:`BASELINES`) on ``env``."""
    if name not in BASELINES:
        raise unknown("baseline", name, BASELINES)
    if name == "single":
        return Protocol(name, SingleModelEnv(env))
    require(
        env.n_agents >= 2,
        f"the {name} baseline needs at least 2 agents; env {env.name!r} has {env.n_agents} "
        "(use --baseline single, or a profile with more agents)",
    )
    if name == "pipeline":
        return Protocol(name, env, Dependency("chain", env.n_agents))
    if name == "discussion":
        return Protocol(name, DiscussionEnv(env), Dependency("none", env.n_agents))
    return Protocol(name, env, Dependency("none", env.n_agents))
