"""Does a run fit on this machine? Checked before Lightning starts the processes and before a model loads.

:func:`check_fits` (the launching process only: under torchrun or SLURM the processes exist already) refuses
more processes than the machine holds, one per core or visible GPU and in memory, in one line
(:class:`~collab.errors.UserError`); docs/distributed.md, "Timeouts and limits", says how. :func:`check_team`
refuses a team whose projected memory (:mod:`collab.runtime.projection`) cannot fit, or has a large one say its
projection and a step's time in a start line (``team: ...``); a team of more than :data:`EARLY_AGENTS` agents
shows it before its adapters are built, because building N adapters grows as N^2 (docs/usage.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from math import ceil

from collab.cli.team_lines import refusal, shortage, start_line
from collab.errors import UserError
from collab.policy.models import KNOWN_PARAMS, base_config, base_parameters  # noqa: F401 (also read from here)
from collab.runtime.projection import (
    ADAM_BYTES,
    CHARS_PER_TOKEN,
    TEMPLATE_TOKENS,
    Model,
    Projection,
    Shape,
    Workload,
    activation_bytes_per_token,
    experience_bytes,
    kv_bytes_per_token,
    lora_parameters,
    most_agents,
    rollout_bytes,
    shape_from_config,
    sharded_bytes,
    step_flops,
    update_bytes,
)
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
    gpu_memory: int | None = None
    """Bytes free on a GPU a run uses (None: not measured, or no GPU)."""


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


def check_launch(
    trainer, base, agents: int | list[str | None] = 2, full: list[str | None] = (), per_model: bool = True
) -> None:
    """:func:`check_fits` for a Lightning ``trainer`` about to start its processes, each loading ``base``
    (a :class:`~collab.policy.models.BaseConfig`) for ``agents`` agents (the roles' default when the config
    names none: 2), or, when ``agents`` lists each agent's own base (``None``: ``base.name``), every distinct
    base of a mixed team with its agents (each process loads all of them). Only where this process launches
    the others (Lightning's own launchers). ``full``: each full-parameter agent's base (``None``: ``base.name``), held
    whole by every process beside the shared bases (under fsdp: sharded, :func:`team_process_bytes`, whose
    ``per_model`` this passes on)."""
    strategy = trainer.strategy
    launcher = getattr(strategy, "launcher", None)
    environment = getattr(strategy, "cluster_environment", None)
    if launcher is None or environment is None or environment.creates_processes_externally:
        return
    accelerator = accelerator_kind(trainer)
    process = team_process_bytes(base, agents, full, shards(trainer), per_model)
    check_fits(Launch(trainer.num_devices, accelerator, process), this_machine())


def team_process_bytes(
    base, agents: int | list[str | None] = 2, full: list[str | None] = (), shards: int = 1, per_model: bool = True
) -> int | None:
    """:func:`process_bytes` of a team (arguments as :func:`check_launch`'s): each distinct base once, with its own
    agents' adapters, each full agent's :data:`~collab.runtime.projection.FULL_COPIES` copies of its base, and one
    overhead; under fsdp over ``shards`` processes the bases and full copies ``1/shards`` each with what a backward
    pass gathers whole on top (:func:`~collab.runtime.projection.sharded_bytes`: one model when ``per_model``, the
    algorithm's passes each running on one, else all). None when some base's size is not at hand."""
    names = [name or base.name for name in agents] if isinstance(agents, list) else [base.name] * agents
    whole = [name or base.name for name in full]
    per_param = base_bytes_per_param(base.dtype, base.quantization)
    counts = {name: base_parameters(name) for name in dict.fromkeys(names + whole)}
    if not all(counts.values()):
        return None
    adapters = sum(process_bytes(counts[n], 0, names.count(n), overhead=0) for n in dict.fromkeys(names))
    models = [Model(counts[n], per_param) for n in dict.fromkeys(names)]
    models += [Model(counts[n], DTYPE_BYTES.get(base.dtype, 4), trains=True) for n in whole]
    held, gathered = sharded_bytes(models, shards, per_model=per_model)
    return OVERHEAD_BYTES + adapters + held + gathered


def shards(trainer) -> int:
    """The processes fsdp splits each model of the team across (``FSDP2Strategy.shards``); 1 under other strategies."""
    return int(getattr(trainer.strategy, "shards", 1) or 1)


def prepare_processes(
    trainer, module, timeout_s: float = DEFAULT_TIMEOUT_S, env=None, tasks: int | None = None
) -> None:
    """Before ``trainer.fit`` starts the processes and loads the team: refuse more processes than the machine holds
    (:func:`check_launch`, for the team the module builds on ``env``: one agent per role), refuse a team that
    cannot fit or have a large one say its projection (:func:`check_team`, with ``tasks`` a step over all
    processes), set the process group's timeout, and make a failed collective one line
    (:func:`collab.training.distributed.timeout_callback`)."""
    specs = module.team_specs(env) if env is not None else (module.agent_specs or [])
    lora = [spec.base for spec in specs if spec.finetune != "full"]
    whole = [spec.base for spec in specs if spec.finetune == "full"]
    check_launch(trainer, module.base, lora if specs else 2, whole, getattr(module, "passes_per_model", True))
    if env is not None and tasks:
        from collab.cli.output import note, show_notes

        line = check_team(trainer, module, env, tasks)
        if line:
            note(line)
            if len(specs) > EARLY_AGENTS:  # its adapters take a while to build
                show_notes()
    set_timeout(trainer.strategy, timeout_s)
    trainer.callbacks.insert(0, timeout_callback(timeout_s))


# -- the team, counted before loading ----------------------------------------------------------------------------
LARGE_TEAM = 2
"""Agents of the packaged configs' team: a team of more says its projection in its start line."""
LONG_STEP_S = 600.0
"""A step projected over this many seconds says its projection too, whatever the team's size."""
EARLY_AGENTS = 32
"""A team of more agents shows its start lines before its adapters are built (the module docstring)."""


def first_prompt_tokens(env, sample: int = 8) -> int:
    """The longest first prompt (a role's system prompt and its first message) of the first ``sample`` training
    tasks, in tokens counted from its characters (:data:`~collab.runtime.projection.CHARS_PER_TOKEN`: no tokenizer
    is loaded yet), with a chat template's own tokens."""
    longest = 0
    for task in islice(env.tasks("train"), sample):
        for role, text in zip(env.roles, env.observe(task)):
            longest = max(longest, len(role.system_prompt or "") + len(text))
    return ceil(longest / CHARS_PER_TOKEN) + TEMPLATE_TOKENS


def tree(module, env, agents: int) -> tuple[int, int]:
    """``(samples a request, children a node)`` of ``module``'s rollout with ``agents`` agents: MAGRPO's K and its
    tree's branching (K joint actions a node aligned, K^agents crossed), or K and 1 for its ``rollout_mode: episodes``
    (K episodes of a task, each going on alone) and for AT-GRPO's tree (one joint action of a turn goes on); an
    episode's 1 and 1."""
    if not hasattr(module, "joint_mode"):
        return 1, 1
    k = getattr(module, "k", None) or getattr(env, "num_generations", 4)
    if getattr(module, "rollout_mode", "tree") == "episodes" or getattr(module, "keep", "all") == "best":
        return k, 1
    return k, k if module.joint_mode == "aligned" else k**agents


def team_shapes(names: list[str]) -> dict[str, tuple[Shape, int]] | None:
    """Each base's shape and parameters, read without loading it; None when one is not at hand."""
    out = {}
    for name in dict.fromkeys(names):
        values, params = base_config(name), base_parameters(name)
        shape = shape_from_config(values) if values else None
        if shape is None or not params:
            return None
        out[name] = shape, params
    return out


Plan = Callable[[int], tuple[Projection, Workload, Shape]]
"""A team's projection for a number of agents (the workload and the largest base's shape with it)."""


def team_weights(
    base, specs, shapes: dict[str, tuple[Shape, int]], shards: int = 1, per_model: bool = True
) -> tuple[int, int, int]:
    """``(bases, trained, gathered)``: the bytes of the bases the LoRA agents share (each once), of every agent's
    trained parameters with their optimizer state (a LoRA adapter's in float32 with AdamW; a full agent's copy), and,
    under fsdp over ``shards`` processes (the bases and full copies ``1/shards`` each, the adapters whole), what a
    backward pass gathers whole on top (:func:`~collab.runtime.projection.sharded_bytes`, ``per_model`` its)."""
    width = DTYPE_BYTES.get(base.dtype, 4)
    per_param = base_bytes_per_param(base.dtype, base.quantization)
    names = [spec.base or base.name for spec in specs]
    shared = [
        Model(shapes[n][1], per_param) for n in dict.fromkeys(n for n, s in zip(names, specs) if s.finetune != "full")
    ]
    full = [Model(shapes[n][1], width, trains=True) for n, spec in zip(names, specs) if spec.finetune == "full"]
    adapters = sum(
        ADAM_BYTES * lora_parameters(shapes[n][0], spec.lora.r, spec.lora.target_modules or [])
        for n, spec in zip(names, specs)
        if spec.finetune != "full"
    )
    bases, _ = sharded_bytes(shared, shards)
    copies, _ = sharded_bytes(full, shards)
    _, gathered = sharded_bytes(shared + full, shards, per_model=per_model)
    return bases, copies + adapters, gathered


def plan_team(module, env, tasks: int, device, shards: int = 1) -> Plan | None:
    """``agents -> (projection, workload, shape)`` of ``module``'s team on ``env`` with ``tasks`` tasks a process,
    its agents counted as the environment's roles are (or, for what would fit, as a team of that many: the agents
    past the configured ones repeating the last one's settings, :func:`collab.algos.agents.resolve_agents`). The
    caches and activations are counted at the largest base's shape. None when a base's size is not at hand (a hub
    id not downloaded): not checked. ``shards``: the processes fsdp splits each model across (1: none)."""
    from collab.policy.head import CHUNK_BYTES
    from collab.runtime.memory import RECOMPUTE, SAFETY, budget_bytes

    base, specs = module.base, module.team_specs(env)
    shapes = team_shapes([spec.base or base.name for spec in specs])
    if shapes is None:
        return None
    bases, trained, gathered = team_weights(base, specs, shapes, shards, module.passes_per_model)
    width = DTYPE_BYTES.get(base.dtype, 4)
    shape = max((s for s, _ in shapes.values()), key=lambda s: kv_bytes_per_token(s, width))
    rank = max(spec.lora.r for spec in specs)
    per_token = SAFETY * activation_bytes_per_token(shape, width, rank, base.gradient_checkpointing, RECOMPUTE)
    decode, micro = budget_bytes(device, module.decode_memory_gb), budget_bytes(device, module.micro_batch_memory_gb)
    new = [1 if spec.choices else spec.sampling.max_new_tokens or module.max_new_tokens for spec in specs]
    new, first = new[: env.n_agents], first_prompt_tokens(env)
    minibatch = module.update_shape()[1]

    def project(agents: int) -> tuple[Projection, Workload, Shape]:
        responses = new[:agents] + new[-1:] * (agents - len(new))
        samples, branching = tree(module, env, agents)
        prompts = tuple(env.prompt_tokens(first, t, responses) for t in range(env.horizon))
        work = Workload(tasks, agents, max(responses), prompts, samples, branching)
        projection = Projection(
            bases=bases,
            adapters=trained * agents // env.n_agents,
            experience=experience_bytes(work),
            rollout=rollout_bytes(work, kv_bytes_per_token(shape, width), shape.vocab, decode),
            update=update_bytes(work, per_token, module.micro_batch_tokens, micro, minibatch, CHUNK_BYTES),
            fixed=OVERHEAD_BYTES,
            gathered=gathered,
        )
        return projection, work, shape

    return project


def training_factor(specs) -> float:
    """Multiples of a token's parameters an update costs, over the team: a LoRA agent's and a full agent's."""
    from collab.runtime.projection import FULL_TRAINING, LORA_TRAINING

    return sum(FULL_TRAINING if spec.finetune == "full" else LORA_TRAINING for spec in specs) / max(1, len(specs))


def accelerator_kind(trainer) -> str:
    """``cpu``, ``gpu`` or ``other``: Lightning's resolved accelerator."""
    name = type(trainer.accelerator).__name__
    return "cpu" if name == "CPUAccelerator" else ("gpu" if name == "CUDAAccelerator" else "other")


def forks(trainer) -> bool:
    """Whether the launcher forks this process (``ddp_fork``, ``ddp_notebook``): CUDA must not start before."""
    return getattr(getattr(trainer.strategy, "launcher", None), "_start_method", None) == "fork"


def gpu_free() -> int | None:
    """Free bytes of the first CUDA device, the one this process (rank 0) trains on; the others of a node are
    taken to be alike (asking each would give this process a CUDA context on every device). None: no GPU."""
    import torch

    return torch.cuda.mem_get_info(0)[0] if torch.cuda.is_available() else None


def check_team(trainer, module, env, tasks: int) -> str | None:
    """Refuse, in one line, a team that cannot fit this machine, before anything is loaded; return a large team's
    start line (its projected memory and a step's projected time), None for a small one or one not counted (a
    base's size not at hand, an accelerator this check does not measure, a forking launcher on a GPU, or vLLM
    decoding: it sizes its own cache, ``engine_options``)."""
    import torch

    from collab.policy.models import DTYPES
    from collab.runtime.projection import matmul_rate

    accelerator = accelerator_kind(trainer)
    if accelerator == "other" or (accelerator == "gpu" and forks(trainer)) or module.engine != "torch":
        return None
    device = torch.device("cuda" if accelerator == "gpu" else "cpu")
    project = plan_team(module, env, -(-tasks // max(1, trainer.world_size)), device, shards(trainer))
    if project is None:
        return None
    machine = this_machine()
    if accelerator == "gpu":
        machine = Machine(machine.cores, machine.memory_available, machine.gpus, gpu_free())
    processes = trainer.num_devices
    projection, work, shape = project(env.n_agents)
    short = shortage(projection, processes, machine, accelerator)
    if short is not None:
        fits = most_agents(lambda m: shortage(project(m)[0], processes, machine, accelerator) is None, env.n_agents)
        raise UserError(refusal(env.n_agents, projection, short, fits))
    flops = step_flops(work, shape, training_factor(module.team_specs(env)))
    rate = matmul_rate(device, DTYPES[module.base.dtype])
    if env.n_agents <= LARGE_TEAM and min(flops, 10**300) / rate <= LONG_STEP_S:
        return None
    return start_line(projection, work, flops, rate, machine, accelerator)
