"""The decode's first pass: the prompts through the model into a fresh KV cache.

:func:`prefill` computes the prompts' shared starts once (:mod:`collab.policy.prefixes`) and runs a wide pass in
pieces (:func:`in_chunks`) into a cache reserved ahead (:mod:`collab.policy.kv_cache`); :func:`resume_prefill`
goes on from rows whose first tokens are cached already (a tool-using turn's next round).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache

from collab.policy.kv_cache import RowCache, cache_key, reserved_cache
from collab.policy.lora_batch import per_row_forward
from collab.policy.prefixes import forward_after, shared_prefix_forward, shares_prefixes

PREFILL_CHUNK = 512
"""Most prompt tokens (columns) a prefill pass feeds at once: a wider prefill runs in pieces of this many columns,
each appending to the KV cache. A pass's transient memory (attention scores, rows x heads x its columns x the
keys so far, and the MLP's activations) grows with its width: 8 Minecraft prompts of ~1,900 tokens take ~0.8 GiB
beside their cache in one pass (docs/models.md, "Memory"). Narrower prompts (every default but Minecraft's) run
in one pass."""


def prefill(model, prompts: list[list[int]], adapters: list[str], pad: int, device, room: int = 0):
    """Run the prompts through the model into a fresh KV cache: ``(out, attention_mask, position_ids)``
    with ``out.logits[:, -1]`` each row's next-token logits and ``out[cache_key()]`` the cache.

    Prompts that share a long start under one adapter (the K samples' prompt, the later turns of a
    multi-turn episode, whose histories begin with the same task prompt; the nodes of a rollout tree)
    prefill that start once (:func:`shared_prefix_forward`) when the model allows (:func:`shares_prefixes`).
    A pass wider than :data:`PREFILL_CHUNK` columns runs in pieces (:func:`in_chunks`) into a cache reserved for
    the prompts and ``room`` more tokens (:func:`reserved_cache`: the decode's new tokens); narrower ones keep
    transformers' dynamic layers (the decode reserves its room after them).
    """
    return shared_prefix_forward(
        in_chunks(per_row_forward(model)),
        prompts,
        [[] for _ in prompts],
        adapters,
        pad,
        device,
        share=shares_prefixes(model),
        use_cache=True,
        logits_to_keep=1,
        new_cache=lambda widths: reserved_cache(sum(widths) + room) if max(widths) > PREFILL_CHUNK else DynamicCache(),
    )


def resume_prefill(model, pasts: list[RowCache], tails: list[list[int]], adapters: list[str], pad: int, device):
    """:func:`prefill` for rows whose first tokens are cached already: row ``r``'s prompt is the ``pasts[r].length``
    tokens its cache holds followed by ``tails[r]`` (a tool's result inserted into a turn, and the token sampled
    last). The caches are laid out left-padded into one, the tails after them, left-padded too, their positions
    continuing each row's own (padding between the two is masked out, as :func:`shared_prefix_forward` lays a shared
    prefix and its rows' remainders: :func:`forward_after`): ``(out, attention_mask, position_ids)`` as :func:`prefill`
    returns them. The same attention as prefilling the whole prompts, up to float rounding; only for models that
    :func:`shares_prefixes`."""
    if any(not t for t in tails):
        raise ValueError("every resumed row needs at least one new token (whose logits start its response)")
    width = max(p.length for p in pasts)
    cache = DynamicCache()
    for layer in range(len(pasts[0].keys)):  # left-padded: [rows, heads, width, dim]
        keys = torch.stack([F.pad(p.keys[layer], (0, 0, width - p.length, 0)) for p in pasts])
        values = torch.stack([F.pad(p.values[layer], (0, 0, width - p.length, 0)) for p in pasts])
        cache.update(keys.to(device), values.to(device), layer)
    head = torch.zeros(len(pasts), width, dtype=torch.long, device=device)
    for r, p in enumerate(pasts):
        head[r, width - p.length :] = 1
    starts = [p.length for p in pasts]
    forward = in_chunks(per_row_forward(model))
    return forward_after(forward, cache, head, starts, tails, adapters, pad, device, use_cache=True, logits_to_keep=1)


def in_chunks(forward, chunk: int | None = None):
    """``forward(row_adapters, **inputs)`` for a prefill (``use_cache``): inputs wider than ``chunk`` columns go
    through in consecutive pieces, each with the attention mask up to its last column (the cached columns and
    its own) and its position ids, appending to the same cache; the last piece's output (its ``logits_to_keep``
    logits and the whole cache) is returned. The same attention as one pass, computed piece by piece (the
    float sums group differently: equal up to rounding, tests/policy/test_sampling.py). Other calls pass
    through. ``chunk``: :data:`PREFILL_CHUNK` (read at each call) unless given."""

    def chunked(row_adapters, *, input_ids, attention_mask, position_ids, **kwargs):
        width, size = input_ids.shape[1], chunk or PREFILL_CHUNK
        if not kwargs.get("use_cache") or width <= size:
            return forward(
                row_adapters, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
            )
        key = cache_key()
        past = attention_mask.shape[1] - width  # columns already in the cache (a shared prefix's)
        keep = kwargs.pop("logits_to_keep", 0)
        for start in range(0, width, size):
            end = min(width, start + size)
            out = forward(
                row_adapters,
                input_ids=input_ids[:, start:end],
                attention_mask=attention_mask[:, : past + end],
                position_ids=position_ids[:, start:end],
                logits_to_keep=keep if end == width else 1,
                **kwargs,
            )
            kwargs[key] = out[key]
        return out

    return chunked
