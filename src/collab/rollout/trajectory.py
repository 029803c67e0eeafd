"""Records that flow from rollouts to training steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sample:
    """One agent's action at one history: the unit of a policy-gradient update."""

    agent: int
    turn: int
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprob: float
    """Sequence log-prob under the behaviour policy (sum over the response's tokens)."""
    text: str = ""
    returns: float = 0.0
    advantages: float = 0.0
    group: int = -1
    """Index of the history node the sample was drawn at (siblings share it)."""


@dataclass
class RolloutBatch:
    """What one rollout step hands to ``training_step``."""

    samples: list[Sample]
    stats: dict[str, float] = field(default_factory=dict)
    """Scalars to log: rewards per agent and turn, reward components, tokens, seconds."""
    examples: list[dict[str, Any]] = field(default_factory=list)
    """A few (prompt, responses, reward) records for the sample-text log."""
    buffer: Any = None
    """The actor-critic algorithms' replay buffer of transitions (``samples`` is then empty)."""

    def __len__(self) -> int:
        return len(self.samples)
