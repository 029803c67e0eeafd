"""vLLM's samples scored by the trainer: their behaviour log-probs, and how far vLLM's own are from them.

Behaviour log-probs are recomputed by the training model (teacher-forced, no gradient: :func:`rescore`), so that
PPO/GRPO ratios are exactly 1 before an update whatever vLLM's kernels round to; vLLM's own log-probs of agents that
sample without top-p or top-k (:func:`untruncated`) are kept as :attr:`VllmCompletion.engine_logprobs` and
compared on every rollout (:func:`logprob_gap`, ``engine/logprob_gap``). Why, and what the gap shows:
docs/engines.md, *Agreement*.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from collab.policy.adapters import eval_mode
from collab.policy.sampling import Completion

RESCORE_TOKENS = 2048
"""Rows x (longest completion + 1) per teacher-forced forward when recomputing behaviour log-probs: bounds
the logits held at once (SmolLM2: 2048 x 49152 floats, 0.4 GB)."""


@dataclass
class VllmCompletion(Completion):
    """A completion sampled by vLLM."""

    engine_logprobs: list[float] | None = None
    """The log-prob vLLM reported for each token (its processed distribution: temperature and action vocabulary
    applied); ``None`` for an agent with top-p or top-k truncation, whose vLLM log-probs are renormalised over the
    kept tokens and so not comparable with :attr:`logprobs`, the trainer's."""


def untruncated(sampling) -> bool:
    """Whether an agent samples from its whole (temperature-scaled) distribution: no top-p, no top-k."""
    return sampling.top_p >= 1 and sampling.top_k <= 0


def logprob_gap(engine: list[float], trainer: list[float]) -> float:
    """How far vLLM's log-probs of a completion are from the trainer's: the largest difference relative to the
    completion's largest log-prob magnitude, at least 1 nat (an absolute difference for near-certain tokens,
    whose log-probs are rounding noise around 0)."""
    if not trainer:
        return 0.0
    scale = max(1.0, max(abs(b) for b in trainer))
    return max(abs(a - b) for a, b in zip(engine, trainer)) / scale


@torch.no_grad()
def rescore(team, completions: list[Completion]) -> None:
    """Set each completion's behaviour log-probs to the training model's teacher-forced ones (in chunks of
    at most :data:`RESCORE_TOKENS` logits rows, a request's samples kept together)."""
    rows = [c for c in completions if c.completion_ids]
    chunk: list[Completion] = []
    for c in rows + [None]:  # type: ignore[list-item]
        if c is not None and (
            not chunk or (len(chunk) + 1) * (1 + max(len(x.completion_ids) for x in chunk + [c])) <= RESCORE_TOKENS
        ):
            chunk.append(c)
            continue
        if chunk:
            with contextlib.ExitStack() as stack:  # as the torch engine samples: no dropout
                for model in team.models.values():
                    stack.enter_context(eval_mode(model))
                logps = team.logprobs(
                    [x.agent for x in chunk], [x.prompt_ids for x in chunk], [x.completion_ids for x in chunk]
                )
            for x, lp in zip(chunk, logps):
                x.logprobs = lp.float().tolist()
        chunk = [c] if c is not None else []
