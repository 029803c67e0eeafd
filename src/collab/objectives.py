"""The math of collab's algorithms as small pure tensor functions.

Every function here is unit-tested against a hand computation (tests/test_objectives.py). Algorithm
files call these and read like the papers' pseudo-code.
"""

from __future__ import annotations

import torch
from torch import Tensor

BASELINES = ("mean", "max", "rloo", "none")


def num_inference_calls(n: int, k: int, horizon: int) -> int:
    """Proposition 3.2 of paper 002: LLM calls for a full K-ary rollout tree of depth H.

    Every history node draws K joint actions (n calls each); a tree of depth H has
    K^0 + ... + K^(H-1) = (K^H - 1)/(K - 1) nodes, so N = n K (K^H - 1)/(K - 1) (= n H when K = 1).
    """
    if k == 1:
        return n * horizon
    return n * k * (k**horizon - 1) // (k - 1)


def discounted_returns(rewards: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma G_{t+1} along the last dimension (an episode's turns)."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        running = rewards[..., t] + gamma * running
        returns[..., t] = running
    return returns


def group_advantages(returns: Tensor, baseline: str = "mean", normalize_std: bool = False, eps: float = 1e-6) -> Tensor:
    """Group-relative advantages of K sibling samples (last dimension), paper 001 Eq. 1 / paper 002 Eq. 1.

    ``mean``  A_k = G_k - mean_j G_j                      (MAGRPO, GRPO)
    ``max``   A_k = G_k - max_j G_j                       (only the best sample is not pushed down)
    ``rloo``  A_k = G_k - mean_{j != k} G_j               (leave-one-out, unbiased)
    ``none``  A_k = G_k                                   (plain MA-REINFORCE, b = 0)

    With ``normalize_std`` the advantages are divided by the group's standard deviation (unbiased,
    as TRL's GRPO) plus ``eps``; a group of identical returns then has zero advantages.
    """
    if baseline == "mean":
        adv = returns - returns.mean(-1, keepdim=True)
    elif baseline == "max":
        adv = returns - returns.max(-1, keepdim=True).values
    elif baseline == "rloo":
        k = returns.shape[-1]
        if k < 2:
            raise ValueError("the rloo baseline needs at least 2 samples per group")
        adv = (returns - returns.mean(-1, keepdim=True)) * k / (k - 1)
    elif baseline == "none":
        adv = returns.clone()
    else:
        raise ValueError(f"unknown baseline {baseline!r}; valid: {', '.join(BASELINES)}")
    if normalize_std:
        adv = adv / (returns.std(-1, keepdim=True) + eps)
    return adv


def clipped_surrogate(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, clip: float) -> Tensor:
    """PPO's clipped objective per sample, as a loss to minimise.

    rho = exp(log pi - log pi_old); loss = -min(rho A, clip(rho, 1 - eps, 1 + eps) A).
    With ``clip = inf`` this is the unclipped importance-weighted policy gradient of paper 002 Eq. 1.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip)
    return -torch.minimum(ratio * advantages, clipped * advantages)


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token KL(pi || pi_ref) estimate of Schulman's k3: exp(d) - d - 1 with d = log pi_ref - log pi (>= 0)."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1
