"""A process's own state for a checkpoint: its random generators (:func:`rng_state`), and anything a rank keeps
of its own, gathered from every rank (:func:`gather_per_rank`) and picked back by rank (:func:`pick_rank`).

A resumed run repeats the uninterrupted one bitwise only if every process draws from where it stopped:
:mod:`collab.training.resume` says when the state is taken and put back.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import torch


def rng_state(device: torch.device | str | None = None) -> dict[str, Any]:
    """This process's random state: torch's CPU generator, the generator of ``device`` (cuda, mps),
    python's ``random`` and numpy's global generator, as plain tensors, tuples and lists (loadable
    with ``torch.load(weights_only=True)``)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    elif device is not None and device.type == "mps":
        state["mps"] = torch.mps.get_rng_state()
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with torch's usual installs
        pass
    else:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (name, keys.tolist(), int(pos), int(has_gauss), float(cached))
    return state


def set_rng_state(state: dict[str, Any], device: torch.device | str | None = None) -> None:
    """Put back a state from :func:`rng_state` (the accelerator's only on a device of the same type)."""
    torch.set_rng_state(state["torch"].cpu() if isinstance(state["torch"], torch.Tensor) else state["torch"])
    random.setstate(tuples(state["python"]))
    device = torch.device(device) if device is not None else None
    if "cuda" in state and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)
    if "mps" in state and device is not None and device.type == "mps":
        torch.mps.set_rng_state(state["mps"].cpu())
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def tuples(value):
    """python's random state is nested tuples; a checkpoint may hand them back as lists."""
    return tuple(tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def gather_per_rank(obj: Any) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` across the processes of a distributed run (a collective:
    every rank must call it, as every rank calls ``trainer.save_checkpoint``); ``[obj]`` in one process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        from collab.runtime import lockstep

        out: list[Any] = [None] * dist.get_world_size()
        lockstep.settle()
        dist.all_gather_object(out, obj)
        return out
    return [obj]


def pick_rank(states: list[Any], rank: int, what: str) -> Any | None:
    """This rank's entry of a :func:`gather_per_rank` list (``None``, with a warning, when the checkpoint
    came from fewer processes)."""
    if rank < len(states):
        return states[rank]
    warnings.warn(
        f"the checkpoint holds the {what} of {len(states)} process(es), not of rank {rank}; "
        f"rank {rank} starts its own, as at a fresh start",
        stacklevel=2,
    )
    return None
