"""Policy losses: PPO's clipped surrogate (CoLLM Eq. 1, MARFT, MAPoRL), its diagnostics, and the k3 KL penalty
(MAGRPO)."""

from __future__ import annotations

import torch
from torch import Tensor


def clipped_surrogate(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, clip: float) -> Tensor:
    """PPO's clipped objective per sample, as a loss to minimise.

    rho = exp(log pi - log pi_old); loss = -min(rho A, clip(rho, 1 - eps, 1 + eps) A).
    With ``clip = inf`` this is the unclipped importance-weighted policy gradient of CoLLM Eq. 1.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip)
    return -torch.minimum(ratio * advantages, clipped * advantages)


def ratio_stats(logprobs: Tensor, old_logprobs: Tensor, clip: float) -> dict[str, float]:
    """The PPO diagnostics of one minibatch, logged by every clipped-surrogate algorithm.

    With rho = exp(log pi - log pi_old) over the samples (sequences or tokens) of ``logprobs``:
    ``train/ratio`` = mean rho; ``train/clip_frac`` = the share of samples with |rho - 1| > ``clip``
    (the samples whose gradient the clip can cut); ``train/approx_kl`` = mean((rho - 1) - log rho),
    Schulman's k3 estimate of KL(pi_old || pi) from samples of pi_old (>= 0, 0 iff pi = pi_old on them).
    Gradients are not tracked.
    """
    log_ratio = (logprobs.detach() - old_logprobs.detach()).float()
    ratio = log_ratio.exp()
    return {
        "train/ratio": float(ratio.mean()),
        "train/clip_frac": float(((ratio - 1).abs() > clip).float().mean()),
        "train/approx_kl": float((ratio - 1 - log_ratio).mean()),
    }


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token KL(pi || pi_ref) estimate of Schulman's k3: exp(d) - d - 1 with d = log pi_ref - log pi (>= 0)."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1
