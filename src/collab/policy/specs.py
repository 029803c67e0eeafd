"""What one agent of a team is: how it is fine-tuned (a LoRA adapter, or all the parameters of a copy of its base),
how it samples, its learning rate and action vocabulary (:class:`AgentSpec`, the entries of ``--model.agents``);
what every agent takes for a field it leaves out (:class:`AgentDefaults`, ``--model.agent_defaults``, written once
in ``conf/base.yaml``: :func:`with_defaults`); and the checks of those settings (:func:`check_agents`,
:func:`check_agent_defaults`, :func:`check_lora`: one-line UserErrors naming the option).
:class:`~collab.policy.team.AgentTeam` builds its agents from them; ``collab.policy.team`` re-exports every name
here.

An agent's ``finetune``, ``lora`` and ``sampling`` fields are None ("unset") unless given: no value in this file can
disagree with ``conf/``, because an unset field takes the run's ``model.agent_defaults`` (a module's), else
``conf/base.yaml``'s (:func:`packaged_defaults`: an :class:`AgentTeam` built directly).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, fields, replace
from functools import cache

from collab.errors import require

FINETUNES = ("lora", "full")
"""What an agent trains: ``lora``, a LoRA adapter over a base its team shares; ``full``, every parameter of a copy
of its base that it owns (:mod:`collab.policy.full`)."""


@dataclass
class LoraSpec:
    """LoRA adapter hyper-parameters (peft ``LoraConfig``). A field left out (None) is ``model.agent_defaults``'s."""

    r: int | None = None
    """Rank of the update."""
    alpha: int | None = None
    """Scaling numerator: the update is scaled by alpha / r."""
    dropout: float | None = None
    """Dropout on the adapter input. Non-zero values turn off mixed-adapter training forwards."""
    target_modules: list[str] | None = None
    """The layers that get an adapter: layer names (the last part of a module's path, as peft matches them), or
    ``all-linear``: every linear layer of the decoder, whatever the architecture calls it (:func:`lora_targets`)."""


@dataclass
class SamplingSpec:
    """How an agent samples its responses. A field left out (None) is ``model.agent_defaults``'s."""

    temperature: float | None = None
    """0: greedy."""
    top_p: float | None = None
    """1: off."""
    top_k: int | None = None
    """0: off."""
    max_new_tokens: int | None = None
    """Left out here and in ``model.agent_defaults``: the environment role's suggestion (else
    ``model.max_new_tokens``)."""


@dataclass
class AgentSpec:
    """One agent of a team. ``finetune``, ``lora`` and ``sampling`` left out take ``model.agent_defaults``' (key by
    key: ``sampling: {max_new_tokens: 48}`` keeps its temperature); ``role``, ``system_prompt`` and ``choices`` left
    out are the environment role's."""

    role: str = ""
    system_prompt: str | None = None
    base: str | None = None
    """A base model name; ``None``: the team's default base."""
    finetune: str | None = None
    """``lora`` (a LoRA adapter over the base, shared with the team's other LoRA agents on it) or ``full`` (a
    trainable copy of the whole base of its own: 16 bytes a parameter in float32 with AdamW; the papers' CoLLM
    setting, at a rate near 5e-6). ``lora`` is ignored by a full agent."""
    lora: LoraSpec = field(default_factory=LoraSpec)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    lr: float | None = None
    """This agent's learning rate; ``None``: the algorithm's ``agent_lr``."""
    choices: list[str] | None = None
    """Closed action vocabulary (one token each); filled from the environment role."""


@dataclass
class AgentDefaults:
    """What an agent of ``model.agents`` takes for each of these fields it leaves out (``model.agent_defaults``).
    ``conf/base.yaml`` sets every field; a preset, an env's or an algorithm's file or the command line may change
    some (a paper's temperature for all its agents), key by key. Left out here: set by the config."""

    finetune: str | None = None
    """``lora`` or ``full`` (:attr:`AgentSpec.finetune`)."""
    lora: LoraSpec = field(default_factory=LoraSpec)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)


def overlay(under, over):
    """A copy of the dataclass ``under`` with each field that ``over`` (of the same class) sets (not None)."""
    given = {f.name: getattr(over, f.name) for f in fields(over)}
    return replace(copy.deepcopy(under), **{k: copy.deepcopy(v) for k, v in given.items() if v is not None})


def with_defaults(spec: AgentSpec, defaults: AgentDefaults) -> AgentSpec:
    """``spec`` with each field it leaves out taken from ``defaults``, ``lora`` and ``sampling`` field by field: the
    one place an agent's unset values are decided, for the command line, ``from_config`` and a team built in
    Python alike."""
    return replace(
        copy.deepcopy(spec),
        finetune=defaults.finetune if spec.finetune is None else spec.finetune,
        lora=overlay(defaults.lora, spec.lora),
        sampling=overlay(defaults.sampling, spec.sampling),
    )


def leaves_out(spec: AgentSpec) -> bool:
    """Whether ``spec`` leaves out a field that ``model.agent_defaults`` would fill (``max_new_tokens`` aside: null
    is a value of its own, the role's suggestion)."""
    sampling = [getattr(spec.sampling, f.name) for f in fields(spec.sampling) if f.name != "max_new_tokens"]
    lora = [getattr(spec.lora, f.name) for f in fields(spec.lora)]
    return spec.finetune is None or None in lora + sampling


def defaults_from(values: dict) -> AgentDefaults:
    """An :class:`AgentDefaults` from a config's mapping (``model.agent_defaults``)."""
    return AgentDefaults(
        finetune=values.get("finetune"),
        lora=LoraSpec(**(values.get("lora") or {})),
        sampling=SamplingSpec(**(values.get("sampling") or {})),
    )


@cache
def _packaged_block() -> dict:
    from collab.config import load_yaml, packaged_conf

    model = load_yaml(packaged_conf() / "base.yaml", "the packaged config").get("model") or {}
    return model.get("agent_defaults") or {}


def packaged_defaults() -> AgentDefaults:
    """``conf/base.yaml``'s ``model.agent_defaults``: what an agent built without a run's config (an
    :class:`AgentTeam` in a notebook or a test) takes for the fields it leaves out."""
    return defaults_from(copy.deepcopy(_packaged_block()))


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_lora(lora, where: str, complete: bool = True) -> None:
    """LoRA settings peft would refuse (or train nothing with), as one-line UserErrors naming the option. With
    ``complete`` False a field left out (None: from ``model.agent_defaults``, checked on its own) passes."""

    def given(name: str) -> bool:
        return complete or getattr(lora, name, None) is not None

    require(
        not given("r") or (isinstance(lora.r, int) and not isinstance(lora.r, bool) and lora.r >= 1),
        f"{where}.r (the LoRA rank) must be an integer >= 1, got {lora.r!r}",
    )
    require(
        not given("alpha") or (_number(lora.alpha) and lora.alpha > 0),
        f"{where}.alpha must be > 0 (the update is scaled by alpha / r), got {lora.alpha!r}",
    )
    dropout = getattr(lora, "dropout", 0.0)
    require(
        not given("dropout") or (_number(dropout) and 0 <= dropout < 1),
        f"{where}.dropout must be in [0, 1), got {dropout!r}",
    )
    modules = lora.target_modules
    require(
        not given("target_modules")
        or (isinstance(modules, (list, tuple)) and len(modules) > 0 and all(isinstance(m, str) and m for m in modules)),
        f"{where}.target_modules must be a non-empty list of layer names (e.g. [all-linear] or [q_proj, v_proj]), "
        f"got {modules!r}",
    )


def check_sampling(s: SamplingSpec, where: str, complete: bool = True) -> None:
    """Sampling settings in range, as one-line UserErrors naming the option (``complete``: as :func:`check_lora`).
    ``max_new_tokens`` may be null anywhere (the role's suggestion)."""
    for name, ok, valid in (
        ("temperature", lambda v: _number(v) and v >= 0, ">= 0 (0: greedy)"),
        ("top_p", lambda v: _number(v) and 0 < v <= 1, "in (0, 1] (1: off)"),
        ("top_k", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0 (0: off)"),
    ):
        value = getattr(s, name)
        require((value is None and not complete) or ok(value), f"{where}.{name} must be {valid}, got {value!r}")
    require(
        s.max_new_tokens is None or (isinstance(s.max_new_tokens, int) and s.max_new_tokens >= 1),
        f"{where}.max_new_tokens must be >= 1 or null (the role's default), got {s.max_new_tokens!r}",
    )


def check_finetune(finetune, where: str, complete: bool = True) -> None:
    require(
        (finetune is None and not complete) or finetune in FINETUNES,
        f"{where}.finetune must be one of {', '.join(FINETUNES)} (lora: an adapter over the shared base; "
        f"full: every parameter of a copy of its own), got {finetune!r}",
    )


def check_agent_defaults(defaults: AgentDefaults, option: str = "model.agent_defaults") -> None:
    """The block every agent overlays, whole and in range (a UserError naming the first bad field:
    ``model.agent_defaults.sampling.top_p must be in (0, 1] ...``)."""
    check_finetune(defaults.finetune, option)
    check_lora(defaults.lora, f"{option}.lora")
    check_sampling(defaults.sampling, f"{option}.sampling")


def check_agents(agents: list[AgentSpec] | None, option: str = "model.agents") -> None:
    """Every agent's fine-tuning, LoRA, sampling and learning-rate settings in range; a UserError naming the first bad
    one (``model.agents[1].sampling.top_p must be in (0, 1] ...``). A field left out (None) passes: it is
    ``model.agent_defaults``', checked by :func:`check_agent_defaults`."""
    for i, spec in enumerate(agents or []):
        where = f"{option}[{i}]"
        check_finetune(spec.finetune, where, complete=False)
        check_lora(spec.lora, f"{where}.lora", complete=False)
        check_sampling(spec.sampling, f"{where}.sampling", complete=False)
        require(
            spec.lr is None or (_number(spec.lr) and spec.lr > 0),
            f"{where}.lr must be > 0, or null for model.agent_lr, got {spec.lr!r}",
        )
        require(
            spec.choices is None or (len(spec.choices) > 0 and all(isinstance(c, str) and c for c in spec.choices)),
            f"{where}.choices must be a non-empty list of actions or null, got {spec.choices!r}",
        )
