"""transformers' SDPA attention mask without fully masked query rows.

A left-padded batch (prompts of different lengths in one prefill, a training forward over padded rows) gives each
pad position a query row that may attend to nothing: causal, and every column before it is padding. The math is
empty (a softmax over no entries) and kernels disagree on it: the CPU kernels return zeros, while CUDA's
memory-efficient and cuDNN paths can return NaN. A NaN in a pad's hidden state becomes a NaN key and value at that
column in the next layer, and a real row's masked score ``q . k_nan + (-inf)`` is NaN too, so the whole row's
softmax, its logits and the sampled token go NaN (an H200 run of two Qwen3-1.7B agents stopped on it:
docs/measurements.md). :func:`use_pad_safe_sdpa_mask` makes each such row attend to every column instead, as
transformers did itself for the memory-efficient path before torch 2.5: the row's output stays finite and is never
read, and no real row's mask changes (a column that is masked out adds exactly zero to a real row's sums)."""

from __future__ import annotations

import torch


def without_empty_rows(mask: torch.Tensor | None) -> torch.Tensor | None:
    """A boolean ``(batch, heads, queries, keys)`` mask (True: may attend) with each all-False query row made
    all-True; None (no mask: causal without padding) and float masks pass unchanged."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return mask | ~mask.any(-1, keepdim=True)


def use_pad_safe_sdpa_mask() -> None:
    """Register, once per process, transformers' ``sdpa`` mask function wrapped by :func:`without_empty_rows` (the
    mask functions are looked up by name at every forward, so models already loaded use it too)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    sdpa_mask = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    if getattr(sdpa_mask, "pad_safe", False):
        return

    def pad_safe_sdpa_mask(*args, **kwargs):
        return without_empty_rows(sdpa_mask(*args, **kwargs))

    pad_safe_sdpa_mask.pad_safe = True
    AttentionMaskInterface.register("sdpa", pad_safe_sdpa_mask)
