"""peft adapters on a shared base: which of them train, running the base without them, and gradient
checkpointing whose recomputation runs the adapters the forward ran.

Several agents' (and critics') LoRA adapters live in one ``PeftModel`` over one copy of the base weights. peft
keeps one adapter active and trainable at a time (``set_adapter``); collab trains all of them at once, except
those frozen by :meth:`collab.policy.team.AgentTeam.freeze` (:func:`train_adapters_only`).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

from torch import nn

from collab.policy.models import checkpointing_enable


def is_peft(model: nn.Module) -> bool:
    """Whether ``model`` holds peft adapters (a ``PeftModel``), not a plain transformers model (a full-parameter
    agent's copy, or the frozen base of full agents: :mod:`collab.policy.full`)."""
    return hasattr(model, "peft_config")


def train_adapters_only(model: nn.Module) -> None:
    """Mark every LoRA parameter of ``model`` trainable and everything else frozen (``set_adapter``
    leaves only the active adapter trainable; this restores all of them), except the adapters frozen by
    :meth:`collab.policy.team.AgentTeam.freeze` (named in the model's ``collab_frozen``). A model without adapters
    trains whole when it is a full agent's copy that is not frozen, else stays frozen."""
    if not is_peft(model):
        model.requires_grad_(bool(getattr(model, "collab_full", False)) and not getattr(model, "collab_frozen", ()))
        return
    frozen = [f".{name}." for name in getattr(model, "collab_frozen", ())]
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name and not any(tag in name for tag in frozen))


@contextmanager
def adapters_disabled(model):
    """Run ``model`` (a peft model) as its base alone: peft's ``disable_adapter()``. On exit peft
    re-enables only the active adapter (leaving the others frozen), so every adapter is made
    trainable again. A model without adapters runs as it is."""
    if not is_peft(model):
        yield
        return
    try:
        with model.disable_adapter():
            yield
    finally:
        train_adapters_only(model)


class eval_mode:
    """``with eval_mode(module):`` runs ``module`` in eval mode (no dropout), then restores its mode."""

    def __init__(self, module: nn.Module) -> None:
        self.module, self.was = module, module.training

    def __enter__(self):
        self.module.eval()

    def __exit__(self, *exc):
        self.module.train(self.was)


def recompute_with_forward_adapters(model) -> None:
    """Gradient checkpointing of a peft model whose recomputation uses the adapters its forward used.

    A checkpointed layer's forward is recomputed inside the backward, with the modules' state at *that* time. A
    call that computes several agents' log-probs on one base sets each agent's adapter in turn
    (``set_adapter``) before the loss's one backward, so every recomputed layer would run the *last* agent's
    adapter: gradients off by more than their own size (tests/policy/test_team.py). Here every checkpointed
    forward records each LoRA layer's active adapter and disabled flag, and its recomputation runs under them
    (``torch.utils.checkpoint``'s ``context_fn``, non-reentrant)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    cache: dict[tuple, list] = {}

    def layers() -> list:  # adapters added later (a critic's) may add LoRA layers
        key = tuple(model.peft_config)
        if key not in cache:
            cache.clear()
            cache[key] = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
        return cache[key]

    @contextmanager
    def as_in_forward(state):
        found = layers()
        saved = [(m._active_adapter, m._disable_adapters) for m in found]
        for m, (active, disabled) in zip(found, state):
            m._active_adapter, m._disable_adapters = active, disabled
        try:
            yield
        finally:
            for m, (active, disabled) in zip(found, saved):
                m._active_adapter, m._disable_adapters = active, disabled

    def context_fn():
        state = [(m._active_adapter, m._disable_adapters) for m in layers()]
        return nullcontext(), as_in_forward(state)

    checkpointing_enable(model.base_model.model, {"use_reentrant": False, "context_fn": context_fn})
