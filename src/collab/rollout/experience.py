"""What flows through the training step, typed: rollout -> :class:`Experience` -> prepare -> :class:`Batch`
-> minibatches -> ``normalizers`` -> :class:`Normalizers` -> ``terms`` (the micro-batch's loss, their sum).

An :class:`Experience` holds a rollout's units (``items``), the episodes they come from and what is logged; a
:class:`Batch` the items to train on, the rollout's metrics and the agents that learn; :class:`Normalizers` what a
minibatch's loss divides or weighs by, aligned with the minibatch by position (:meth:`Normalizers.select` cuts a
micro-batch's out). The units: :class:`Decision` (one agent's response at one history: MAGRPO, MAPoRL) and
:class:`Transition` (one turn, every agent's response: CoLLM, Algorithm 1, lines 6, 14 and 17; MARFT, Algorithm 1),
with named fields where the papers have names (docs/design.md, *One training step for every algorithm*).
:func:`epochs` draws the minibatches of PPO's update loop; as in Algorithm 1 the experience holds one rollout step
(``data.batch_size`` tasks) and is dropped after its epochs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar, Union

import torch
from torch import Tensor

from collab.envs.base import EnvState
from collab.objectives import absorbing_reward
from collab.policy.sampling import Completion
from collab.rollout.episodes import Episode

__all__ = ["Batch", "Decision", "Experience", "Normalizers", "Transition", "epochs", "minibatches", "transitions"]

Scalar = Union[float, Tensor]


@dataclass
class Decision:
    """One agent's response at one history: a policy-gradient term of its own."""

    member: int
    """The team member whose adapter produced it (agent i; MAPoRL's per-turn parameters: (t, i))."""
    agent: int
    """Its role in the team (index of the environment's agents)."""
    turn: int
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: Tensor
    """Behaviour log-prob of each completion token, ``[L]``."""
    reward: float = 0.0
    returns: Scalar = 0.0
    """The return: one number (sequence-level algorithms) or one per token, ``[L]``."""
    advantages: Scalar = 0.0
    """The advantage, shaped as ``returns``."""
    values: Tensor | None = None
    """V_old at rollout time, ``[L]`` (token-level critics)."""
    features: Tensor | None = None
    """The frozen base's hidden states the value head reads, ``[L, H]``."""
    group: int = -1
    """The history node it was drawn at (MAGRPO: siblings share it)."""
    text: str = ""
    adapter_version: int | None = None
    """The version of the member's adapter that sampled it (``Completion.adapter_version``; ``None``: the torch
    engine)."""
    own: list[bool] | None = None
    """Which completion tokens the agent wrote (``Completion.own``; None: all); ``old_logprobs`` are theirs."""

    @property
    def old_logprob(self) -> float:
        """The sequence log-prob under the behaviour policy (sum over the response's tokens)."""
        return float(sum(self.old_logprobs.tolist()))

    @property
    def tokens(self) -> int:
        """Prompt and completion tokens: its size in a forward pass."""
        return len(self.prompt_ids) + len(self.completion_ids)


@dataclass
class Transition:
    state: EnvState
    """h_t (and m_t: ``state.turn``, ``state.memory['last_reward']``)."""
    actions: list[Completion]
    """a_t: each agent's response with its token ids and behaviour log-probs."""
    rewards: tuple[float, ...]
    """r_t per agent (identical under a joint reward)."""
    done: bool
    """The episode ended with this turn (terminated or at the turn limit): no bootstrapping."""
    next_state: EnvState
    """h_{t+1} (and m_{t+1})."""
    episode: int = 0
    turn: int = 0
    next_actions: list[str] | None = None
    """a_{t+1} as texts (a Q-critic's TD target); ``None`` after the last turn."""
    turns_left: int = 0
    """Turns of the horizon skipped by an early end with this turn: its reward repeats that many more
    times (:func:`collab.objectives.absorbing_reward`, applied by :meth:`returned_rewards`)."""
    advantages: Tensor | None = None
    """Per agent ``[n]`` (action-level) or per token of the turn's responses (MARFT-T), fixed by ``prepare``."""
    returns: Tensor | None = None
    """Value targets, shaped as ``advantages``."""
    values: Tensor | None = None
    """V_old at rollout time, shaped as ``advantages``."""
    features: Tensor | None = None
    """The central critic's input features (MARFT: the frozen base's hidden states)."""

    def returned_rewards(self, gamma: float) -> tuple[float, ...]:
        """r_t per agent, with an early end's absorbing repetitions folded in (the reward a return sums)."""
        if not self.turns_left:
            return self.rewards
        return tuple(float(absorbing_reward(r, self.turns_left, gamma)) for r in self.rewards)

    @property
    def tokens(self) -> int:
        """Prompt and completion tokens of every agent's response: its size in a forward pass."""
        return sum(len(c.prompt_ids) + len(c.completion_ids) for c in self.actions)


def transitions(episodes: Sequence[Episode], first_episode: int = 0) -> list[Transition]:
    """Every turn of every episode as a transition, in episode then turn order."""
    out = []
    for e, ep in enumerate(episodes):
        for t, step in enumerate(ep.steps):
            nxt = [c.text for c in ep.completions[t + 1]] if t + 1 < len(ep.steps) else None
            out.append(
                Transition(
                    ep.state_at(t),
                    list(ep.completions[t]),
                    tuple(step.rewards),
                    step.done,
                    step.state,
                    first_episode + e,
                    t,
                    nxt,
                    turns_left=step.turns_left,
                )
            )
    return out


Item = TypeVar("Item", Decision, Transition)


@dataclass
class Experience(Generic[Item]):
    """What one rollout hands to ``prepare``: this rank's share of the step's tasks, played."""

    items: list[Item]
    """The units of the update: :class:`Decision` or :class:`Transition` records."""
    stats: dict[str, float] = field(default_factory=dict)
    """Scalars to log: rewards per agent and turn, reward components, tokens, seconds."""
    examples: list[dict[str, Any]] = field(default_factory=list)
    """A few (prompt, responses, reward) records for the sample-text log."""
    episodes: list[Episode] = field(default_factory=list)
    """The played episodes (``Transition.episode`` indexes them); empty for MAGRPO's trees."""

    def __len__(self) -> int:
        return len(self.items)


@dataclass
class Batch(Generic[Item]):
    """What ``prepare`` hands to the update: the items with what it fixed on them (advantages, returns, values,
    features), the metrics of the rollout and who learns from it."""

    items: list[Item]
    """The items the update draws its minibatches from (MAGRPO: only those with a learning signal)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Scalars to log, computed by ``prepare`` (advantage statistics, the KL to the reference, ...)."""
    agents: list[int] | None = None
    """The agents whose policies this rollout trains (MARFT: all, one in turn, none during the critic's
    warm-up); None: every agent."""


@dataclass
class Normalizers:
    """What a minibatch's loss needs from the minibatch of every rank, computed once per minibatch by the
    algorithm's ``normalizers`` (collectives under DDP) and handed to ``terms`` with each micro-batch."""

    count: float
    """The loss's denominator: the minibatch's items (MAPoRL: answer tokens) over every rank."""
    per_agent: list[float] | None = None
    """Each agent's items in the minibatch over every rank (MAGRPO: an agent's loss is the mean over its samples)."""
    advantages: list[Tensor] | list[list[Tensor]] | None = None
    """Per item, aligned with the items by position: the advantages its actor loss weighs (normalized over every
    rank's minibatch where the algorithm does): a tensor, or for MARFT a list with one tensor per trained agent, in
    agent order (each agent's kept apart for its own term). None: the loss computes them (CoLLM's TD errors)."""
    agents: list[int] | None = None
    """The agents whose actor loss is taken (MARFT: the batch's ``agents``); None: every agent."""
    with_kl: bool = False
    """The loss computes the KL to the reference policy (MAGRPO: with a penalty, or to log it on a rollout's
    first update)."""

    def select(self, positions: Sequence[int]) -> Normalizers:
        """The normalizers of the items at ``positions`` (a micro-batch): the per-item values follow their items."""
        if self.advantages is None:
            return self
        return replace(self, advantages=[self.advantages[i] for i in positions])


def minibatches(items: Sequence, size: int | None, generator: torch.Generator) -> Iterator[list]:
    """One pass over ``items`` in a random order, ``size`` at a time (None: all at once)."""
    order = torch.randperm(len(items), generator=generator).tolist()
    size = size or len(order) or 1
    for start in range(0, len(order), size):
        yield [items[i] for i in order[start : start + size]]


def epochs(items: Sequence, num_epochs: int, size: int | None, generator: torch.Generator) -> Iterator[list]:
    """The minibatches of ``num_epochs`` passes, each pass in a new random order (PPO's update loop)."""
    for _ in range(num_epochs):
        yield from minibatches(items, size, generator)


def decisions(
    episodes: Sequence[Episode], rewards: Sequence[Tensor], member_of=None, from_turn: int = 0
) -> list[Decision]:
    """Every non-empty response of turns >= ``from_turn`` of the episodes as a :class:`Decision` carrying
    ``rewards[e][t, a]`` (episode e's ``[T, A]`` table); ``member_of(t, a)``: the team member that acted
    (default: agent a)."""
    return [
        Decision(
            member_of(t, a) if member_of else a,
            a,
            t,
            list(c.prompt_ids),
            list(c.completion_ids),
            torch.tensor(c.logprobs, dtype=torch.float32),
            float(table[t, a]),
            text=c.text,
            adapter_version=c.adapter_version,
            own=c.own,
        )
        for ep, table in zip(episodes, rewards)
        for t, joint in enumerate(ep.completions)
        if t >= from_turn
        for a, c in enumerate(joint)
        if len(c.completion_ids)
    ]


def turn_means(name: str, tables: Sequence[Tensor]) -> dict[str, float]:
    """Logging scalars of per-episode ``[t, A]`` tables (episodes of different lengths): ``name`` (the mean of
    every entry) and ``name/turn{t}`` (1-based: the mean at turn t over the episodes that reached it)."""
    out = {name: float(torch.cat([r.flatten() for r in tables]).mean())}
    for t in range(max(r.shape[0] for r in tables)):
        out[f"{name}/turn{t + 1}"] = float(torch.stack([r[t].mean() for r in tables if len(r) > t]).mean())
    return out
