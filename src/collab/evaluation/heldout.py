"""Evaluation: play ``num_samples`` independent episodes per task and aggregate them with torchmetrics.

Every episode is a full (possibly multi-turn) rollout with the team's sampling settings; at the first
turn the ``num_samples`` episodes of a task share one prompt (one prefill, ``n`` samples), later turns
continue each episode on its own history. What counts is the episode's last step:

``eval/return``, ``eval/env/<key>`` (each info value), ``eval/pass@k`` / ``eval/acc@k`` (envs reporting
``solved`` / ``pass_rate``; CoLLM Table 2), ``eval/iou`` (envs with ``voxels(state)``; CoLLM Table 1) and
``eval/majority@t`` (envs with ``votes(state)``; MAPoRL 4.1): docs/evaluation.md, metrics in
:mod:`collab.evaluation.metrics`.

Under DDP each process plays a share of fixed batches of tasks (:func:`play_records`; the batch is
the unit of seeding), every task's :class:`TaskRecord` is gathered to every process and every process
computes the metrics over all tasks, each scored once, without a collective: the same figures at any
world size.

Per-problem scores (:func:`task_scores`) and :class:`MeanSE` give the before/after figures of
:class:`~collab.training.callbacks.EvaluationCallback`: the SE of a mean is ``s / sqrt(n)`` over the
per-problem scores (sample SD, n - 1), the gain's SE that of the paired differences; one task has no SE (nan,
which :func:`format_se` explains).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torchmetrics import MeanMetric, Metric

from collab import preemption
from collab.envs.base import Env
from collab.errors import require
from collab.evaluation.metrics import AccuracyAtK, IoU, MajorityVoteAccuracy, PassAtK
from collab.rollout.episodes import Episode, play

DEFAULT_KS = (1, 3, 5, 10)


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def batches(n_tasks: int, tasks_per_batch: int | None) -> list[range]:
    """The eval tasks cut into fixed batches of ``tasks_per_batch`` consecutive tasks (None: one batch)."""
    size = tasks_per_batch or max(n_tasks, 1)
    return [range(start, min(start + size, n_tasks)) for start in range(0, n_tasks, size)]


def batch_seed(seed: int, batch: int) -> int:
    """The seed batch ``batch`` is decoded with: a function of (seed, batch) only, not of the rank."""
    return (int(seed) * 1_000_003 + batch) % (2**63 - 1)


@dataclass
class TaskRecord:
    """What the metrics need of one task's episodes (plain data: it is gathered across processes)."""

    task: int
    """The task's index in the eval split."""
    returns: list[float]
    infos: list[dict[str, float]]
    """Each episode's env info at its last step."""
    ious: list[float] = field(default_factory=list)
    votes: list[tuple] = field(default_factory=list)
    """Each episode's ``(answers[t][a], correct[t][a])`` (envs exposing ``votes``)."""


def _record(task: int, eps: Sequence[Episode], env: Env) -> TaskRecord:
    voxels, votes = getattr(env, "voxels", None), getattr(env, "votes", None)
    ious = []
    if callable(voxels):
        for ep in eps:
            if ep.state is not None:
                one = IoU(sync_on_compute=False)
                one.update(*voxels(ep.state))
                ious.append(float(one.compute()))
    return TaskRecord(
        task,
        [float(ep.return_) for ep in eps],
        [{k: float(v) for k, v in ep.info.items()} for ep in eps],
        ious,
        [votes(ep.state) for ep in eps if ep.state is not None] if callable(votes) else [],
    )


def gather_records(records: Sequence[TaskRecord]) -> list[TaskRecord]:
    """Every process's records on every process (``all_gather_object``), ordered by task index."""
    rank, world = _world()
    if world > 1:
        from collab.runtime import lockstep

        parts: list = [None] * world
        lockstep.settle()  # sharded models: every rank's decoding done (collab.runtime.lockstep)
        torch.distributed.all_gather_object(parts, list(records))
        records = [r for part in parts for r in part]
    return sorted(records, key=lambda r: r.task)


def play_records(
    team,
    env: Env,
    tasks: Sequence[Mapping],
    num_samples: int,
    max_new_tokens: int = 128,
    tasks_per_batch: int | None = 4,
    dependency=None,
    seed: int | None = None,
    device: torch.device | str = "cpu",
) -> tuple[list[TaskRecord], list[list[Episode]]]:
    """Play this process's batches and gather every task's :class:`TaskRecord` (all tasks, in order)
    and this process's episodes.

    The batch of ``tasks_per_batch`` consecutive tasks is the unit of work and of seeding: process r
    plays batches b with ``b % world_size == r``, and with a ``seed`` batch b is decoded under
    ``torch.manual_seed(batch_seed(seed, b))`` in a forked random stream, so it gets the same rows,
    padding and draws whichever process plays it and whatever the world size: the figures are the
    same at any world size. With ``seed=None`` a sampled evaluation draws from the caller's (the
    training's) random stream and is not reproducible across world sizes; greedy decoding is.
    """
    rank, world = _world()
    devices = [device] if torch.device(device).type == "cuda" else []
    records, episodes = [], []
    for b, span in enumerate(batches(len(tasks), tasks_per_batch)):
        if b % world != rank:
            continue
        preemption.check("evaluation")
        with contextlib.ExitStack() as stack:
            if seed is not None:
                stack.enter_context(torch.random.fork_rng(devices=devices))
                torch.manual_seed(batch_seed(seed, b))
            played = play(team, env, [tasks[i] for i in span], num_samples, max_new_tokens, None, dependency)
        for i, eps in zip(span, played):
            for ep in eps:
                ep.task = i
            records.append(_record(i, eps, env))
            episodes.append(eps)
    return gather_records(records), episodes


def record_metrics(
    records: Sequence[TaskRecord],
    ks: Sequence[int],
    num_samples: int,
    env: Env | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """The metrics of the module docstring over all ``records`` (every task, each once), computed on this
    process alone (no collective: every process gets the same figures from the same records)."""
    local = {"sync_on_compute": False, "dist_sync_on_step": False}
    returns = MeanMetric(**local).to(device)
    info_means: dict[str, MeanMetric] = {}
    pass_k = {k: PassAtK(k, **local).to(device) for k in ks}
    acc_k = {k: AccuracyAtK(k, **local).to(device) for k in ks}
    iou = MeanMetric(**local).to(device)
    majority: dict[int, MajorityVoteAccuracy] = {}
    solved = rated = False
    for rec in records:
        for value in rec.returns:
            returns.update(value)
        for info in rec.infos:
            for key, value in info.items():
                info_means.setdefault(key, MeanMetric(**local).to(device)).update(value)
        for value in rec.ious:
            iou.update(value)
        for answers_t, correct_t in rec.votes:
            for t, (answers, correct) in enumerate(zip(answers_t, correct_t)):
                majority.setdefault(t + 1, MajorityVoteAccuracy(**local).to(device)).update([answers], [correct])
        if rec.infos and all("solved" in info for info in rec.infos):
            solved = True
            n_correct = torch.tensor([sum(int(info["solved"] > 0.5) for info in rec.infos)])
            for k in ks:
                pass_k[k].update(torch.tensor([len(rec.infos)]), n_correct)
        if rec.infos and all("pass_rate" in info for info in rec.infos):
            rated = True
            for k in ks:
                acc_k[k].update([torch.tensor([info["pass_rate"] for info in rec.infos])])
    played = any(rec.returns for rec in records)
    metrics = {
        "eval/return": float(returns.compute()) if played else float("nan"),
        "eval/problems": float(len(records)),
        "eval/samples": float(num_samples),
    }
    metrics.update({f"eval/env/{key}": float(m.compute()) for key, m in sorted(info_means.items())})
    if solved:
        metrics.update({f"eval/pass@{k}": float(pass_k[k].compute()) for k in ks})
    if rated:
        metrics.update({f"eval/acc@{k}": float(acc_k[k].compute()) for k in ks})
    if env is not None and callable(getattr(env, "voxels", None)):
        metrics["eval/iou"] = float(iou.compute()) if any(rec.ious for rec in records) else 0.0
    metrics.update({f"eval/majority@{t}": float(m.compute()) for t, m in sorted(majority.items())})
    return metrics


def evaluate_records(
    team,
    env: Env,
    tasks: Sequence[Mapping],
    num_samples: int = 10,
    ks: Sequence[int] = DEFAULT_KS,
    max_new_tokens: int = 128,
    device: torch.device | str = "cpu",
    tasks_per_batch: int | None = 4,
    dependency=None,
    seed: int | None = None,
) -> tuple[dict[str, float], list[TaskRecord], list[list[Episode]]]:
    """:func:`evaluate`, also returning every task's record (all processes', in task order)."""
    ks = sorted({int(k) for k in ks if int(k) <= num_samples})
    require(len(ks) > 0, f"no k <= num_samples ({num_samples}); give num_samples >= the smallest k")
    records, episodes = play_records(
        team, env, tasks, num_samples, max_new_tokens, tasks_per_batch, dependency, seed, device
    )
    return record_metrics(records, ks, num_samples, env, device), records, episodes


def evaluate(
    team,
    env: Env,
    tasks: Sequence[Mapping],
    num_samples: int = 10,
    ks: Sequence[int] = DEFAULT_KS,
    max_new_tokens: int = 128,
    device: torch.device | str = "cpu",
    tasks_per_batch: int | None = 4,
    dependency=None,
    seed: int | None = None,
) -> tuple[dict[str, float], list[list[Episode]]]:
    """The metrics of ``num_samples`` episodes per task over all tasks (see the module docstring and
    :func:`play_records`) and this process's episodes (``ep.task``: the task's index in ``tasks``)."""
    metrics, _, episodes = evaluate_records(
        team, env, tasks, num_samples, ks, max_new_tokens, device, tasks_per_batch, dependency, seed
    )
    return metrics, episodes


class MeanSE(Metric):
    """Mean and standard error of per-problem scores: ``compute() -> (mean, se)``.

    ``se = s / sqrt(n)``, ``s`` the sample standard deviation (ddof 1); the states (n, sum, sum of
    squares) are summed across processes unless built with ``sync_on_compute=False`` (as
    :func:`mean_se` does: its scores are already every process's). ``se`` is nan below two scores.
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
    """``(mean, se)`` of per-problem scores, all of them (no collective: under DDP every process passes
    every task's score, :func:`play_records`); ``se`` is nan below two scores (:func:`format_se`)."""
    metric = MeanSE(sync_on_compute=False, dist_sync_on_step=False).to(device)
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


def record_score_key(records: Sequence[TaskRecord]) -> str:
    """:func:`score_key` over gathered records."""
    infos = [info for rec in records for info in rec.infos]
    return "solved" if infos and all("solved" in info for info in infos) else "return"


def record_scores(records: Sequence[TaskRecord], key: str = "return") -> list[float]:
    """:func:`task_scores` over gathered records: each task's score, in the records' (task) order."""

    def one(rec: TaskRecord, i: int) -> float:
        if key == "return":
            return rec.returns[i]
        value = rec.infos[i][key]
        return float(value > 0.5) if key == "solved" else float(value)

    return [sum(one(rec, i) for i in range(len(rec.returns))) / len(rec.returns) for rec in records if rec.returns]


def format_se(mean: float, se: float | None, problems: int) -> str:
    """``mean ± se``, or the mean alone with why there is no standard error (fewer than two problems)."""
    if se is None or not math.isfinite(se):
        return f"{mean:.4f} ({problems} eval problem{'' if problems == 1 else 's'}: no standard error)"
    return f"{mean:.4f} ± {se:.4f}"


def format_metrics(metrics: Mapping[str, float]) -> str:
    """A short human-readable summary: pass@k / acc@k / majority@t rows, the return (and IoU) and the scheme
    distribution."""
    lines = []
    for prefix in ("pass@", "acc@", "majority@"):
        row = [f"{key.removeprefix('eval/')} {v:.4f}" for key, v in metrics.items() if key.startswith("eval/" + prefix)]
        if row:
            lines.append("  ".join(row))
    lines.append(
        f"return {metrics.get('eval/return', float('nan')):.4f}"
        + (f"  iou {metrics['eval/iou']:.4f}" if "eval/iou" in metrics else "")
    )
    schemes = {
        key.removeprefix("eval/env/scheme/"): v for key, v in metrics.items() if key.startswith("eval/env/scheme/")
    }
    if schemes:
        lines.append("schemes: " + "  ".join(f"{name} {v:.2f}" for name, v in schemes.items()))
    return "\n".join(lines)
