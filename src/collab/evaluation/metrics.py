"""Code-generation metrics as torchmetrics, syncable under DDP (all states are summed across processes).

``PassAtK``
    the unbiased pass@k estimator of the Codex paper ("Evaluating Large Language Models Trained on
    Code"): for a problem with ``n`` samples of which ``c`` pass, ``1 - C(n-c, k) / C(n, k)``, averaged
    over problems. This is the metric of CoLLM's Table 2 (pass@1/3/5/10 on CoopHumanEval).
``AccuracyAtK``
    the mean test pass rate of the best of k samples, averaged over problems (CoLLM evaluates coding
    by the average test pass rate).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from collab.envs.minecraft.scoring import voxel_iou

__all__ = ["PassAtK", "AccuracyAtK", "pass_at_k", "IoU", "MajorityVoteAccuracy"]


def pass_at_k(num_samples: Tensor, num_correct: Tensor, k: int) -> Tensor:
    """Per-problem unbiased pass@k, ``1 - C(n-c, k) / C(n, k)``, as float64.

    Computed stably as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` (no large binomials); it is exactly 1
    when ``n - c < k``. Raises ValueError if some ``n < k`` or ``c`` is outside ``[0, n]``.
    """
    n = torch.as_tensor(num_samples).reshape(-1).to(torch.int64)
    c = torch.as_tensor(num_correct, device=n.device).reshape(-1).to(torch.int64)
    if n.shape != c.shape:
        raise ValueError(f"num_samples {tuple(n.shape)} and num_correct {tuple(c.shape)} differ in shape")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if n.numel() and bool((n < k).any()):
        raise ValueError(f"pass@{k} needs at least k={k} samples per problem, got n={n.min().item()}")
    if n.numel() and bool(((c < 0) | (c > n)).any()):
        raise ValueError("num_correct must lie in [0, num_samples]")
    out = torch.ones(n.shape, dtype=torch.float64, device=n.device)
    for j in range(n.numel()):  # problems are few (one per prompt); exact per-problem products
        nj, cj = int(n[j]), int(c[j])
        if nj - cj >= k:
            i = torch.arange(nj - cj + 1, nj + 1, dtype=torch.float64, device=n.device)
            out[j] = 1.0 - torch.prod(1.0 - k / i)
    return out


class _MeanOverProblemsAtK(Metric):
    """Shared state of the @k metrics: a sum of per-problem values and a problem count, both summed
    across processes (DDP-syncable); ``compute`` is their ratio (0 before any update)."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, k: int, **kwargs):
        super().__init__(**kwargs)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k = k
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    def compute(self) -> Tensor:
        return self.total / self.count if self.count > 0 else torch.tensor(0.0, dtype=torch.float64)


class PassAtK(_MeanOverProblemsAtK):
    """Mean unbiased pass@k over problems (Codex paper estimator; CoLLM, Table 2).

    ``update(num_samples, num_correct)`` takes one entry per problem: how many samples were drawn and
    how many of them passed every test.
    """

    def update(self, num_samples: Tensor, num_correct: Tensor) -> None:
        est = pass_at_k(num_samples, num_correct, self.k).to(self.total.device)
        self.total += est.sum()
        self.count += est.numel()


class AccuracyAtK(_MeanOverProblemsAtK):
    """Mean over problems of the best test pass rate among a problem's first k samples.

    ``update(pass_rates)`` takes, per problem, a 1-D tensor with the test pass rate (in [0, 1]) of each
    of its samples in the order they were drawn. "Best of k" uses the first k samples drawn, so the
    value does not depend on samples beyond k; a problem with fewer than k samples uses all of them.
    """

    def update(self, pass_rates: Sequence[Tensor]) -> None:
        for rates in pass_rates:
            rates = torch.as_tensor(rates, dtype=torch.float64).reshape(-1)
            if rates.numel() == 0:
                raise ValueError("each problem needs at least one sample")
            self.total += rates[: self.k].max().to(self.total.device)
            self.count += 1


class IoU(Metric):
    """Mean over episodes of the voxel IoU of the built structure against the target
    (:func:`~collab.envs.minecraft.scoring.voxel_iou`;
    CoLLM, Table 1 reports it for HouseBuild, as a percentage).

    ``update(built, target)`` takes one episode's voxel grids (tensors of block ids, 0 = air, of the
    same shape), or two equally long sequences of them, one pair per episode. ``compute``: in [0, 1], 0 before any
    update.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, air: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.air = air
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, built: Tensor | Sequence[Tensor], target: Tensor | Sequence[Tensor]) -> None:
        pairs = [(built, target)] if isinstance(built, Tensor) else list(zip(built, target, strict=True))
        for b, t in pairs:
            self.total += voxel_iou(b, t, self.air).to(self.total.device)
            self.count += 1

    def compute(self) -> Tensor:
        return self.total / self.count if self.count > 0 else torch.tensor(0.0, dtype=torch.float64)


class MajorityVoteAccuracy(Metric):
    """Majority-vote accuracy of multi-agent answers, ties in expectation (MAPoRL, Section 4.1), averaged over problems.

    ``update(answers, correct)`` takes one row per problem: its agents' (normalised) answers at one turn (``None``:
    unparsable, no vote) and whether each is correct; each row is scored by :func:`collab.objectives.majority_vote`
    (``compute``: 0 before any update).
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]]) -> None:
        from collab.objectives import majority_vote

        if len(answers) != len(correct):
            raise ValueError(f"{len(answers)} rows of answers but {len(correct)} rows of correctness flags")
        for row_answers, row_correct in zip(answers, correct):
            self.total += majority_vote(list(row_answers), [bool(c) for c in row_correct])
            self.count += 1

    def compute(self) -> Tensor:
        return self.total / self.count if self.count > 0 else torch.tensor(0.0, dtype=torch.float64)
