"""Full-parameter agents (``model.agents[i].finetune: full``): an agent that owns a trainable copy of its whole base.

CoLLM's and MAGRPO's setting (CoMLRL's default) trains every weight of each agent, where collab's default agent is a
LoRA adapter over a base its team shares (:mod:`collab.policy.team`). A full agent is a plain transformers model, every
parameter trainable, under its own key in the team's ``models`` (``full<i>``, agent i's); it decodes and is scored like
a base without adapters (a row's adapter name is ignored on a model without adapters:
:class:`~collab.policy.lora_batch.AdapterRows`). LoRA agents on the same base name keep sharing one ``PeftModel``; one
team may mix both. What follows (the reference policy, checkpoints, memory, several devices, vLLM): docs/models.md,
*Full-parameter agents*. Here: :data:`COPIES` (weights, gradients and AdamW's two moments: 16 bytes a parameter in
float32, 8 in bfloat16, no float32 master copy), :func:`check_fits` and :func:`memory_line` (the team against its
device, before anything loads), :func:`check_full_agents` (a quantized base refused in one line).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from collab.errors import UserError, require
from collab.runtime.projection import FULL_COPIES, Model, sharded_bytes

COPIES = FULL_COPIES
"""Tensors of a parameter's size that a full agent holds while training: the weight, its gradient and AdamW's two
moments (``exp_avg``, ``exp_avg_sq``, in the parameter's dtype)."""
QLORA_BYTES = 0.55
"""Bytes a parameter of a 4-bit NF4 base with double-quantized scales (as :mod:`collab.cli.resources` counts)."""
GB = 1024**3


def load_full(config):
    """A full agent's copy of base ``config`` (a :class:`~collab.policy.models.BaseConfig`): the base as
    :func:`~collab.policy.models.load_model` loads it (on its device, without dropout), every parameter trainable."""
    from collab.policy.models import load_model

    model = load_model(config)
    model.collab_full = True
    model.requires_grad_(True)
    return model


def load_frozen(config, device: torch.device):
    """The untrained base of full agents that no LoRA agent shares, loaded on ``device`` under a forked random state
    (the run's generators untouched); frozen, in eval mode."""
    from collab.policy.models import BaseConfig, load_model

    config = BaseConfig(**{**asdict(config), "device": str(device), "gradient_checkpointing": False})
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        return load_model(config)


def check_full_agents(agents, base) -> None:
    """Full agents on a quantized base: refused in one line (bitsandbytes' 4- and 8-bit weights do not train)."""
    full = [i for i, spec in enumerate(agents or []) if spec.finetune == "full"]
    require(
        not full or base.quantization == "none",
        f"model.agents[{full[0] if full else 0}].finetune full trains every weight of its base, which "
        f"--model.base.quantization {base.quantization} stores in 4 or 8 bits that do not train: use "
        "--model.base.quantization none, or finetune: lora (QLoRA: LoRA over the quantized base)",
    )


def dtype_bytes(dtype: str) -> int:
    from collab.policy.models import DTYPES

    return torch.empty((), dtype=DTYPES[dtype]).element_size()


def device_bytes(device: torch.device) -> int | None:
    """The device's total memory (a GPU's, or the RAM as the cgroup limits it on a CPU); None where unknown."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "cpu":
        from collab.runtime.memory import total_ram

        return total_ram()
    return None


def team_bytes(agents, base) -> tuple[int, int, dict[str, int]] | None:
    """``(full, shared, params)`` of a team before loading: the bytes its full agents hold (:data:`COPIES` x each
    one's parameters), the bytes of the bases its LoRA agents share (each once, at its dtype), and the parameters of
    each base name; None when some base's size is not at hand."""
    from collab.policy.models import base_parameters

    names = [spec.base or base.name for spec in agents]
    params = {name: base_parameters(name) for name in dict.fromkeys(names)}
    if not all(params.values()):
        return None
    per_param = dtype_bytes(base.dtype)
    full = sum(COPIES * per_param * params[n] for n, s in zip(names, agents) if s.finetune == "full")
    lora = {n for n, s in zip(names, agents) if s.finetune != "full"}
    return full, sum(per_param * params[n] for n in lora), params


def check_fits(agents, base, device: torch.device, capacity: int | None = None, shards: int = 1) -> None:
    """Refuse, in one line and before anything is loaded, a team with full agents whose weights, gradients and AdamW
    moments (and the shared bases of its LoRA agents) exceed the device's total memory (``capacity``, default
    :func:`device_bytes`), naming what would fit. Under fsdp over ``shards`` processes each process holds
    ``1/shards`` of every model and a backward pass gathers a model whole on top
    (:func:`~collab.runtime.projection.sharded_bytes`: a full agent's weights and gradients; one model, the least a
    pass gathers: MAPoRL's passes gather every model, which the start-of-run check counts). Activations, the KV
    cache and the LoRA adapters come on top: the check refuses a team that cannot fit, it does not promise that one
    fits."""
    full_agents = [i for i, spec in enumerate(agents) if spec.finetune == "full"]
    if not full_agents:
        return
    sizes = team_bytes(agents, base)
    capacity = device_bytes(device) if capacity is None else capacity
    if sizes is None or capacity is None:
        return
    full, shared, params = sizes
    names = [spec.base or base.name for spec in agents]
    width = dtype_bytes(base.dtype)
    models = [Model(params[n], width, trains=True) for n, s in zip(names, agents) if s.finetune == "full"]
    models += [Model(params[n], width) for n in dict.fromkeys(n for n, s in zip(names, agents) if s.finetune != "full")]
    held, gathered = sharded_bytes(models, shards, per_model=True)
    if held + gathered <= capacity:
        return
    total = sum(params[n] for n in dict.fromkeys(names))
    lora = width * total
    per_param = COPIES * width
    if shards > 1:
        where = (
            f"each of the {shards} fsdp processes holds {size(held)} of them and a backward pass gathers "
            f"{size(gathered)} whole (a model's weights and gradients), more than the {size(capacity)} of {device}"
        )
    else:
        where = f"more than the {size(capacity)} of {device}"
    raise UserError(
        f"model.agents: {len(full_agents)} full-parameter agent(s) (agents {', '.join(map(str, full_agents))}) hold "
        f"{size(full)} (weights, gradients and AdamW's two moments: {per_param} bytes a parameter in {base.dtype}) "
        f"and the shared bases {size(shared)}; {where}: train them as LoRA agents (finetune: lora, about "
        f"{size(lora)} of bases), with QLoRA (finetune: lora and --model.base.quantization 4bit, about "
        f"{size(QLORA_BYTES * total)}), or on a larger device; more processes do not help under ddp (each holds every "
        "full agent), fsdp shards them (--trainer.strategy fsdp)"
    )


def size(n: float) -> str:
    """Bytes as GB (1024**3), or MB below a tenth of one."""
    return f"{n / GB:.2f} GB" if n >= GB / 10 else f"{n / 2**20:.1f} MB"


def memory_line(team) -> str:
    """What each full agent of ``team`` holds, one line for the start of a run ("" without full agents): its
    parameters and the bytes of its weights, gradients and AdamW moments, and their sum against the device's memory."""
    parts, total = [], 0
    for i, agent in enumerate(team.agents):
        if not agent.base.full:
            continue
        model = agent.base.model
        params = sum(p.numel() for p in model.parameters())
        width = next(model.parameters()).element_size()
        total += COPIES * width * params
        parts.append(
            f"{team.names[i]} ({agent.base.name}, {params / 1e6:.1f}M parameters) holds {size(COPIES * width * params)}"
        )
    if not parts:
        return ""
    capacity = device_bytes(team.device)
    of = f" of the {size(capacity)} of {team.device}" if capacity else f" on {team.device}"
    # no float32 master copy: AdamW adds each update to the weight in its own dtype (8 significant bits in bfloat16)
    rounding = (
        "; in 16 bits an update below ~1/256 of a weight rounds away (float32 weights keep it: --model.base.dtype "
        "float32, with --trainer.precision bf16-mixed for 16-bit compute)"
        if width < 4
        else ""
    )
    return (
        f"full-parameter agents: {'; '.join(parts)} (weights, gradients and AdamW's two moments: {COPIES} x {width} "
        f"bytes a parameter); {size(total)} in all{of}{rounding}"
    )


def save_full(model, tokenizer, out: Path, state: dict | None = None) -> None:
    """A full agent as a transformers model folder (config, safetensors, generation config) with its tokenizer: what
    ``AutoModelForCausalLM.from_pretrained(out)`` and :func:`load_full_state` read. ``state``: the model's state
    dict with whole tensors, when its own holds shards (FSDP2)."""
    model.save_pretrained(out, state_dict=state)
    tokenizer.save_pretrained(out)


def load_full_state(model, folder: Path, name: str) -> None:
    """Load a folder written by :func:`save_full` (or any ``save_pretrained`` of the same architecture) into a full
    agent's ``model``: every weight but those tied to a loaded one (an output head that shares the embedding)."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        state.update(load_file(path))
    own = model.state_dict()
    unknown = [k for k in state if k not in own]
    require(not unknown, f"{folder} is not {name}'s model (it has {unknown[:1]}, which {name}'s base lacks)")
    wrong = [k for k in state if state[k].shape != own[k].shape]
    require(not wrong, f"{folder}: {wrong[:1]} has another shape than {name}'s (another base)")
    loaded = {own[k].data_ptr() for k in state}
    missing = [k for k in own if k not in state and own[k].data_ptr() not in loaded]
    require(not missing, f"{folder} lacks {len(missing)} weights of {name}'s model, e.g. {missing[:1]}")
    with torch.no_grad():
        for k, v in state.items():
            own[k].copy_(v)
