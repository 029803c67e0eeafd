"""The lines a team's check says (:func:`collab.cli.resources.check_team`): a projection's parts in GiB, the one-line
refusal of a team that cannot fit, naming its largest part and what lowers it, and a large team's start line with
its projected memory and a step's projected time. Text only: every figure comes from
:mod:`collab.runtime.projection`."""

from __future__ import annotations

from collab.runtime.projection import Projection, Workload

GB = 1024**3


def gib(n: int | float) -> float:
    """``n`` bytes in GiB (a crossed tree's counts can be past a float's range: capped there)."""
    return min(n, 10**300) / GB


def _number(n: int | float) -> str:
    return f"{gib(n):.2f}" if n < 1000 * GB else f"{gib(n):.3g}"


def _gib(n: int | float) -> str:
    return f"{_number(n)} GiB"


def parts(p: Projection) -> str:
    """The projection's parts, in GiB (the rollout's and the update's working memory are not held together)."""
    gathered = f" with the {_number(p.gathered)} an fsdp backward pass gathers whole" if p.gathered else ""
    return (
        f"fixed {_number(p.fixed)}, bases {_number(p.bases)}, adapters and AdamW {_number(p.adapters)}, the step's "
        f"experience {_number(p.experience)}, and the larger of a rollout's KV cache and sampling {_number(p.rollout)}"
        f" and an update's activations {_gib(p.update)}{gathered}"
    )


def shortage(p: Projection, processes: int, machine, accelerator: str) -> str | None:
    """What the projection does not fit on ``machine`` (a ``resources.Machine``; None: it fits): each GPU's free
    memory for what lives there and the host's for the rest, or on a CPU the host's for everything, for every
    process of the node."""
    per = f" a process, {processes} processes" if processes > 1 else ""
    if accelerator == "gpu" and machine.gpu_memory is not None:
        if p.device > machine.gpu_memory:
            return f"{_gib(p.device)} on each GPU against {_gib(machine.gpu_memory)} free"
        host, what = processes * p.host, "of host memory"
    else:
        host, what = processes * p.total, "of memory"
    if machine.memory_available is not None and host > machine.memory_available:
        return f"{_gib(host // processes)}{per} against {_gib(machine.memory_available)} {what} available"
    return None


HINTS = {
    "experience": ("the step's experience", "fewer tasks a step (--data.batch_size), samples, turns or new tokens"),
    "rollout": ("a rollout's", "a smaller --model.decode_memory_gb, or fewer samples or shorter prompts"),
    "update": ("an update's", "a smaller --model.micro_batch_memory_gb (or micro_batch_tokens), or shorter sequences"),
    "adapters": ("the adapters", "a lower LoRA rank, or LoRA agents for full ones"),
    "bases": ("the bases", "a quantized base (--model.base.quantization 4bit)"),
    "gathered": ("the models an fsdp backward pass gathers whole", "LoRA agents for full ones, or a smaller base"),
}
"""Each part of a projection: its name and what lowers it (the refusal names the largest part's)."""


def largest_part(p: Projection) -> str:
    """The key of :data:`HINTS` of the projection's largest part."""
    sizes = {"experience": p.experience, "rollout": p.rollout, "update": p.update}
    sizes.update(adapters=p.adapters, bases=p.bases, gathered=p.gathered)
    return max(sizes, key=sizes.get)


def refusal(agents: int, p: Projection, short: str, fits: int) -> str:
    """The one line of a team that cannot fit: its projection, the memory available and what would fit."""
    what = (
        f"at most {fits} agent{'s' if fits != 1 else ''} fit here with these tasks, samples and lengths"
        if fits
        else "not even 1 agent fits here with these tasks, samples and lengths"
    )
    name, hint = HINTS[largest_part(p)]
    return (
        f"the team does not fit this machine: {agents} agents project {short} ({parts(p)}); {what}; "
        f"the largest part, {name}, shrinks with {hint}"
    )


def duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def start_line(p: Projection, work: Workload, flops: int, rate: float, machine, accelerator: str) -> str:
    """A large team's start line: its projected memory and a step's projected time."""
    if accelerator == "gpu" and machine.gpu_memory is not None:
        memory = f"{_gib(p.device)} on each GPU of {_gib(machine.gpu_memory)} free, {_gib(p.host)} of host memory"
    else:
        available = "" if machine.memory_available is None else f" of {_gib(machine.memory_available)} available"
        memory = f"{_gib(p.total)} a process{available}"
    rows = sum(work.rows(t) for t in range(work.turns))
    longest = max(work.length(t) for t in range(work.turns))
    where, flops = "GPU" if accelerator == "gpu" else "CPU", float(min(flops, 10**300))
    return (
        f"team: {work.agents} agents, projected {memory} ({parts(p)}); a step projected at about "
        f"{duration(flops / rate)} ({flops:.2g} FLOPs: {rows:,} responses of up to {longest:,} tokens, decoded and "
        f"trained on, at {rate / 1e9:.0f} GFLOP/s, this {where}'s matmul rate now; decoding's Python loop and "
        "sampling not counted)"
    )
