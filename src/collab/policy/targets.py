"""LoRA targets: which layers of a causal LM an agent's adapter reaches, whatever its architecture.

:func:`model_layers` sorts a model's layers by role (decoder linear layers, output head, routers and experts of
mixtures of experts, GPT-2's ``Conv1D``); :func:`lora_targets` turns an agent's ``target_modules`` (``all-linear``
or layer names) into peft's target list on that model, and :func:`lora_config` into peft's ``LoraConfig``;
:func:`targets_report` says what LoRA adapts on each base of a team. Used by :class:`collab.policy.team.AgentTeam`
for the agents and by :mod:`collab.algos.llm_critics` for the critics.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from torch import nn

from collab.errors import UserError

ALL_LINEAR = "all-linear"
"""``target_modules`` entry that stands for every linear layer of the decoder (:func:`lora_targets`)."""


def _conv1d(module: nn.Module) -> bool:
    """GPT-2's ``Conv1D``: a linear layer whose weight is stored transposed."""
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, Conv1D)


def _linear(module: nn.Module) -> bool:
    """An ``nn.Linear`` (bitsandbytes' 4- and 8-bit layers are subclasses) or GPT-2's ``Conv1D``."""
    return isinstance(module, nn.Linear) or _conv1d(module)


def in_layer(path: str) -> str:
    """A module's path inside its decoder layer: ``model.layers.3.mlp.gate`` -> ``mlp.gate``."""
    return re.sub(r"^.*?\.\d+\.", "", path)


@dataclass
class Layers:
    """The layers of a causal LM that LoRA could reach, by role (:func:`model_layers`); paths as in the model."""

    linear: list[str] = field(default_factory=list)
    """Linear layers of the decoder (attention, MLP, a shared expert's MLP): what ``all-linear`` adapts."""
    head: list[str] = field(default_factory=list)
    """The output head (left out: it is as large as the vocabulary, and collab computes it in chunks)."""
    routers: list[str] = field(default_factory=list)
    """The gates of mixtures of experts, which choose each token's experts (and Qwen2-MoE's shared expert's weight)."""
    experts: list[str] = field(default_factory=list)
    """The experts modules of mixtures of experts."""
    expert_linear: list[str] = field(default_factory=list)
    """Linear layers inside experts (transformers 4's per-expert ``nn.Linear``; 5's experts are 3-D parameters)."""
    conv1d: list[str] = field(default_factory=list)
    """The linear layers that are GPT-2's ``Conv1D`` (weights stored transposed)."""
    modules: list[str] = field(default_factory=list)
    """Every module's path (what a target name may match)."""

    def names(self, paths: list[str]) -> list[str]:
        """The distinct last parts of ``paths``, in order."""
        return list(dict.fromkeys(p.rsplit(".", 1)[-1] for p in paths))


def model_layers(model: nn.Module) -> Layers:
    """Sort a causal LM's (not yet adapted) linear layers by role. A mixture of experts is a module with an
    ``experts`` child (Mixtral's and Qwen2-MoE's sparse blocks); its other childless children (``gate``,
    Qwen2-MoE's ``shared_expert_gate``) are its routers, and a module under its experts is an expert's."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    moe = [p for p, m in model.named_modules() if isinstance(getattr(m, "experts", None), nn.Module)]
    out = Layers()
    for path, m in model.named_modules():
        out.modules.append(path)
        block = next((b for b in moe if b and path.startswith(f"{b}.")), None)
        rest = path[len(block) + 1 :].split(".") if block else []
        if m is head:
            out.head.append(path)
        elif rest[:1] == ["experts"]:
            if len(rest) == 1:
                out.experts.append(path)
            elif _linear(m):
                out.expert_linear.append(path)
        elif len(rest) == 1 and not any(True for _ in m.children()) and any(True for _ in m.parameters()):
            out.routers.append(path)
        elif _linear(m):
            out.linear.append(path)
        if _conv1d(m):
            out.conv1d.append(path)
    return out


def _matches(path: str, name: str) -> bool:
    """Whether peft's target name ``name`` picks the module at ``path`` (the path itself or its end)."""
    return path == name or path.endswith(f".{name}")


@dataclass
class Targets:
    """What one agent's ``target_modules`` adapts on its base (:func:`lora_targets`): the arguments of peft's
    ``LoraConfig``."""

    target_modules: list[str]
    exclude_modules: list[str]
    """Routers and experts' layers that share a name with a target (``exclude_modules``)."""
    fan_in_fan_out: bool
    """GPT-2's ``Conv1D`` among the targets: its weight is stored transposed (peft's ``fan_in_fan_out``)."""


def lora_targets(layers: Layers, requested: list[str], option: str, where: str) -> Targets:
    """peft's target list for ``requested`` (an agent's ``target_modules``) on a model of ``layers``.

    ``all-linear`` is every linear layer of the decoder (:attr:`Layers.linear`) by name: Llama's ``q_proj`` ...
    ``down_proj``, Phi-3's fused ``qkv_proj`` and ``gate_up_proj``, GPT-NeoX's ``query_key_value`` ...,
    GPT-2's ``Conv1D`` layers ``c_attn``, ``c_proj``, ``c_fc``. It is peft's own ``all-linear`` (which leaves
    out the output head) less the routers and experts of mixtures of experts:

    - a router picks each token's experts: adapting it changes which experts run, not how (and Qwen2-MoE's
      ``shared_expert_gate`` has one output, fewer than a LoRA rank);
    - transformers 5 stores all experts of a layer as 3-D parameters, which LoRA on linear layers does not
      reach. peft's ``target_parameters`` adds an adapter's update to such a parameter for a whole forward:
      one adapter per forward, where collab's batches mix the agents row by row
      (:mod:`collab.policy.lora_batch`) and an expert sees only its tokens, without their rows.

    The attention and the dense layers (a shared expert's included) are adapted in every family. Resolving the
    shorthand here rather than in peft keeps the saved adapter's ``target_modules`` a list of names, as vLLM
    and other tools read them. Other entries are layer names as peft matches them (a module's path or its
    end); a name that matches no module is a UserError naming the model's linear layers.
    """
    names: list[str] = []
    for entry in requested:
        if entry == ALL_LINEAR:
            names += layers.names(layers.linear)
        elif not any(_matches(p, entry) for p in layers.modules):
            every = layers.names(layers.linear + layers.head + layers.routers + layers.expert_linear)
            raise UserError(
                f"{option}: no layer {entry!r} in {where}; its linear layers: {' '.join(every)} "
                f"(or {ALL_LINEAR}: all but {' '.join(layers.names(layers.head)) or 'the head'})"
            )
        else:
            names.append(entry)
    names = list(dict.fromkeys(names))
    # all-linear's names may also name a left-out module (transformers 4's experts are Llama-like MLPs)
    left_out = layers.routers + layers.expert_linear + layers.head if ALL_LINEAR in requested else []
    exclude = [p for p in left_out if any(_matches(p, n) for n in names if n not in requested)]
    conv1d = any(_matches(p, n) for p in layers.conv1d for n in names)
    return Targets(names, exclude, conv1d)


def lora_config(layers: Layers, lora, option: str, where: str):
    """peft's ``LoraConfig`` for a :class:`LoraSpec` (or any object with ``r``, ``alpha``, ``target_modules`` and
    optionally ``dropout``) on a model of ``layers`` (:func:`lora_targets`); ``option`` and ``where`` name the
    setting and the model in errors."""
    from peft import LoraConfig

    targets = lora_targets(layers, list(lora.target_modules), option, where)
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=getattr(lora, "dropout", 0.0),
        target_modules=targets.target_modules,
        exclude_modules=targets.exclude_modules or None,
        fan_in_fan_out=targets.fan_in_fan_out,
        bias="none",
        task_type="CAUSAL_LM",
    )


def targets_report(team) -> str:
    """What LoRA adapts on each base of ``team`` (an :class:`~collab.policy.team.AgentTeam`), one line per base (per
    distinct target set when its agents differ): ``LoRA targets (base0, LlamaForCausalLM): q_proj k_proj v_proj
    o_proj gate_proj up_proj down_proj (30 layers x 7)``, and for a mixture of experts what is not adapted
    (:func:`lora_targets`)."""
    from peft.tuners.lora import LoraLayer

    lines = []
    for base in team.pool.bases:
        if base.full:  # a full-parameter agent's model: no LoRA (collab.policy.full)
            continue
        model = base.model
        agents = [i for i, agent in enumerate(team.agents) if agent.base is base]
        adapted: dict[tuple[str, ...], list[int]] = {}
        for i in agents:
            paths = [
                p
                for p, m in model.get_base_model().named_modules()
                if isinstance(m, LoraLayer) and team.names[i] in m.lora_A
            ]
            adapted.setdefault(tuple(paths), []).append(i)
        for paths, who in adapted.items():
            names = list(dict.fromkeys(p.rsplit(".", 1)[-1] for p in paths))
            per_layer: dict[str, int] = {}
            for p in paths:
                block = p[: len(p) - len(in_layer(p))]
                per_layer[block] = per_layer.get(block, 0) + 1
            counts = set(per_layer.values())
            size = f"{len(per_layer)} layers x {counts.pop()}" if len(counts) == 1 else f"{len(paths)} modules"
            label = base.key + ("" if len(adapted) == 1 else ", " + " ".join(team.names[i] for i in who))
            line = f"LoRA targets ({label}, {type(model.get_base_model()).__name__}): {' '.join(names)} ({size})"
            layers = base.layers
            if layers.experts:
                routers = " ".join(dict.fromkeys(in_layer(p) for p in layers.routers))
                experts = " ".join(dict.fromkeys(in_layer(p) for p in layers.experts))
                kind = "" if layers.expert_linear else " (3-D parameters)"
                line += f"; not adapted: routers {routers}, experts {experts}{kind}"
            lines.append(line)
    return "\n".join(lines)
