"""Does a multi-process run fit on this machine? Checked before Lightning starts the processes.

Each DDP process loads its own copy of the frozen base (``docs/distributed.md``): ``--trainer.devices 64
--trainer.strategy ddp --trainer.accelerator cpu`` on a 2-core machine would start 64 copies and be killed
by the kernel (exit 137, no word). :func:`check_fits` refuses such a run in one line (a
:class:`~collab.errors.UserError`: exit 2) that gives the cores, the memory estimate and what would fit:

- CPU processes: at most one per core (``os.sched_getaffinity``: the cores this process may run on);
- GPU processes: at most one per visible CUDA device;
- memory: processes x (the base's weights + the agents' adapters and AdamW moments + a fixed overhead, and each
  full-parameter agent's weights, gradients and AdamW moments: :mod:`collab.policy.full`) against ``MemAvailable``
  of ``/proc/meminfo``. The overhead (Python, torch, Lightning, the tokenizer, activations of a short rollout) was
  measured on a 2-process ``tiny`` run: a process's peak resident
  memory less its weights: 0.74 GiB less 13 MB (docs/distributed.md, "Timeouts and limits").

Only the process that launches the others checks (under torchrun or SLURM the processes exist already).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from collab.errors import UserError
from collab.policy.models import KNOWN_PARAMS, base_parameters  # noqa: F401 (also read from here)
from collab.training.distributed import DEFAULT_TIMEOUT_S, set_timeout, timeout_callback

GB = 1024**3
OVERHEAD_BYTES = int(0.75 * GB)
"""Peak resident memory of one DDP process less its weights (measured: 0.72 GiB on rank 0 of a 2-process tiny
magrpo run; rounded up)."""
ADAPTER_FRACTION = 0.02
"""LoRA adapter parameters per agent as a fraction of the base's (r=8-16 on the attention projections: ~0.5-2%)."""
BYTES_PER_PARAM = {"none": None, "8bit": 1.0, "4bit": 0.55}  # NF4 + double-quantised scales; None: the dtype's
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Machine:
    """What this node offers."""

    cores: int
    memory_available: int
    """Bytes: ``MemAvailable`` (``None`` where ``/proc/meminfo`` is missing: memory is not checked)."""
    gpus: int = 0


@dataclass(frozen=True)
class Launch:
    """The processes a run would start on this node."""

    processes: int
    accelerator: str
    """``cpu`` or ``gpu`` (Lightning's resolved accelerator)."""
    process_bytes: int | None
    """Host memory estimate of one process (:func:`process_bytes`); None: unknown base, not checked."""


def process_bytes(params: int, bytes_per_param: float, agents: int, overhead: int = OVERHEAD_BYTES) -> int:
    """One process: the frozen base, each agent's adapter with its gradient and two AdamW moments (float32),
    and the fixed overhead."""
    adapters = agents * ADAPTER_FRACTION * params * 4 * 4
    return int(params * bytes_per_param + adapters + overhead)


def base_bytes_per_param(dtype: str, quantization: str) -> float:
    return BYTES_PER_PARAM.get(quantization) or DTYPE_BYTES.get(dtype, 4)


def this_machine() -> Machine:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    import torch

    return Machine(
        cores=cores, memory_available=available, gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0
    )


def _gb(n: float) -> str:
    return f"{n / GB:.1f} GB"


def check_fits(launch: Launch, machine: Machine) -> None:
    """Refuse, in one line, more processes than this node holds (cores or GPUs, and memory)."""
    n = launch.processes
    if n <= 1:
        return
    limits, problems = [], []
    if launch.accelerator == "cpu":
        limits.append(machine.cores)
        if n > machine.cores:
            problems.append(f"{machine.cores} CPU core{'s' if machine.cores != 1 else ''} (one per process)")
    elif launch.accelerator == "gpu":
        limits.append(machine.gpus)
        if n > machine.gpus:
            problems.append(f"{machine.gpus} CUDA device{'s' if machine.gpus != 1 else ''}")
    memory = ""
    if launch.process_bytes and machine.memory_available is not None:
        limits.append(machine.memory_available // launch.process_bytes)
        memory = (
            f"{_gb(machine.memory_available)} of memory available, about {_gb(launch.process_bytes)} per process "
            f"({_gb(n * launch.process_bytes)} for {n})"
        )
        if n * launch.process_bytes > machine.memory_available:
            problems.append(memory)
    if not problems:
        return
    fit = max(min(limits), 1)
    have = "; ".join(problems + ([memory] if memory and memory not in problems else []))
    raise UserError(
        f"--trainer.devices {n} starts {n} training processes on this machine, which has {have}: "
        f"at most {fit} fit here (--trainer.devices {fit}), or add machines with --trainer.num_nodes"
    )


def check_launch(trainer, base, agents: int | list[str | None] = 2, full: list[str | None] = ()) -> None:
    """:func:`check_fits` for a Lightning ``trainer`` about to start its processes, each loading ``base``
    (a :class:`~collab.policy.models.BaseConfig`) for ``agents`` agents (the roles' default when the config
    names none: 2), or, when ``agents`` lists each agent's own base (``None``: ``base.name``), every distinct
    base of a mixed team with its agents (each process loads all of them). Only where this process launches
    the others (Lightning's own launchers). ``full``: each full-parameter agent's base (``None``: ``base.name``), held
    whole by every process beside the shared bases."""
    strategy = trainer.strategy
    launcher = getattr(strategy, "launcher", None)
    environment = getattr(strategy, "cluster_environment", None)
    if launcher is None or environment is None or environment.creates_processes_externally:
        return
    accelerator = (
        "cpu"
        if type(trainer.accelerator).__name__ == "CPUAccelerator"
        else ("gpu" if type(trainer.accelerator).__name__ == "CUDAAccelerator" else "other")
    )
    check_fits(Launch(trainer.num_devices, accelerator, team_process_bytes(base, agents, full)), this_machine())


def team_process_bytes(base, agents: int | list[str | None] = 2, full: list[str | None] = ()) -> int | None:
    """:func:`process_bytes` of a team (arguments as :func:`check_launch`'s): each distinct base once, with its own
    agents' adapters, each full agent's :data:`~collab.policy.full.COPIES` copies of its base, and one overhead; None
    when some base's size is not at hand."""
    from collab.policy.full import COPIES

    names = [name or base.name for name in agents] if isinstance(agents, list) else [base.name] * agents
    whole = [name or base.name for name in full]
    per_param = base_bytes_per_param(base.dtype, base.quantization)
    counts = {name: base_parameters(name) for name in dict.fromkeys(names + whole)}
    if not all(counts.values()):
        return None
    shared = sum(process_bytes(counts[n], per_param, names.count(n), overhead=0) for n in dict.fromkeys(names))
    return OVERHEAD_BYTES + shared + sum(COPIES * DTYPE_BYTES.get(base.dtype, 4) * counts[n] for n in whole)


def prepare_processes(trainer, module, timeout_s: float = DEFAULT_TIMEOUT_S, env=None) -> None:
    """Before ``trainer.fit`` starts the processes: refuse more than the machine holds (:func:`check_launch`, for
    the team the module builds on ``env``: one agent per role), set the process group's timeout, and make a failed
    collective one line (:func:`collab.training.distributed.timeout_callback`)."""
    specs = module.team_specs(env) if env is not None else (module.agent_specs or [])
    lora = [spec.base for spec in specs if spec.finetune != "full"]
    check_launch(trainer, module.base, lora if specs else 2, [spec.base for spec in specs if spec.finetune == "full"])
    set_timeout(trainer.strategy, timeout_s)
    trainer.callbacks.insert(0, timeout_callback(timeout_s))
