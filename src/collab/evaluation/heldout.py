"""Evaluation: play ``num_samples`` independent episodes per task and aggregate them with torchmetrics.

Every episode is a full (possibly multi-turn) rollout with the team's sampling settings; at the first
turn the ``num_samples`` episodes of a task share one prompt (one prefill, ``n`` samples), later turns
continue each episode on its own history. What counts is the episode's last step:

- ``eval/return``: the mean undiscounted return of an episode;
- ``eval/env/<key>``: the mean of each env info value at the last step (reward components, the
  cooperation-scheme one-hots ``scheme/<name>`` of the coding env, ...);
- for environments reporting ``solved`` (coding, math, competitive coding): ``eval/pass@k`` (unbiased
  estimator, :class:`~collab.evaluation.metrics.PassAtK`; pass@1 is a math team's accuracy) and, where they also
  report ``pass_rate``, ``eval/acc@k`` (:class:`~collab.evaluation.metrics.AccuracyAtK`) for every
  ``k <= num_samples``, as in CoLLM's Table 2;
- for environments exposing an episode's voxels (``env.voxels(state) -> (built, target)``, the
  Minecraft HouseBuild env): ``eval/iou``, the mean voxel IoU of the episodes' final worlds
  (:class:`~collab.evaluation.metrics.IoU`; CoLLM, Table 1);
- for environments exposing each turn's votes (``env.votes(state) -> (answers[t][a], correct[t][a])``,
  the debate env): ``eval/majority@t`` for every turn t (1-based), the accuracy of the agents'
  majority vote at that turn with ties scored in expectation
  (:class:`~collab.evaluation.metrics.MajorityVoteAccuracy`; MAPoRL, Section 4.1).

Under DDP each process plays a shard of the tasks (``rank::world_size``); the metrics' states are
summed across processes when computed.

Per-problem scores (:func:`task_scores`: each task's mean ``solved`` or return over its samples) and
:class:`MeanSE` (their mean and standard error, reduced across processes the same way) give the
held-out figures of :class:`~collab.training.callbacks.EvaluationCallback`'s before/after comparison: the SE of
a mean is the per-problem one, ``s / sqrt(n)`` with ``s`` the sample standard deviation (n - 1) of the
per-problem scores (for 0/1 scores ``sqrt(p (1 - p) / (n - 1))``), and the gain's SE is that of the
paired per-problem differences after - before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import math

import torch
from torchmetrics import MeanMetric, Metric

from collab.envs.base import Env
from collab.errors import require
from collab.evaluation.metrics import AccuracyAtK, IoU, MajorityVoteAccuracy, PassAtK
from collab.rollout.episodes import Episode, play

DEFAULT_KS = (1, 3, 5, 10)


def _shard(tasks: Sequence[Mapping]) -> list[Mapping]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        return list(tasks)[rank::world]
    return list(tasks)


def evaluate(team, env: Env, tasks: Sequence[Mapping], num_samples: int = 10, ks: Sequence[int] = DEFAULT_KS,
             max_new_tokens: int = 128, device: torch.device | str = "cpu",
             tasks_per_batch: int | None = 4, dependency=None) -> tuple[dict[str, float], list[list[Episode]]]:
    """The metrics of ``num_samples`` episodes per task (see the module docstring) and the episodes."""
    ks = sorted({int(k) for k in ks if int(k) <= num_samples})
    require(len(ks) > 0, f"no k <= num_samples ({num_samples}); give num_samples >= the smallest k")
    episodes = play(team, env, _shard(tasks), num_samples, max_new_tokens, tasks_per_batch, dependency) if tasks else []
    returns = MeanMetric().to(device)
    info_means: dict[str, MeanMetric] = {}
    pass_k = {k: PassAtK(k).to(device) for k in ks}
    acc_k = {k: AccuracyAtK(k).to(device) for k in ks}
    voxels = getattr(env, "voxels", None)  # decided per env, so every DDP process computes the same metrics
    iou = IoU().to(device) if callable(voxels) else None
    votes = getattr(env, "votes", None)
    majority: dict[int, MajorityVoteAccuracy] = {}
    solved = rated = False
    for eps in episodes:
        for ep in eps:
            returns.update(ep.return_)
            for key, value in ep.info.items():
                info_means.setdefault(key, MeanMetric().to(device)).update(float(value))
            if iou is not None and ep.state is not None:
                iou.update(*voxels(ep.state))
            if callable(votes) and ep.state is not None:
                for t, (answers, correct) in enumerate(zip(*votes(ep.state))):
                    majority.setdefault(t + 1, MajorityVoteAccuracy().to(device)).update([answers], [correct])
        if eps and all("solved" in ep.info for ep in eps):
            solved = True
            n_correct = torch.tensor([sum(int(ep.info["solved"] > 0.5) for ep in eps)])
            for k in ks:
                pass_k[k].update(torch.tensor([len(eps)]), n_correct)
        if eps and all("pass_rate" in ep.info for ep in eps):
            rated = True
            for k in ks:
                acc_k[k].update([torch.tensor([ep.info["pass_rate"] for ep in eps])])
    metrics = {"eval/return": float(returns.compute()) if episodes else float("nan"),
               "eval/problems": float(len(tasks)), "eval/samples": float(num_samples)}
    metrics.update({f"eval/env/{key}": float(m.compute()) for key, m in sorted(info_means.items())})
    if solved:
        metrics.update({f"eval/pass@{k}": float(pass_k[k].compute()) for k in ks})
    if rated:
        metrics.update({f"eval/acc@{k}": float(acc_k[k].compute()) for k in ks})
    if iou is not None:
        metrics["eval/iou"] = float(iou.compute())
    metrics.update({f"eval/majority@{t}": float(m.compute()) for t, m in sorted(majority.items())})
    return metrics, episodes


class MeanSE(Metric):
    """Mean and standard error of per-problem scores: ``compute() -> (mean, se)``.

    ``se = s / sqrt(n)``, ``s`` the sample standard deviation (ddof 1); the states (n, sum, sum of
    squares) are summed across processes, so every DDP rank gets the figures of all shards. ``se`` is
    nan below two scores.
    """

    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        for name in ("n", "total", "squares"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores) -> None:
        x = torch.as_tensor(scores, dtype=torch.float64, device=self.n.device).flatten()
        self.n += x.numel()
        self.total += x.sum()
        self.squares += (x * x).sum()

    def compute(self) -> tuple[float, float]:
        n = float(self.n)
        if n == 0:
            return float("nan"), float("nan")
        mean = float(self.total) / n
        if n < 2:
            return mean, float("nan")
        var = max(float(self.squares) - n * mean * mean, 0.0) / (n - 1)
        return mean, math.sqrt(var / n)


def mean_se(scores: Sequence[float], device: torch.device | str = "cpu") -> tuple[float, float]:
    """``(mean, se)`` of per-problem scores (this process's shard, reduced over DDP processes)."""
    metric = MeanSE().to(device)
    metric.update(list(scores))
    return metric.compute()


def score_key(episodes: Sequence[Sequence[Episode]]) -> str:
    """``solved`` when every episode reports it (accuracy: math, coding), else ``return``."""
    eps = [ep for group in episodes for ep in group]
    return "solved" if eps and all("solved" in ep.info for ep in eps) else "return"


def task_scores(episodes: Sequence[Sequence[Episode]], key: str = "return") -> list[float]:
    """Each task's score: the mean over its episodes of the return (``key="return"``), or of an env
    info value at the last step (``"solved"``: 1 when solved, else 0)."""
    def one(ep: Episode) -> float:
        if key == "return":
            return float(ep.return_)
        return float(ep.info[key] > 0.5) if key == "solved" else float(ep.info[key])

    return [sum(one(ep) for ep in eps) / len(eps) for eps in episodes if eps]


def format_metrics(metrics: Mapping[str, float]) -> str:
    """A short human-readable summary: pass@k / acc@k / majority@t rows, the return (and IoU) and the scheme distribution."""
    lines = []
    for prefix in ("pass@", "acc@", "majority@"):
        row = [f"{key.removeprefix('eval/')} {v:.4f}" for key, v in metrics.items() if key.startswith("eval/" + prefix)]
        if row:
            lines.append("  ".join(row))
    lines.append(f"return {metrics.get('eval/return', float('nan')):.4f}"
                 + (f"  iou {metrics['eval/iou']:.4f}" if "eval/iou" in metrics else ""))
    schemes = {key.removeprefix("eval/env/scheme/"): v for key, v in metrics.items() if key.startswith("eval/env/scheme/")}
    if schemes:
        lines.append("schemes: " + "  ".join(f"{name} {v:.2f}" for name, v in schemes.items()))
    return "\n".join(lines)
