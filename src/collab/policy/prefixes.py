"""Shared prompt starts computed once: the K samples of a prompt, the later turns of a multi-turn episode and the
nodes of a rollout tree open with the same long prompt.

:func:`shared_prefix_forward` (the decode's prefill, :mod:`collab.policy.prefill`, and the update's teacher-forced
log-probs, :mod:`collab.policy.scoring`) runs each such start once per adapter (:func:`shared_prefixes`) and repeats
its KV cache for its rows; :func:`pad_left` lays rows out as one left-padded pass, what a model that cannot share
(:func:`shares_prefixes`) runs.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import DynamicCache

from collab.policy.kv_cache import cache_key, select_rows


def shares_prefixes(model) -> bool:
    """Whether computing a shared prompt start once is exact for ``model``: every layer attends to all the tokens
    before it. A sliding window (Mistral, Qwen2's, Phi-3, Gemma 2 and 3, Mixtral) counts places in the cache, and
    the padding that sharing puts between a prefix and a row's remainder would take real tokens out of it (a
    recurrent layer would read the padding): such models run one left-padded pass, as transformers does."""
    config = getattr(model, "config", None)
    types = getattr(config, "layer_types", None)
    if types is not None:
        return all(t == "full_attention" for t in types)
    return getattr(config, "sliding_window", None) is None and getattr(config, "attention_chunk_size", None) is None


def pad_left(seqs: list[list[int]], pad_id: int, device) -> tuple[Tensor, Tensor, Tensor]:
    """Left-padded ids, attention mask and position ids (0 at each row's first real token)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.as_tensor(s)
            mask[i, width - len(s) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


MIN_SHARED_PREFIX = 64
"""Shortest common prompt start (tokens) worth a prefill of its own."""

MIN_REPEATED_PROMPT = 16
"""Shortest prompt (tokens) whose copies share one prefill: a group's K samples of one prompt repeat all of it, so
even a short one skips most of the rows' prompt tokens (K = 8 copies of a 37-token prompt: 7 x 36 of 296)."""


MIN_PREFIX_SAVING = 0.25
"""Share prefixes only when that skips at least this fraction of the prompt tokens."""


def _common(a: list[int], b: list[int]) -> int:
    """Length of the common start of ``a`` and ``b``."""
    n = min(len(a), len(b))
    return next((j for j in range(n) if a[j] != b[j]), n)


def shared_prefixes(
    prompts: list[list[int]],
    adapters: list[str],
    min_prefix: int = MIN_SHARED_PREFIX,
    min_repeated: int = MIN_REPEATED_PROMPT,
) -> tuple[list[int], list[int]]:
    """Group the prompts that one adapter reads by their common starts, to prefill each start once.

    A group's prefix is its rows' longest common start, one token short of its shortest prompt (every
    row keeps a token whose logits start its response); it must be at least ``min_prefix`` tokens, or the
    smaller ``min_repeated`` where the group's prompts are one prompt repeated (a node's K samples). The
    grouping maximizes the prefill tokens saved, sum over groups of (rows - 1) x prefix: among the
    prompts sorted per adapter, groups are runs of neighbours (the common start of a run is the least
    common start of its neighbouring pairs), chosen by dynamic programming. A row left alone is a group
    whose prefix is all of its prompt but the last token, which keeps the remainders short. Returns each
    row's group (numbered in order of first appearance) and each group's prefix length.
    """
    n = len(prompts)
    order = sorted(range(n), key=lambda r: (adapters[r], prompts[r]))
    adjacent = [_common(prompts[a], prompts[b]) if adapters[a] == adapters[b] else 0 for a, b in zip(order, order[1:])]
    best, start, prefix = [0] * (n + 1), [0] * (n + 1), [0] * (n + 1)
    for j in range(1, n + 1):  # best[j]: the best grouping of order[:j]; its last group is order[start[j]:j]
        best[j], start[j], prefix[j] = best[j - 1], j - 1, len(prompts[order[j - 1]]) - 1
        common, shortest = 1 << 62, len(prompts[order[j - 1]])
        for i in range(j - 2, -1, -1):
            common, shortest = min(common, adjacent[i]), min(shortest, len(prompts[order[i]]))
            length = min(common, shortest - 1)
            if length < (min(min_prefix, min_repeated) if common >= shortest else min_prefix):
                break
            if best[i] + (j - 1 - i) * length > best[j]:
                best[j], start[j], prefix[j] = best[i] + (j - 1 - i) * length, i, length
    runs = []
    j = n
    while j > 0:
        runs.append((order[start[j] : j], prefix[j]))
        j = start[j]
    group_of, lengths = [0] * n, []
    for rows, length in sorted(runs, key=lambda run: min(run[0])):
        for r in rows:
            group_of[r] = len(lengths)
        lengths.append(length)
    return group_of, lengths


def shared_prefix_forward(
    forward,
    prompts: list[list[int]],
    suffixes: list[list[int]],
    adapters: list[str],
    pad: int,
    device,
    share: bool = True,
    new_cache=lambda widths: DynamicCache(),
    **kwargs,
):
    """``forward(row_adapters, **inputs)`` over the rows ``prompts[r] + suffixes[r]``, each group of prompts'
    shared start computed once: ``(out, attention_mask, position_ids)``, each row's positions ending at
    the right edge as in one left-padded pass.

    The groups' prefixes (:func:`shared_prefixes`) go through the model first; their KV cache is repeated
    for the group's rows (an index: gradients flow back into the prefix when ``forward`` records them, as
    the teacher-forced log-probs of the update do); the rows' own remainders follow, left-padded, so
    padding sits between prefix and remainder, masked out, with position ids continuing from the prefix.
    A suffix (a completion) never joins a prefix: each row keeps at least its prompt's last token, whose
    logits score the suffix's first token. Shares when that skips at least ``MIN_PREFIX_SAVING`` of the
    prompt tokens, and ``share`` (:func:`shares_prefixes`); otherwise one pass over the left-padded rows.
    ``kwargs`` go to the last forward (``use_cache``, ``logits_to_keep``). ``new_cache(widths)``: the empty cache that
    passes of these widths fill (a prefill in pieces reserves one: :func:`~collab.policy.prefill.prefill`).

    The cache is a ``DynamicCache`` without the model's config: every layer keeps all its keys, and the layers
    with a sliding window apply it through the attention mask the model builds from its config, which gives
    the attention of transformers' sliding-window cache layers (tests/policy/test_architectures.py).
    """
    key = cache_key()
    seqs = [list(p) + list(s) for p, s in zip(prompts, suffixes)]
    group_of, lengths = shared_prefixes(prompts, adapters)
    counts = torch.bincount(torch.tensor(group_of), minlength=len(lengths)).tolist()
    saved = sum((c - 1) * n for c, n in zip(counts, lengths))

    if not share or saved < MIN_PREFIX_SAVING * sum(len(p) for p in prompts):
        ids, mask, positions = pad_left(seqs, pad, device)
        cache = {key: new_cache([ids.shape[1]])} if kwargs.get("use_cache") else {}
        return (
            forward(adapters, input_ids=ids, attention_mask=mask, position_ids=positions, **cache, **kwargs),
            mask,
            positions,
        )
    heads = [prompts[group_of.index(g)][:n] for g, n in enumerate(lengths)]
    head_adapters = [adapters[group_of.index(g)] for g in range(len(lengths))]
    tails = [s[lengths[g] :] for s, g in zip(seqs, group_of)]
    cache = new_cache([max(lengths), max(len(t) for t in tails)])
    if any(heads):
        ids, head_mask, positions = pad_left(heads, pad, device)
        cache = forward(
            head_adapters,
            input_ids=ids,
            attention_mask=head_mask,
            position_ids=positions,
            **{key: cache},
            use_cache=True,
            logits_to_keep=1,
        )[key]
        rows = torch.tensor(group_of, device=device)
        select_rows(cache, rows)
        head_mask = head_mask[rows]
    else:
        head_mask = torch.zeros(len(prompts), 0, dtype=torch.long, device=device)
    starts = [lengths[g] for g in group_of]
    return forward_after(forward, cache, head_mask, starts, tails, adapters, pad, device, **kwargs)


def forward_after(
    forward, cache, head_mask: Tensor, starts: list[int], tails: list[list[int]], adapters, pad, device, **kwargs
):
    """``forward`` over each row's ``tails[r]`` after a ``cache`` whose columns ``head_mask`` marks (row ``r``'s
    ``starts[r]`` real tokens): the tails left-padded, so padding sits between the cached head and the tail, masked
    out, with position ids continuing from ``starts[r]``. ``(out, attention_mask, position_ids)``."""
    ids, tail_mask, tail_positions = pad_left(tails, pad, device)
    positions = tail_positions + torch.tensor(starts, device=device)[:, None]
    mask = torch.cat([head_mask, tail_mask], dim=-1)
    out = forward(
        adapters, input_ids=ids, attention_mask=mask, position_ids=positions, **{cache_key(): cache}, **kwargs
    )
    return out, mask, positions
