"""Full agents in vLLM: each one's engine takes the trained weights in place after an update, versioned.

A full agent (``finetune: full``, :mod:`collab.policy.full`) trains every weight of its own copy of a base, which
no LoRA adapter can carry to vLLM. :class:`~collab.policy.vllm_engine.VllmEngine` gives it an engine of its own,
started without LoRA from the base's folder, and :func:`sync_full` hands that engine the trainer's tensors before a
rollout that follows an update: in place through vLLM's ``reload_weights`` (the engine runs in the training
process, so nothing is serialised), a tied output layer repacked (:func:`repack_tied`), the prefix cache reset, and
a version bumped at each load of changed weights as an adapter's is. Why each step: docs/engines.md, *Full agents*.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from collab.runtime import lockstep
from collab.runtime.lockstep import whole


@dataclass
class Synced:
    """What vLLM holds of one agent: a version of its LoRA adapter (``lora_id``, ``folder``) or of a full agent's
    weights (neither)."""

    version: int
    state: tuple
    """:meth:`VllmEngine.state` of the weights it was exported or loaded from."""
    lora_id: int | None = None
    folder: Path | None = None


def repack_tied(model) -> None:
    """Rebuild the CPU build's packed copy (``cpu_linear``) of every layer whose weight another layer shares (a
    tied output layer): the reload processed the embedding, not the head that reads the same tensor."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    layers = [m for m in model.modules() if isinstance(getattr(m, "weight", None), torch.Tensor)]
    owners = Counter(id(m.weight) for m in layers)
    for m in layers:
        if hasattr(m, "cpu_linear") and owners[id(m.weight)] > 1 and m.weight.ndim == 2 and m.weight.numel():
            dispatch_cpu_unquantized_gemm(m, remove_weight=False)


@contextlib.contextmanager
def _quiet_reload():
    """vLLM warns, at every reload, that the rotary embedding and a tied head loaded nothing: neither has weights
    of its own in a checkpoint. Those lines would repeat at every update."""
    logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def load_in_place(llm, model, name: str) -> None:
    """Copy ``model``'s weights (a transformers model, the trainer's) into ``llm``'s, in place, and drop vLLM's
    cached prefixes."""
    weights = ((key, whole(p).detach()) for key, p in model.named_parameters())  # sharded: gathered one by one
    try:
        with _quiet_reload():
            llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
    except (KeyError, ValueError, AttributeError) as e:  # a name or shape vLLM's model does not have
        raise RuntimeError(f"vLLM could not load {name}'s weights in place: {type(e).__name__}: {e}") from None
    llm.apply_model(repack_tied)
    if not llm.reset_prefix_cache():
        raise RuntimeError(f"vLLM kept its prefix cache after loading {name}'s weights (requests were running)")


def sync_full(llm, model, name: str, previous: Synced | None, state: tuple) -> Synced | None:
    """Load a full agent's weights into its engine as the next version when they changed since the last load (or
    were never loaded); returns what vLLM now holds, None when nothing changed."""
    if previous is not None and previous.state == state:
        return None
    load_in_place(llm, model, name)
    return Synced(0 if previous is None else previous.version + 1, state)


def agree_stale(engine, team, states: dict[int, tuple]) -> None:
    """Under FSDP2, make every process load the same agents: an agent whose weights any process finds changed since
    its engine last took them (or whose adapter its engine no longer holds) is stale on every process. Each load
    gathers the sharded weights, collectives that every process must run for the same agents in the same order."""
    import torch.distributed as dist

    loaded = {base: llm.llm_engine.list_loras() for base, llm in engine.llms.items() if not base.full}
    stale = []
    for agent, held in ((a, engine.synced.get(a)) for a in range(len(team))):
        base = team.agents[agent].base
        stale.append(held is None or held.state != states[agent] or not (base.full or held.lora_id in loaded[base]))
    flags = torch.tensor(stale, dtype=torch.int64)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=lockstep.active().group)
    for agent in flags.nonzero().flatten().tolist():
        if agent in engine.synced:
            engine.synced[agent] = replace(engine.synced[agent], state=())  # stale here too
