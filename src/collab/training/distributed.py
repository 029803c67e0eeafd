"""Multi-process training (Lightning's DDP on gloo or NCCL): what makes every rank's update the same.

Each rank rolls out its own, disjoint share of the step's tasks (:class:`~collab.rollout.datamodule.RolloutDataModule`
shards the global batch by rank), so ranks hold different numbers of samples, of micro-batches and,
after filtering, possibly none at all. DDP all-reduces gradients inside ``backward`` and hangs or
fails when ranks disagree on how many backward passes they run or on which parameters receive
gradients. :func:`optimizer_step` makes one update safe whatever the data:

- every rank runs the same number of backward passes: the largest count over the ranks (one
  all-reduce); a rank with fewer parts runs zero-weight passes;
- every pass touches every trainable parameter (a zero-weight term), so DDP's reducer always sees
  all of them;
- gradients are synchronised only on the last pass (``no_sync`` before), once per optimizer step;
- each loss is multiplied by the world size, since DDP averages gradients over ranks, and the
  algorithms divide by global counts (:func:`global_sum`), so N ranks x B tasks give the gradient of
  1 rank x N*B tasks;
- when no rank has anything to learn, every rank skips the update together (no rank skips alone).

With one process every function here is the identity of the single-process code path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext

import torch
from torch import Tensor

from collab import preemption
from collab.policy import sharded


def world_size(module) -> int:
    """Number of training processes (1 outside a distributed run or a Trainer)."""
    trainer = getattr(module, "_trainer", None)
    return int(trainer.world_size) if trainer is not None else 1


def global_sum(module, values: Tensor | float | Sequence[float]) -> Tensor:
    """``values`` summed over the ranks (a float64 CPU tensor; a copy, never the input)."""
    t = torch.as_tensor(values, dtype=torch.float64).clone()
    if world_size(module) > 1:
        sharded.settle()  # a sharded base: serve the others' gathers first (collab.policy.sharded)
        t = module.trainer.strategy.reduce(t, reduce_op="sum")
    return t


def global_max(module, value: int) -> int:
    """The largest ``value`` over the ranks."""
    if world_size(module) == 1:
        return int(value)
    t = torch.tensor([float(value)], dtype=torch.float64)
    sharded.settle()
    return int(module.trainer.strategy.reduce(t, reduce_op="max").item())


def global_normalize(module, advantages: Tensor, eps: float = 1e-8) -> Tensor:
    """PPO's advantage normalisation with the mean and unbiased std of all ranks' advantages
    (``objectives.normalize`` of the union of the ranks' values; exactly it with one process)."""
    if world_size(module) == 1:
        from collab.objectives import normalize

        return normalize(advantages, eps)
    stats = global_sum(module, [float(advantages.sum()), float((advantages.double() ** 2).sum()), advantages.numel()])
    total, squares, n = stats.tolist()
    if n < 1:
        return advantages
    mean = total / n
    centered = advantages - mean
    if n < 2:
        return centered
    var = max(squares - n * mean * mean, 0.0) / (n - 1)
    return centered / (var ** 0.5 + eps)


def global_count(module, n: int | float) -> float:
    """``n`` summed over the ranks, as a float (a count of items or tokens of every rank's minibatch)."""
    return float(global_sum(module, n)) if world_size(module) > 1 else float(n)


def global_mean(module, value: float, count: int) -> float:
    """The mean over every rank's items of a per-rank mean ``value`` over ``count`` items."""
    if world_size(module) == 1:
        return value
    total, n = global_sum(module, [value * count, count]).tolist()
    return total / n if n else 0.0


def normalize_pieces(module, pieces: Sequence[Tensor]) -> list[Tensor]:
    """:func:`global_normalize` of the pieces' concatenation (every rank's minibatch), split back into pieces."""
    flat = global_normalize(module, torch.cat(list(pieces)) if pieces else torch.zeros(0))
    return list(torch.split(flat, [len(p) for p in pieces]))


def minibatch_schedule(module, minibatches: list) -> list[list]:
    """``minibatches`` padded with empty minibatches to the most updates any rank has: every rank then takes
    the same number of optimizer steps. With one process: ``minibatches`` as they are. (Each minibatch's
    global normalisers are the algorithm's ``normalizers``.)"""
    steps = global_max(module, len(minibatches))
    return list(minibatches) + [[] for _ in range(steps - len(minibatches))]


def global_means(module, stats: dict[str, float]) -> dict[str, float]:
    """Each scalar's mean over the ranks that have it (ranks may log different keys: a turn no episode of
    a rank reached); the same dict on every rank. One process: ``stats`` as it is."""
    if world_size(module) == 1:
        return dict(stats)
    import torch.distributed as dist

    keys: list[list[str]] = [[] for _ in range(world_size(module))]
    sharded.settle()
    dist.all_gather_object(keys, sorted(stats))
    union = sorted(set().union(*keys))
    sums = global_sum(module, [[float(stats[k]), 1.0] if k in stats else [0.0, 0.0] for k in union])
    return {k: float(s / c) for k, (s, c) in zip(union, sums.tolist()) if c}


def _touch(module) -> Tensor:
    """0 x every trainable parameter: a term that gives each one a (zero) gradient."""
    params = [p for p in module.parameters() if p.requires_grad]
    return sum((p.sum() * 0.0 for p in params), torch.zeros((), device=params[0].device if params else "cpu"))


def optimizer_step(module, parts: Sequence[Callable[[], Tensor]], accept: Callable[[], bool] | None = None) -> bool:
    """One optimizer step of ``module`` on the sum of ``parts`` (each a callable returning one micro-batch's
    loss, already divided by the global normaliser), one backward pass each: the same number of passes
    and of steps on every rank, with one gradient synchronisation (see the module docstring).

    ``accept`` (called on every rank after the backward passes, before the step; it may run collectives)
    can refuse the update: the gradients are dropped and ``False`` returned (MARFT's ``target_kl``)."""
    world = world_size(module)
    opt = module.optimizers()
    n = global_max(module, len(parts))
    if n == 0:  # nothing to learn anywhere: every rank takes the same empty step
        module.skip_update()
        return True
    opt.zero_grad()
    strategy = module.trainer.strategy if world > 1 else None
    shards = sharded.active()
    for j in range(n):
        preemption.check()  # a SIGTERM stops inside an update (collab.preemption): nothing is saved then
        loss = parts[j]() if j < len(parts) else None
        if world > 1:
            loss = _touch(module) + (loss if loss is not None else 0.0)
            sync = nullcontext() if j == n - 1 and shards is None else strategy.block_backward_sync()
            with sync:
                module.manual_backward(loss * world)
        elif loss is not None:
            module.manual_backward(loss)
    if shards is not None:  # a sharded base: the ranks' backward passes gather layers in rounds of their own, so the
        average_gradients(module)  # gradients are averaged after them, not inside DDP's backward (it could wait there)
    if accept is not None and not accept():
        opt.zero_grad()
        return False
    preemption.check()
    module.optimizer_step()
    return True


def average_gradients(module) -> None:
    """DDP's gradient average, as one all-reduce after the backward passes (a sharded base: every rank settled
    first): each trainable gradient divided by the world size, then summed over the ranks."""
    import torch.distributed as dist

    sharded.settle()
    params = [p for p in module.parameters() if p.requires_grad and p.grad is not None]
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params]) / world_size(module)
    dist.all_reduce(flat)
    for p, g in zip(params, torch.split(flat, [p.numel() for p in params])):
        p.grad.copy_(g.view_as(p.grad))


# -- timeouts: a collective that goes wrong ends in one line, never a hang (issue 31) -------------------
DEFAULT_TIMEOUT_S = 1800.0
"""Seconds a process waits in a collective for the others (``--distributed_timeout``): long enough for one
rank's long rollout (or evaluation) while the others wait at the step's first collective."""

_FAILURES = ("timed out", "connection closed by peer", "connection reset by peer", "collective mismatch",
             "op.preamble", "gloo/", "nccl")  # the backends' messages (gloo's name its source file)


START_TIMEOUT_S = 600.0
"""Seconds the processes wait for each other to start (the rendezvous) at least: importing torch and
building the run on a busy node is no collective hang, so a short ``--distributed_timeout`` does not apply to it."""


def set_timeout(strategy, seconds: float) -> None:
    """The process group's timeout (Lightning's ``DDPStrategy(timeout=...)``, also FSDP's) before the group is
    created: ``seconds``, at least :data:`START_TIMEOUT_S` for the start; :func:`timeout_callback` sets the
    collectives' own to ``seconds`` once the group exists. A strategy without a process group is left as it is."""
    from datetime import timedelta

    if seconds is None or not 0 < seconds < float("inf"):
        from collab.errors import UserError

        raise UserError(f"--distributed_timeout must be a number of seconds > 0, got {seconds}")
    if hasattr(strategy, "_timeout"):
        strategy._timeout = timedelta(seconds=max(float(seconds), START_TIMEOUT_S))


def collective_failure(error: BaseException) -> bool:
    """Whether ``error`` is a backend's report of a collective that did not complete (gloo: "Timed out
    waiting ... ms", "Connection closed by peer"; torch's ``DistError``s)."""
    import torch.distributed as dist

    kinds = tuple(k for k in (getattr(dist, "DistError", None),) if k is not None)
    text = str(error).lower()
    return isinstance(error, kinds) or (isinstance(error, RuntimeError) and any(f in text for f in _FAILURES))


def failure_line(rank: int, step: int, timeout_s: float, error: BaseException) -> str:
    """``rank 1 at step 3: a collective did not complete within 60 s (...)``: one line."""
    text = " ".join(str(error).split())
    peer_gone = any(f in text.lower() for f in ("closed by peer", "reset by peer"))
    what = ("a collective failed: another process ended (see its error above)" if peer_gone else
            f"a collective did not complete within {timeout_s:g} s (another process stopped or diverged)")
    return (f"rank {rank} at step {step}: {what}; a rank that legitimately takes longer (a long rollout) needs "
            f"a larger --distributed_timeout SECONDS (docs/distributed.md). Backend: {text[:200]}")


def timeout_callback(timeout_s: float):
    """A Lightning callback that turns a collective's failure on this rank into :func:`failure_line` on stderr
    and exit code 1, after stopping the processes this one launched (a rank stalled in a collective
    ignores SIGTERM): the run ends at the timeout instead of hanging in the teardown's collectives."""
    from lightning.pytorch import Callback

    class CollectiveTimeout(Callback):
        def setup(self, trainer, pl_module, stage) -> None:  # the group exists: its collectives' timeout
            import torch.distributed as dist
            from datetime import timedelta

            if dist.is_available() and dist.is_initialized() and hasattr(dist.distributed_c10d, "_set_pg_timeout"):
                dist.distributed_c10d._set_pg_timeout(timedelta(seconds=float(timeout_s)))

        def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
            import signal
            import sys

            if trainer.world_size < 2 or not collective_failure(exception):
                return
            print(f"error: {failure_line(trainer.global_rank, trainer.global_step, timeout_s, exception)}",
                  file=sys.stderr, flush=True)
            for logger in trainer.loggers:
                logger.finalize("failed")
            launcher = getattr(trainer.strategy, "launcher", None)
            if getattr(launcher, "procs", None):
                launcher.kill(signal.SIGKILL)
            raise SystemExit(1)

    return CollectiveTimeout()


def prepare_processes(trainer, module, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Before ``trainer.fit`` starts the processes: refuse more than the machine holds
    (:mod:`collab.training.checks_resources`), set the process group's timeout, and make a failed
    collective one line (:func:`timeout_callback`)."""
    from collab.training.checks_resources import check_launch

    check_launch(trainer, module.base, [spec.base for spec in module.agent_specs] if module.agent_specs else 2)
    set_timeout(trainer.strategy, timeout_s)
    trainer.callbacks.insert(0, timeout_callback(timeout_s))
