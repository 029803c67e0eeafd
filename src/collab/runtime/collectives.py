"""Collectives of a multi-process run (Lightning's DDP on gloo or NCCL): what makes every rank's update the same.

Each rank rolls out its own, disjoint share of the step's tasks (:class:`~collab.rollout.datamodule.RolloutDataModule`
shards the global batch by rank), so ranks hold different numbers of samples, of micro-batches and,
after filtering, possibly none at all. DDP all-reduces gradients inside ``backward`` and hangs or
fails when ranks disagree on how many backward passes they run or on which parameters receive
gradients. :func:`backward_passes` makes one update's backward passes safe whatever the data:

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
from collab.runtime import lockstep


def world_size(module) -> int:
    """Number of training processes (1 outside a distributed run or a Trainer)."""
    trainer = getattr(module, "_trainer", None)
    return int(trainer.world_size) if trainer is not None else 1


def global_sum(module, values: Tensor | float | Sequence[float]) -> Tensor:
    """``values`` summed over the ranks (a float64 CPU tensor; a copy, never the input)."""
    t = torch.as_tensor(values, dtype=torch.float64).clone()
    if world_size(module) > 1:
        lockstep.settle()  # sharded models: serve the others' forwards first (collab.runtime.lockstep)
        t = module.trainer.strategy.reduce(t, reduce_op="sum")
    return t


def global_max(module, value: int) -> int:
    """The largest ``value`` over the ranks."""
    if world_size(module) == 1:
        return int(value)
    t = torch.tensor([float(value)], dtype=torch.float64)
    lockstep.settle()
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
    return centered / (var**0.5 + eps)


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
    lockstep.settle()
    dist.all_gather_object(keys, sorted(stats))
    union = sorted(set().union(*keys))
    sums = global_sum(module, [[float(stats[k]), 1.0] if k in stats else [0.0, 0.0] for k in union])
    return {k: float(s / c) for k, (s, c) in zip(union, sums.tolist()) if c}


def _touch(module) -> Tensor:
    """0 x every trainable parameter: a term that gives each one a (zero) gradient."""
    params = [p for p in module.parameters() if p.requires_grad]
    return sum((p.sum() * 0.0 for p in params), torch.zeros((), device=params[0].device if params else "cpu"))


def backward_passes(
    module, passes: Sequence[Callable[[], Tensor]], after_backward: Callable[[], object] | None = None
) -> bool:
    """The backward pass of each of ``passes`` (a callable returning one term's loss, already divided by the global
    normaliser: :meth:`collab.algos.base.CollabModule.update`), accumulated into the gradients: the same number of
    passes on every rank, with one gradient synchronisation (see the module docstring). ``after_backward`` runs after
    each pass (the update's heap check, :func:`collab.runtime.memory.release_above`). False: no rank had any pass
    (nothing was run; the ranks take an empty step together)."""
    world = world_size(module)
    n = global_max(module, len(passes))
    strategy = module.trainer.strategy if world > 1 else None
    step = lockstep.active()
    for j in range(n):
        preemption.check()  # a SIGTERM stops inside an update (collab.preemption): nothing of this step is saved
        loss = passes[j]() if j < len(passes) else None
        if step is not None:  # FSDP2: the others' forwards served, the stand-ins' zero terms in this pass's backward
            step.settle()
            extra = step.take_pending()
            if extra is not None:
                loss = extra if loss is None else loss + extra
            # every rank gathers and reduce-scatters the pass's sharded models in one order, backward or not
            if loss is not None and loss.requires_grad:
                step.backward(lambda loss=loss: module.manual_backward(loss * world))
            else:
                step.backward(lambda: None)
        elif world > 1:
            loss = _touch(module) + (loss if loss is not None else 0.0)
            sync = nullcontext() if j == n - 1 else strategy.block_backward_sync()
            with sync:
                module.manual_backward(loss * world)
        elif loss is not None:
            module.manual_backward(loss)
        if after_backward is not None:
            after_backward()
    if step is not None:  # what no sharded model holds (value and critic heads): whole on every process
        average_gradients(module)
    return n > 0


def average_gradients(module) -> None:
    """The gradient average of the trainable parameters that FSDP2 does not hold (not DTensors: value and critic
    heads), as one all-reduce after the backward passes (every rank settled first): each gradient (zero where a rank
    gave it none) divided by the world size, then summed over the ranks."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    lockstep.settle()
    params = [p for p in module.parameters() if p.requires_grad and not isinstance(p, DTensor)]
    if not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params]) / world_size(module)
    dist.all_reduce(flat)
    for p, g in zip(params, torch.split(flat, [p.numel() for p in params])):
        p.grad.copy_(g.view_as(p.grad))


def clip_gradients(module, opt, max_norm: float) -> None:
    """Clip the trainable gradients to a total norm of ``max_norm``: Lightning's ``clip_gradients``, or under FSDP2
    (sharded models: a lockstep is active) torch's ``clip_grad_norm_`` over DTensor shards and whole tensors (value
    and critic heads, averaged: the same on every rank) together: the shards' squared norms summed over the ranks,
    the whole tensors' counted once, every gradient scaled by ``max_norm / (norm + 1e-6)`` when that is below 1."""
    if lockstep.active() is None:
        module.clip_gradients(opt, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")
        return
    grads = [p.grad for p in module.parameters() if p.requires_grad and p.grad is not None]
    if not grads:
        return
    lockstep.settle()
    squares = torch.zeros((), dtype=torch.float32)
    for g in grads:  # the same order on every rank: a sharded gradient's norm is a collective
        norm = torch.linalg.vector_norm(g, 2, dtype=torch.float32)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        squares = squares + norm.to(squares.device) ** 2
    coef = min(1.0, float(max_norm / (squares.sqrt() + 1e-6)))
    for g in grads:
        g.mul_(coef)


def steps_note(max_steps: int | None, num_epochs: int, minibatch_size: int | None) -> str:
    """The start line for a ``max_steps`` that is not a whole number of rollouts (``num_epochs`` updates each when
    every update takes the whole rollout; with minibatches of a set size their number depends on each rollout, and
    nothing is said); "" otherwise."""
    if minibatch_size is not None or num_epochs <= 1 or max_steps is None or max_steps <= 0:
        return ""
    rollouts, last = -(-max_steps // num_epochs), max_steps % num_epochs
    if not last:
        return ""
    return (
        f"--trainer.max_steps {max_steps} is not a whole number of rollouts of {num_epochs} updates "
        f"(model.ppo.num_epochs): the run makes {rollouts} rollouts, the last stopped after {last} of its updates"
    )


def reached_max_steps(module) -> bool:
    """Whether the module's trainer has made its ``max_steps`` updates (the same on every rank: they step together).
    A ``max_steps`` that is not a whole number of rollouts thus ends the run inside the last rollout's updates, as
    :func:`steps_note` says at the start, instead of past ``max_steps``."""
    trainer = module._trainer
    return trainer is not None and trainer.max_steps is not None and 0 <= trainer.max_steps <= trainer.global_step
