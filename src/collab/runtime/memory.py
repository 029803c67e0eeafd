"""Micro-batches bounded by memory (``--model.micro_batch_tokens auto``).

An update's forward/backward keeps, per token, the activations its backward needs: a fixed number of bytes
for a given model, adapters, dtype and checkpointing (the output head's logits are not among them:
:mod:`collab.policy.head`). ``auto`` measures that number once, at the start of a run, on the team itself: one
probe forward of :data:`PROBE_TOKENS` tokens through the agents' log-probs with autograd's saved-tensor hooks
counting what is saved for the backward (:func:`bytes_per_token`), times :data:`SAFETY` for what a backward
allocates besides. Under gradient checkpointing what the forward saves is only each layer's input; the
backward then runs each layer's forward again and holds that layer's activations and their gradients at
once: the probe adds :data:`RECOMPUTE` layers' worth of activations (what the largest layer's forward saves in a
second probe with checkpointing off). (An actor-critic's LLM critic reads about as many tokens as the agents: it
is a backward pass of its own, :meth:`collab.algos.actor_critic.ActorCritic.terms`, so it needs no room beside
theirs.) The micro-batch is then the padded tokens that fit in the budget (:func:`budget_bytes`):
``--model.micro_batch_memory_gb``, or by default 1/16 of the machine's RAM, at most 1 GiB, on a CPU, and 1/4
of the GPU's memory on a GPU: the machine's total memory, not what is free at the moment, so that a run's
micro-batches do not depend on the load. The size is decided once per run and saved in the checkpoint; a
resumed run keeps it. Splitting a minibatch into micro-batches does not change its gradient (the losses are
divided by the minibatch's counts: ``tests/algos/test_skeleton.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
from collections.abc import Hashable, Iterator

import torch

from collab.runtime import lockstep

PROBE_TOKENS = 64
"""Tokens of the probe forward (half prompt, half completion)."""
SAFETY = 1.5
"""Headroom over the measured saved-for-backward bytes: the backward's own buffers (a layer's activation
gradients, the head's chunk), the allocator's slack."""
RECOMPUTE = 2.0
"""Layers' worth of full activations that a checkpointed backward holds beside the saved layer inputs: the layer
it runs again, and the gradients of its activations. Measured at the peak of the bytes in use over a LoRA forward
and backward (``benchmarks/checkpoint_memory.py``, Qwen3-shaped layers of width 1,024 and 2,048): the saved inputs
plus 1.5-1.6 layers."""
CPU_FRACTION, CPU_CAP = 1 / 16, 2**30
GPU_FRACTION = 1 / 4


def total_ram() -> int:
    """The machine's RAM in bytes (what the kernel reports; the cgroup's limit when lower)."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit.isdigit():
            ram = min(ram, int(limit))
    except OSError:
        pass
    return ram


def budget_bytes(device: torch.device, memory_gb: float | None) -> int:
    """Bytes for one micro-batch's activations: ``memory_gb`` when given, else a fraction of the device's total
    memory (module docstring)."""
    if memory_gb is not None:
        return int(memory_gb * 2**30)
    if device.type == "cuda":
        return int(GPU_FRACTION * torch.cuda.get_device_properties(device).total_memory)
    return int(min(CPU_FRACTION * total_ram(), CPU_CAP))


def token_budget_chunks(lengths: list[int], budget: int | None, rows: list[int] | None = None) -> list[list[int]]:
    """Consecutive index groups of ``lengths`` whose padded size (rows x longest item) stays within ``budget``
    tokens; item ``i`` is ``rows[i]`` rows (default 1: an update's items; a decoding request is its ``n``
    samples). An item over the budget is a group of its own. ``None``: one group."""
    if budget is None:
        return [list(range(len(lengths)))] if lengths else []
    rows = rows if rows is not None else [1] * len(lengths)
    chunks: list[list[int]] = []
    longest = height = 0
    for i, (n, r) in enumerate(zip(lengths, rows)):
        if chunks and (height + r) * max(longest, n) <= budget:
            chunks[-1].append(i)
            longest, height = max(longest, n), height + r
        else:
            chunks.append([i])
            longest, height = n, r
    return chunks


def shared_prompt_chunks(
    keys: list[Hashable], prompts: list[int], completions: list[int], budget: int | None
) -> list[list[int]]:
    """Groups of positions whose forward stays within ``budget`` padded tokens when the rows of one prompt compute it
    once: row ``i`` reads prompt ``keys[i]`` (rows with equal keys read the same tokens: one agent's prompt) of
    ``prompts[i]`` tokens and adds ``completions[i]``. A group's cost is what the shared-prefix forward pads: each
    distinct prompt once, at the longest prompt's length, and each row's tail (its completion and the prompt's last
    token) at the longest tail's. The rows of a prompt go together, in order of first appearance (a MAGRPO node's K
    samples): counted per row (:func:`token_budget_chunks`) each would carry the prompt, and micro-batches of a
    row each would compute it K times. A row over the budget is a group of its own. ``None``: one group, in the
    rows' order."""
    if budget is None:
        return [list(range(len(keys)))] if keys else []
    by_prompt: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        by_prompt.setdefault(key, []).append(i)
    chunks: list[list[int]] = []
    seen: set[Hashable] = set()
    longest_head = longest_tail = 0
    for key, rows in by_prompt.items():
        for i in rows:
            head, tail = max(longest_head, prompts[i]), max(longest_tail, completions[i] + 1)
            if chunks and (len(seen) + (key not in seen)) * head + (len(chunks[-1]) + 1) * tail > budget:
                chunks.append([])
                seen, head, tail = set(), prompts[i], completions[i] + 1
            if not chunks:
                chunks.append([])
            chunks[-1].append(i)
            seen.add(key)
            longest_head, longest_tail = head, tail
    return chunks


def recording(record):
    """Saved-tensor hooks that call ``record(data pointer, bytes)`` for each storage autograd saves."""

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        record(storage.data_ptr(), storage.nbytes())
        # kept without its graph: an op's own output handed back as itself would make its node reference
        # itself through the tensor's grad_fn, a cycle through C++ that Python's collector cannot see, which
        # would keep the graph and every weight it saved alive after the forward's output is gone
        return t.detach()

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)


def saved_for_backward(fn):
    """``(storages, out)``: ``out = fn()`` and the bytes of each storage autograd saved for the backward while it
    ran (data pointer -> bytes, each storage once)."""
    seen: dict[int, int] = {}
    with recording(seen.__setitem__):
        out = fn()
    return seen, out


def checkpointed_layers(model) -> list:
    """The layers of ``model`` that run their forward again in the backward (transformers' gradient
    checkpointing: each decoder layer's ``gradient_checkpointing`` flag)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


@contextlib.contextmanager
def checkpointing_off(layers: list) -> Iterator[None]:
    """Within: ``layers`` (checkpointed ones) run as if checkpointing were off."""
    for layer in layers:
        layer.gradient_checkpointing = False
    try:
        yield
    finally:
        for layer in layers:
            layer.gradient_checkpointing = True


def saved_in_layers(fn, layers: list, weights: set[int]) -> list[int]:
    """Bytes that each of ``layers``' forwards saves for the backward while ``fn()`` runs (weights, whose storages
    are ``weights``, not counted; each storage once)."""
    inside: list[int] = []
    seen: list[dict[int, int]] = [{} for _ in layers]

    def record(ptr: int, nbytes: int) -> None:
        if inside and ptr not in weights:
            seen[inside[-1]][ptr] = nbytes

    def enter(i: int):
        return lambda module, args: inside.append(i)

    def leave(module, args, out) -> None:  # (a hook that returns a value replaces the layer's output)
        inside.pop()

    hooks = []
    for i, layer in enumerate(layers):
        hooks += [layer.register_forward_pre_hook(enter(i)), layer.register_forward_hook(leave)]
    try:
        with recording(record):
            fn()
    finally:
        for hook in hooks:
            hook.remove()
    return [sum(s.values()) for s in seen]


def bytes_per_token(team) -> float:
    """Bytes an update's forward and backward hold per token of the agents' log-probs, measured on a probe
    sequence (nothing is trained: the graph is dropped unused): what the forward saves for the backward, and
    under gradient checkpointing :data:`RECOMPUTE` times what the largest layer's forward saves without it. In a
    team of several bases, the largest base's (one probe through the first agent on each that trains: a frozen
    agent's forward saves nothing)."""
    half = PROBE_TOKENS // 2
    prompt, completion = list(range(10, 10 + half)), list(range(10 + half, 10 + 2 * half))
    # weights are not activations (FSDP2's DTensors: the local shard's storage)
    weights = {(p.to_local() if hasattr(p, "to_local") else p).untyped_storage().data_ptr() for p in team.parameters()}
    per_base = []
    for base in dict.fromkeys(agent.base for agent in team.agents):
        mine = [i for i, agent in enumerate(team.agents) if agent.base is base]
        agent = next((i for i in mine if not team.is_frozen(i)), mine[0])
        probe = lambda: team.logprobs(agent, [prompt], [completion])  # noqa: E731
        seen, _ = saved_for_backward(probe)
        per_token = sum(n for ptr, n in seen.items() if ptr not in weights) / PROBE_TOKENS
        layers = checkpointed_layers(base.model)
        if layers:
            with checkpointing_off(layers):
                per_token += RECOMPUTE * max(saved_in_layers(probe, layers, weights)) / PROBE_TOKENS
        per_base.append(per_token)
    lockstep.forget()  # under fsdp: the probes' graphs are gone, their models need no gathering in the next backward
    return max(per_base)


def auto_tokens(team, device: torch.device, memory_gb: float | None) -> tuple[int, str]:
    """The micro-batch size in padded tokens for the budget, and a line saying how it was decided."""
    per_token = bytes_per_token(team) * SAFETY
    budget = budget_bytes(device, memory_gb)
    tokens = max(1, int(budget // max(per_token, 1.0)))
    where = (
        "--model.micro_batch_memory_gb"
        if memory_gb is not None
        else ("1/4 of the GPU's memory" if device.type == "cuda" else "1/16 of the RAM, at most 1 GiB")
    )
    return tokens, (
        f"micro-batches: {tokens} padded tokens ({per_token / 2**10:.0f} KiB a token x {tokens} "
        f"within {budget / 2**30:.2f} GiB, {where})"
    )


def resident_bytes(pid: int | str = "self") -> int:
    """Resident memory of process ``pid`` (default: this one) in bytes (``/proc/PID/statm``; 0 where there is none,
    or the process has ended)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def release_above(limit: int) -> bool:
    """:func:`release` when the process holds more than ``limit`` bytes; ``True`` when it released.

    The update's check after each backward pass (:meth:`collab.algos.base.CollabModule.update`): each micro-batch
    allocates its activations at its own shape, and the holes the freed ones leave in glibc's heap take the next
    micro-batches' only in part, so the resident memory grows by a micro-batch's worth every few passes unless
    given back. Giving it back after every pass bounds that but costs the page faults of the memory used again
    (MAGRPO, 2 agents: 4x the minor faults, ~5 s more system CPU a step); the update gives it back only once the
    process holds more than at its start plus a micro-batch's budget, what an unfragmented heap needs, and under
    gradient checkpointing after every pass (docs/measurements.md: "The N = 8 peak: the heap between
    micro-batches", and "Heap fragmentation" for the checkpointed case)."""
    return resident_bytes() > limit and release()


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def release() -> bool:
    """Give the C allocator's free memory back to the operating system (glibc's ``malloc_trim(0)``); ``False``
    where the C library has none (not glibc).

    A CPU tensor freed by PyTorch goes back to glibc's heap, which keeps its pages: a rollout's KV cache, an
    evaluation's batch or an update's activations stay in the process's resident memory after they are freed,
    and the next phase, whose tensors have other sizes, fits only part of its own into those holes. Called
    between phases (after a rollout, after an update, after an evaluation: :mod:`collab.algos.base`,
    :mod:`collab.training.eval_callback`) it makes a run's peak the largest phase's, not the phases' sum of
    fragments (docs/models.md, "Memory"). It costs a walk of the heap and the page faults of memory used again:
    well under a second a step on the embedded model."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
