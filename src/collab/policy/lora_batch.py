"""Mixed-adapter batches in three tensor ops per layer.

peft runs a batch whose rows use different LoRA adapters (``adapter_names=``) by looping, in Python,
over the adapters inside every LoRA layer on every forward, and re-registers its hooks on every call.
For the short decoding steps of a rollout that bookkeeping costs more than the matrix products. Here
each row's adapter weights are gathered once per batch layout into stacked tensors, and a LoRA layer
computes ``base(x) + bmm(bmm(x, A_rows^T), (s * B)_rows^T)`` for all rows at once (adapters of
different ranks are zero-padded to the largest rank, which leaves the product unchanged). Gradients
flow to the adapters through the gather, so the same path serves teacher-forced training forwards.

A decoding step (one token per row) takes another route to the same sum: the rows' batched products
are ``rows`` tiny matrix products, each reading its own copy of the adapter, and on a CPU they cost
a third of the base layer's product (``benchmarks/decode_flops.py``: 18% of a decode step's time at
32 rows). There the adapters of the batch are concatenated instead, ``A_cat`` (sum of ranks x in) and
``(s * B)_cat`` (out x sum of ranks), and ``delta = ((x A_cat^T) * M) (s * B)_cat^T`` with ``M`` the
0/1 mask of each row's own adapter's columns: two plain matrix products for the whole batch (one
adapter in the batch: no mask). It equals the batched product up to float rounding; multi-token
forwards (the prefill, the update's teacher-forced forward) keep the batched route.

Layers without an adapter for some row contribute nothing for that row. A layer called on the batch's
tokens flattened to ``(rows * tokens, in)`` (Qwen2-MoE's shared expert) reads them as ``(rows, tokens, in)``.
DoRA and other LoRA variants are not covered: :func:`supported` tells, and callers fall back to peft's own path.
:class:`AdapterRows` (and :func:`per_row_forward`) call a model with one adapter per row by whichever path applies.
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


def _adapter_weights(layer, name: str):
    """``(A, s * B)`` of adapter ``name`` in ``layer``."""
    return layer.lora_A[name].weight, layer.lora_B[name].weight * layer.scaling[name]


def _stacked(layer, row_adapters: list[str]):
    """Each row's adapter, zero-padded to the largest rank: ``([rows, r, in], [rows, out, r])``."""
    names = sorted(set(row_adapters))
    present = [n for n in names if n in layer.lora_A]
    ref = layer.lora_A[present[0]].weight
    rank = max(layer.lora_A[n].weight.shape[0] for n in present)
    d_in, d_out = ref.shape[1], layer.lora_B[present[0]].weight.shape[0]
    As, Bs = [], []
    for n in names:
        if n in layer.lora_A:
            a, b = _adapter_weights(layer, n)
            pad = rank - a.shape[0]
            if pad:
                a = torch.cat([a, a.new_zeros(pad, d_in)])
                b = torch.cat([b, b.new_zeros(d_out, pad)], dim=1)
        else:
            a, b = ref.new_zeros(rank, d_in), ref.new_zeros(d_out, rank)
        As.append(a)
        Bs.append(b)
    index = torch.tensor([names.index(n) for n in row_adapters], device=ref.device)
    # index_select, not indexing: the backward of indexing adds an adapter's rows with atomic adds from every thread,
    # in an order that changes from run to run; index_select's adds them one row after the other
    return torch.stack(As).index_select(0, index), torch.stack(Bs).index_select(0, index)


def _concatenated(layer, row_adapters: list[str]):
    """The batch's adapters side by side: ``(A_cat [R, in], (s * B)_cat [out, R], mask [rows, R] or None)``,
    ``R`` the sum of their ranks; ``mask`` keeps each row's own adapter's columns (None: one adapter)."""
    present = [n for n in sorted(set(row_adapters)) if n in layer.lora_A]
    weights = [_adapter_weights(layer, n) for n in present]
    A = torch.cat([a for a, _ in weights])
    B = torch.cat([b for _, b in weights], dim=1)
    if len(present) == 1 and all(n == present[0] for n in row_adapters):
        return A, B, None
    ranks = torch.tensor([a.shape[0] for a, _ in weights], device=A.device)
    owner = torch.arange(len(present), device=A.device).repeat_interleave(ranks)  # column -> its adapter
    row = torch.tensor([present.index(n) if n in present else -1 for n in row_adapters], device=A.device)
    return A, B, (row[:, None] == owner[None, :]).to(A.dtype)


def _unflatten(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``(rows * tokens, in)`` back to ``(rows, tokens, in)``: a mixture of experts' block runs its shared expert
    (Qwen2-MoE) on the batch's tokens flattened row by row. A layer that sees a subset of the tokens (an expert's)
    has no row to take an adapter from: such layers are not adapted (:func:`collab.policy.targets.lora_targets`)."""
    if x.shape[0] % rows:
        raise RuntimeError(
            f"a LoRA layer got {x.shape[0]} token rows, not a multiple of the batch's {rows} rows: "
            "a mixed-adapter batch cannot adapt a layer that sees some of the tokens (an expert's)"
        )
    return x.reshape(rows, x.shape[0] // rows, x.shape[-1])


@contextmanager
def per_row_adapters(model: nn.Module, row_adapters: list[str]):
    """Within the block, row b of every forward through ``model`` uses adapter ``row_adapters[b]``.

    Call the underlying transformers model (``peft_model.get_base_model()``), not the PeftModel, so
    peft's own per-call hooks stay out of the way. Each route's weights are built on first use (with
    gradients when the forward records them).
    """
    patched = []
    try:
        for layer in _lora_layers(model):
            if not any(n in layer.lora_A for n in set(row_adapters)):
                continue

            built: dict = {}  # (route, grad mode) -> its weights, made on first use

            def forward(x, *args, _layer=layer, _built=built, **kwargs):
                y = _layer.base_layer(x, *args, **kwargs)
                if x.dim() == 2 and x.shape[0] != len(row_adapters):  # tokens flattened (a mixture of experts' block)
                    x = _unflatten(x, len(row_adapters))
                one_token = x.dim() == 2 or x.shape[1] == 1
                route = (one_token, torch.is_grad_enabled())
                if route not in _built:
                    _built[route] = (_concatenated if one_token else _stacked)(_layer, row_adapters)
                if one_token:
                    A, B, mask = _built[route]
                    h = x.reshape(x.shape[0], -1).to(A.dtype) @ A.T
                    delta = (h if mask is None else h * mask) @ B.T
                    return y + delta.reshape(y.shape).to(y.dtype)
                A, B = _built[route]
                delta = torch.bmm(torch.bmm(x.to(A.dtype), A.transpose(1, 2)), B.transpose(1, 2))
                return y + delta.reshape(y.shape).to(y.dtype)

            layer.forward = forward
            patched.append(layer)
        yield
    finally:
        for layer in patched:
            del layer.forward


def per_row_forward(model):
    """``forward(row_adapters, **inputs)``: one forward with a per-row adapter choice."""

    def forward(row_adapters, **inputs):
        step = AdapterRows(model, row_adapters)
        try:
            return step(**inputs)
        finally:
            step.close()

    return forward


class AdapterRows:
    """``model`` called with one adapter per row (``row_adapters``), the row layout fixed: decoding steps
    gather the stacked adapter weights once (:mod:`collab.policy.lora_batch`, else peft's ``adapter_names``). A model
    without adapters (a full-parameter agent's) is called as it is.
    :meth:`close` when the layout changes or the steps end."""

    def __init__(self, model, row_adapters: list[str]) -> None:
        self.model, self.row_adapters = model, row_adapters
        self.plain = not hasattr(model, "peft_config")  # a full agent's model: no adapters, the names are ignored
        self.ctx = per_row_adapters(model, row_adapters) if supported(model) and not self.plain else None
        if self.ctx is not None:
            self.ctx.__enter__()

    def __call__(self, **inputs):
        if self.plain:
            return self.model(**inputs)
        if self.ctx is not None:
            from collab.runtime import lockstep

            if lockstep.active() is not None:  # FSDP2: through the PeftModel, the sharded root (its hooks gather)
                return self.model(**inputs)
            return self.model.get_base_model()(**inputs)
        return self.model(adapter_names=self.row_adapters, **inputs)

    def close(self) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(None, None, None)
            self.ctx = None
