"""The pool of models: each base a team's agents share, each full agent's own copy and each critic's base is one
:class:`Base`; an agent is a base plus its LoRA adapter, or none (a full agent trains the base itself: an
:class:`Agent`).

A base's ``key`` is its name in the ``nn.ModuleDict`` that holds it (the team's ``models``: ``base0``, ``full1``; a
critic's own: ``critic_base``): the checkpoint's parameter names (``team.models.base0.…``) and the LoRA report's
label, nothing is looked up by it. The reference policy of an agent is its :attr:`Agent.reference` base before any
training: a ``PeftModel`` run with its adapters disabled, or the frozen copy of a full agent's base
(:meth:`Pool.untrained`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from collab.policy import full
from collab.policy.adapters import eval_mode, is_peft
from collab.policy.kv_cache import cache_key
from collab.policy.models import BaseConfig, load_model, load_tokenizer
from collab.policy.prefill import prefill
from collab.policy.targets import Layers, model_layers


@dataclass(eq=False)
class Base:
    """One model of the pool: a ``PeftModel`` holding the adapters of the agents (and critics) on it, or a full
    agent's own copy (``full``: every weight trains, no adapters)."""

    key: str
    """Its name in the ``nn.ModuleDict`` that holds it (the checkpoint's parameter names)."""
    name: str
    """The base's name (``model.base.name`` or an agent's ``base``)."""
    model: nn.Module
    tokenizer: Any
    layers: Layers
    """Its linear layers by role (:func:`~collab.policy.targets.model_layers`), as loaded (before any adapter)."""
    full: bool = False
    cache_bytes: float | None = field(default=None, repr=False)
    """:meth:`cache_bytes_per_token` once measured."""

    @property
    def architecture(self) -> str:
        """The class name of its transformers model (``LlamaForCausalLM``)."""
        return type(self.model.get_base_model() if is_peft(self.model) else self.model).__name__

    def cache_bytes_per_token(self) -> float:
        """Bytes of KV cache one token takes on this base (every layer's keys and values), measured once on a probe
        prompt of 8 tokens: exact for any architecture's cache layout and dtype."""
        if self.cache_bytes is None:
            model, probe = self.model, list(range(10, 18))
            adapter = next(iter(getattr(model, "peft_config", None) or ["none"]))  # its first agent's
            with eval_mode(model), torch.no_grad():
                out, _, _ = prefill(
                    model, [probe], [adapter], self.tokenizer.pad_token_id, model.get_input_embeddings().weight.device
                )
            layers = [layer for layer in out[cache_key()].layers if getattr(layer, "keys", None) is not None]
            self.cache_bytes = sum(layer.keys.nbytes + layer.values.nbytes for layer in layers) / len(probe)
        return self.cache_bytes


@dataclass(eq=False)
class Agent:
    """An agent: a base plus its LoRA adapter (named ``name``), or none (``base.full``: it trains the base itself)."""

    name: str
    base: Base
    reference: Base
    """The base whose untrained weights are its reference policy: its own (a LoRA agent), the one the LoRA agents
    on its base name share (a full agent), else its own base's frozen copy (:meth:`Pool.untrained`)."""

    @property
    def adapter(self) -> str | None:
        """Its LoRA adapter's name on :attr:`base`; None for a full agent."""
        return None if self.base.full else self.name

    def parameters(self) -> list[nn.Parameter]:
        """What trains: its LoRA adapter's parameters, or every parameter of a full agent's model."""
        if self.base.full:
            return list(self.base.model.parameters())
        tag = f".{self.name}."
        return [p for n, p in self.base.model.named_parameters() if "lora_" in n and tag in n]


def load_base(key: str, name: str, config: BaseConfig, full_copy: bool = False) -> Base:
    """Base ``name`` loaded as ``config`` says (a full agent's trainable copy: ``full_copy``), with its tokenizer."""
    config = BaseConfig(**{**asdict(config), "name": name})
    model = full.load_full(config) if full_copy else load_model(config)
    return Base(key, name, model, load_tokenizer(name), model_layers(model), full_copy)


class Pool:
    """A team's bases in loading order; ``models`` (the team's submodule ``models``) holds their weights."""

    def __init__(self, config: BaseConfig) -> None:
        self.config = config
        self.models = nn.ModuleDict()
        self.bases: list[Base] = []
        self.frozen: dict[str, nn.Module] = {}
        """Base name -> the untrained copy of full agents' base (not a submodule: nothing of it trains or is saved)."""

    def add(self, base: Base) -> Base:
        self.bases.append(base)
        self.models[base.key] = base.model
        return base

    def lora_base(self, name: str) -> Base | None:
        """The ``PeftModel`` base that the LoRA agents on base ``name`` share; None when none is on it. A full agent's
        reference and a critic naming that base run on it (a second copy of a 4B base: 8 GB in bfloat16)."""
        return next((b for b in self.bases if not b.full and b.name == name), None)

    def untrained(self, base: Base, device) -> nn.Module:
        """``base``'s weights before any training: the ``PeftModel`` (to run with its adapters disabled), or the frozen
        copy of a full agent's base, loaded on ``device`` once per base name on first use
        (:func:`~collab.policy.full.load_frozen`)."""
        if not base.full:
            return base.model
        if base.name not in self.frozen:
            self.frozen[base.name] = full.load_frozen(BaseConfig(**{**asdict(self.config), "name": base.name}), device)
        return self.frozen[base.name]
