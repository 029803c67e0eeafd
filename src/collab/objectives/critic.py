"""Critic losses: the squared (or clipped, or Huber) value loss of CoLLM and MARFT, and the critic's explained
variance."""

from __future__ import annotations

import torch
from torch import Tensor


def value_loss(
    values: Tensor,
    targets: Tensor,
    old_values: Tensor | None = None,
    clip: float | None = None,
    huber_delta: float | None = None,
) -> Tensor:
    """Critic loss mean_t (y_t - V(h_t))^2 of CoLLM Eqs. 3/5 (CoLLM-DC/CC) and MARFT Alg. 1 line 15.

    The papers' plain squared error, no 0.5 factor (that is only a learning-rate scale); the mean over samples is
    Alg. 1's (1/|beta|) sum_b. ``targets`` are constants (detached here: semi-gradient TD, as the papers' updates).
    Given ``old_values`` and ``clip`` (PPO/IPPO value clipping), with V_clip = V_old + clip(V - V_old, -eps, eps):

        loss = mean max((V - y)^2, (V_clip - y)^2)

    ``huber_delta`` replaces the square e^2 by the Huber loss 2 H_delta(e) (H = e^2/2 for |e| <= delta, else
    delta (|e| - delta/2)): the same as the square for small errors, linear beyond delta.
    """
    targets = targets.detach()

    def err(v: Tensor) -> Tensor:
        e = v - targets
        if huber_delta is None:
            return e**2
        return 2 * torch.nn.functional.huber_loss(v, targets, reduction="none", delta=huber_delta)

    loss = err(values)
    if (old_values is None) != (clip is None):
        raise ValueError("value clipping needs both old_values and clip")
    if old_values is not None:
        old_values = old_values.detach()
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        loss = torch.maximum(loss, err(clipped))
    return loss.mean()


def explained_variance(values: Tensor, returns: Tensor) -> float:
    """1 - Var[returns - values] / Var[returns]: how much of the returns' variance the critic's values
    explain (1: perfect, 0: no better than a constant, < 0: worse). Constant returns have no variance to
    explain: 0.0 then (a number, not NaN, so that every process logs the same keys and finite means)."""
    values, returns = values.detach().float().reshape(-1), returns.detach().float().reshape(-1)
    var = returns.var(unbiased=False)
    if values.numel() == 0 or float(var) == 0.0:
        return 0.0
    return float(1.0 - (returns - values).var(unbiased=False) / var)
