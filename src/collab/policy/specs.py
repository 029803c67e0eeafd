"""What one agent of a team is: how it is fine-tuned (a LoRA adapter, the default, or all the parameters of a copy
of its base), how it samples, its learning rate and action vocabulary (:class:`AgentSpec`, the entries of
``--model.agents``), and the checks of those settings (:func:`check_agents`,
:func:`check_lora`: one-line UserErrors naming the option). :class:`~collab.policy.team.AgentTeam` builds its
agents from them; ``collab.policy.team`` re-exports every name here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from collab.errors import require
from collab.policy.targets import ALL_LINEAR

FINETUNES = ("lora", "full")
"""What an agent trains: ``lora``, a LoRA adapter over a base its team shares; ``full``, every parameter of a copy
of its base that it owns (:mod:`collab.policy.full`)."""


@dataclass
class LoraSpec:
    """LoRA adapter hyper-parameters (peft ``LoraConfig``)."""

    r: int = 8
    """Rank of the update."""
    alpha: int = 16
    """Scaling numerator: the update is scaled by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapter input. Non-zero values turn off mixed-adapter training forwards."""
    target_modules: list[str] = field(default_factory=lambda: [ALL_LINEAR])
    """The layers that get an adapter: layer names (the last part of a module's path, as peft matches them), or
    ``all-linear`` (the default): every linear layer of the decoder, whatever the architecture calls it
    (:func:`lora_targets`)."""


@dataclass
class SamplingSpec:
    """How an agent samples its responses."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    max_new_tokens: int | None = None
    """``None``: the environment role's suggestion (else 128)."""


@dataclass
class AgentSpec:
    """One agent of a team. Empty fields are filled from the environment's role for the agent."""

    role: str = ""
    system_prompt: str | None = None
    base: str | None = None
    """A base model name; ``None``: the team's default base."""
    finetune: str = "lora"
    """``lora`` (a LoRA adapter over the base, shared with the team's other LoRA agents on it) or ``full`` (a
    trainable copy of the whole base of its own: 16 bytes a parameter in float32 with AdamW; the papers' CoLLM
    setting, at a rate near 5e-6). ``lora`` is ignored by a full agent."""
    lora: LoraSpec = field(default_factory=LoraSpec)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    lr: float | None = None
    """This agent's learning rate; ``None``: the algorithm's ``agent_lr``."""
    choices: list[str] | None = None
    """Closed action vocabulary (one token each); filled from the environment role."""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_lora(lora, where: str) -> None:
    """LoRA settings peft would refuse (or train nothing with), as one-line UserErrors naming the option."""
    require(
        isinstance(lora.r, int) and not isinstance(lora.r, bool) and lora.r >= 1,
        f"{where}.r (the LoRA rank) must be an integer >= 1, got {lora.r!r}",
    )
    require(
        _number(lora.alpha) and lora.alpha > 0,
        f"{where}.alpha must be > 0 (the update is scaled by alpha / r), got {lora.alpha!r}",
    )
    dropout = getattr(lora, "dropout", 0.0)
    require(_number(dropout) and 0 <= dropout < 1, f"{where}.dropout must be in [0, 1), got {dropout!r}")
    modules = lora.target_modules
    require(
        isinstance(modules, (list, tuple)) and len(modules) > 0 and all(isinstance(m, str) and m for m in modules),
        f"{where}.target_modules must be a non-empty list of layer names (e.g. [all-linear] or [q_proj, v_proj]), "
        f"got {modules!r}",
    )


def check_agents(agents: list[AgentSpec] | None, option: str = "model.agents") -> None:
    """Every agent's fine-tuning, LoRA, sampling and learning-rate settings in range; a UserError naming the first bad
    one (``model.agents[1].sampling.top_p must be in (0, 1] ...``)."""
    for i, spec in enumerate(agents or []):
        where = f"{option}[{i}]"
        require(
            spec.finetune in FINETUNES,
            f"{where}.finetune must be one of {', '.join(FINETUNES)} (lora: an adapter over the shared base; "
            f"full: every parameter of a copy of its own), got {spec.finetune!r}",
        )
        check_lora(spec.lora, f"{where}.lora")
        s = spec.sampling
        require(
            _number(s.temperature) and s.temperature >= 0,
            f"{where}.sampling.temperature must be >= 0 (0: greedy), got {s.temperature!r}",
        )
        require(
            _number(s.top_p) and 0 < s.top_p <= 1, f"{where}.sampling.top_p must be in (0, 1] (1: off), got {s.top_p!r}"
        )
        require(
            isinstance(s.top_k, int) and s.top_k >= 0,
            f"{where}.sampling.top_k must be an integer >= 0 (0: off), got {s.top_k!r}",
        )
        require(
            s.max_new_tokens is None or (isinstance(s.max_new_tokens, int) and s.max_new_tokens >= 1),
            f"{where}.sampling.max_new_tokens must be >= 1 or null (the role's default), got {s.max_new_tokens!r}",
        )
        require(
            spec.lr is None or (_number(spec.lr) and spec.lr > 0),
            f"{where}.lr must be > 0, or null for model.agent_lr, got {spec.lr!r}",
        )
        require(
            spec.choices is None or (len(spec.choices) > 0 and all(isinstance(c, str) and c for c in spec.choices)),
            f"{where}.choices must be a non-empty list of actions or null, got {spec.choices!r}",
        )
