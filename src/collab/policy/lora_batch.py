"""Mixed-adapter batches in three tensor ops per layer.

peft runs a batch whose rows use different LoRA adapters (``adapter_names=``) by looping, in Python,
over the adapters inside every LoRA layer on every forward, and re-registers its hooks on every call.
For the short decoding steps of a rollout that bookkeeping costs more than the matrix products. Here
each row's adapter weights are gathered once per batch layout into stacked tensors, and a LoRA layer
computes ``base(x) + bmm(bmm(x, A_rows^T), (s * B)_rows^T)`` for all rows at once (adapters of
different ranks are zero-padded to the largest rank, which leaves the product unchanged). Gradients
flow to the adapters through the gather, so the same path serves teacher-forced training forwards.

Layers without an adapter for some row contribute nothing for that row. DoRA and other LoRA variants
are not covered: :func:`supported` tells, and callers fall back to peft's own path.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


def _lora_layers(model: nn.Module):
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer) and hasattr(m, "base_layer")]


def supported(model: nn.Module) -> bool:
    """True when every LoRA layer is a plain (non-DoRA) linear LoRA."""
    for layer in _lora_layers(model):
        if any(getattr(layer, "use_dora", {}).values()) or not isinstance(layer.lora_A, nn.ModuleDict):
            return False
        if any(not isinstance(a, nn.Linear) for a in layer.lora_A.values()):
            return False
    return True


def _stacked(layer, row_adapters: list[str]):
    names = sorted(set(row_adapters))
    present = [n for n in names if n in layer.lora_A]
    if not present:
        return None
    ref = layer.lora_A[present[0]].weight
    rank = max(layer.lora_A[n].weight.shape[0] for n in present)
    d_in, d_out = ref.shape[1], layer.lora_B[present[0]].weight.shape[0]
    As, Bs = [], []
    for n in names:
        if n in layer.lora_A:
            a, b = layer.lora_A[n].weight, layer.lora_B[n].weight * layer.scaling[n]
            pad = rank - a.shape[0]
            if pad:
                a = torch.cat([a, a.new_zeros(pad, d_in)])
                b = torch.cat([b, b.new_zeros(d_out, pad)], dim=1)
        else:
            a, b = ref.new_zeros(rank, d_in), ref.new_zeros(d_out, rank)
        As.append(a)
        Bs.append(b)
    index = torch.tensor([names.index(n) for n in row_adapters], device=ref.device)
    return torch.stack(As)[index], torch.stack(Bs)[index]  # [rows, r, in], [rows, out, r]


@contextmanager
def per_row_adapters(model: nn.Module, row_adapters: list[str]):
    """Within the block, row b of every forward through ``model`` uses adapter ``row_adapters[b]``.

    Call the underlying transformers model (``peft_model.get_base_model()``), not the PeftModel, so
    peft's own per-call hooks stay out of the way.
    """
    patched = []
    try:
        for layer in _lora_layers(model):
            weights = _stacked(layer, row_adapters)
            if weights is None:
                continue
            A, B = weights

            def forward(x, *args, _layer=layer, _A=A, _B=B, **kwargs):
                y = _layer.base_layer(x, *args, **kwargs)
                h = x.to(_A.dtype)
                squeeze = h.dim() == 2
                if squeeze:
                    h = h[:, None]
                delta = torch.bmm(torch.bmm(h, _A.transpose(1, 2)), _B.transpose(1, 2))
                return y + (delta[:, 0] if squeeze else delta).to(y.dtype)

            layer.forward = forward
            patched.append(layer)
        yield
    finally:
        for layer in patched:
            del layer.forward
