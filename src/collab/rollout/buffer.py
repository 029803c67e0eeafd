"""The replay buffer of the actor-critic algorithms (paper 002, Algorithm 1, lines 6, 14 and 17).

Each turn of each episode is stored as a :class:`Transition` (h_t, m_t, a_t, r_t, o_{t+1}, m_{t+1},
pi_old): the states carry the histories and the global information (turn index, last reward), the
completions carry the behaviour log-probs. As in Algorithm 1 the buffer holds the episodes of one
rollout step (``data.batch_size`` tasks) and is cleared after the step's ``E`` epochs of minibatches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from collab.envs.base import EnvState
from collab.objectives import absorbing_reward
from collab.rollout.episodes import Episode
from collab.policy.sampling import Completion


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
    extras: dict = field(default_factory=dict)
    """Per-algorithm values fixed at rollout time (IPPO's advantages and returns)."""
    turns_left: int = 0
    """Turns of the horizon skipped by an early end with this turn: its reward repeats that many more
    times (:func:`collab.objectives.absorbing_reward`, applied by :meth:`returned_rewards`)."""

    def returned_rewards(self, gamma: float) -> tuple[float, ...]:
        """r_t per agent, with an early end's absorbing repetitions folded in (the reward a return sums)."""
        if not self.turns_left:
            return self.rewards
        return tuple(float(absorbing_reward(r, self.turns_left, gamma)) for r in self.rewards)


def transitions(episodes: Sequence[Episode], first_episode: int = 0) -> list[Transition]:
    """Every turn of every episode as a transition, in episode then turn order."""
    out = []
    for e, ep in enumerate(episodes):
        for t, step in enumerate(ep.steps):
            nxt = [c.text for c in ep.completions[t + 1]] if t + 1 < len(ep.steps) else None
            out.append(Transition(ep.state_at(t), list(ep.completions[t]), tuple(step.rewards), step.done,
                                  step.state, first_episode + e, t, nxt, turns_left=step.turns_left))
    return out


class ReplayBuffer:
    """Transitions of the current rollout step, drawn in shuffled minibatches."""

    def __init__(self, items: Sequence[Transition] = ()) -> None:
        self.items: list[Transition] = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def add(self, items: Sequence[Transition]) -> None:
        self.items.extend(items)

    def clear(self) -> None:
        self.items.clear()

    def epochs(self, num_epochs: int, size: int | None, generator: torch.Generator) -> Iterator[list[Transition]]:
        """The minibatches of ``num_epochs`` passes, each pass in a new random order (PPO's update loop)."""
        for _ in range(num_epochs):
            yield from self.minibatches(size, generator)

    def minibatches(self, size: int | None, generator: torch.Generator) -> Iterator[list[Transition]]:
        """One pass over the buffer in a random order, ``size`` transitions at a time (None: all)."""
        order = torch.randperm(len(self.items), generator=generator).tolist()
        size = size or len(order) or 1
        for start in range(0, len(order), size):
            yield [self.items[i] for i in order[start:start + size]]
