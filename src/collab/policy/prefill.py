"""Prefill and forwards with one adapter per row: shared prompt starts computed once.

The K samples of a prompt, the later turns of a multi-turn episode and the nodes of a rollout tree
open with the same long prompt; :func:`prefill` (the decode's first pass, :mod:`collab.policy.sampling`)
and :func:`shared_prefix_forward` (also the update's teacher-forced log-probs, :mod:`collab.policy.team`)
run each such start once per adapter (:func:`shared_prefixes`) and repeat its KV cache for its rows.
:func:`per_row_forward` and :class:`AdapterRows` run one batch whose rows use different adapters;
:func:`pad_left` lays rows out as one left-padded pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer


@cache
def cache_key() -> str:
    """The name of a forward's KV-cache argument and output: ``cache`` since transformers renamed it (5.2x, which
    warns on the old name), ``past_key_values`` before (5.19 and older)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


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


PREFILL_CHUNK = 512
"""Most prompt tokens (columns) a prefill pass feeds at once: a wider prefill runs in pieces of this many columns,
each appending to the KV cache. A pass's transient memory (attention scores, rows x heads x its columns x the
keys so far, and the MLP's activations) grows with its width: 8 Minecraft prompts of ~1,900 tokens take ~0.8 GiB
beside their cache in one pass (docs/models.md, "Memory"). Narrower prompts (every default but Minecraft's) run
in one pass."""

MIN_SHARED_PREFIX = 64
"""Shortest common prompt start (tokens) worth a prefill of its own."""
MIN_PREFIX_SAVING = 0.25
"""Share prefixes only when that skips at least this fraction of the prompt tokens."""


def _common(a: list[int], b: list[int]) -> int:
    """Length of the common start of ``a`` and ``b``."""
    n = min(len(a), len(b))
    return next((j for j in range(n) if a[j] != b[j]), n)


def shared_prefixes(
    prompts: list[list[int]], adapters: list[str], min_prefix: int = MIN_SHARED_PREFIX
) -> tuple[list[int], list[int]]:
    """Group the prompts that one adapter reads by their common starts, to prefill each start once.

    A group's prefix is its rows' longest common start, one token short of its shortest prompt (every
    row keeps a token whose logits start its response); it must be at least ``min_prefix`` tokens. The
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
            if length < min_prefix:
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


def prefill(model, prompts: list[list[int]], adapters: list[str], pad: int, device, room: int = 0):
    """Run the prompts through the model into a fresh KV cache: ``(out, attention_mask, position_ids)``
    with ``out.logits[:, -1]`` each row's next-token logits and ``out[cache_key()]`` the cache.

    Prompts that share a long start under one adapter (the K samples' prompt, the later turns of a
    multi-turn episode, whose histories begin with the same task prompt; the nodes of a rollout tree)
    prefill that start once (:func:`shared_prefix_forward`) when the model allows (:func:`shares_prefixes`).
    A pass wider than :data:`PREFILL_CHUNK` columns runs in pieces (:func:`in_chunks`) into a cache reserved for
    the prompts and ``room`` more tokens (:func:`reserved_cache`: the decode's new tokens).
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
        room=room,
    )


def shared_prefix_forward(
    forward,
    prompts: list[list[int]],
    suffixes: list[list[int]],
    adapters: list[str],
    pad: int,
    device,
    share: bool = True,
    room: int = 0,
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
    ``kwargs`` go to the last forward (``use_cache``, ``logits_to_keep``). ``room``: the tokens a decode will add
    after a prefill in pieces (the reserved cache's spare columns; :func:`prefill`).

    The cache is a ``DynamicCache`` without the model's config: every layer keeps all its keys, and the layers
    with a sliding window apply it through the attention mask the model builds from its config, which gives
    the attention of transformers' sliding-window cache layers (tests/policy/test_architectures.py).
    """
    key = cache_key()
    seqs = [list(p) + list(s) for p, s in zip(prompts, suffixes)]
    group_of, lengths = shared_prefixes(prompts, adapters)
    counts = torch.bincount(torch.tensor(group_of), minlength=len(lengths)).tolist()
    saved = sum((c - 1) * n for c, n in zip(counts, lengths))

    def new_cache(widths: list[int]) -> DynamicCache:
        # a prefill (use_cache) whose passes go in pieces (wider than PREFILL_CHUNK) writes into a cache reserved
        # for all of them and the room; narrower ones, and the update's forwards, keep transformers' dynamic
        # layers (the decode reserves its room after them)
        wide = kwargs.get("use_cache") and max(widths) > PREFILL_CHUNK
        return reserved_cache(sum(widths) + room) if wide else DynamicCache()

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


def select_rows(cache, rows: Tensor) -> None:
    """Keep the rows ``rows`` of ``cache`` (a row may repeat: a shared prefix given to each of its rows), as
    ``batch_select_indices`` does, but through ``index_select``: under gradients a repeated row's gradient is the sum
    of its copies', which ``index_select``'s backward adds one copy after the other, while indexing's
    (``index_put_`` with accumulate) adds them with atomic adds from every thread, in an order that changes from run
    to run: a run of more than one thread would not repeat itself bitwise (nor resume so)."""
    for layer in cache.layers:
        if type(layer) in (DynamicLayer, DynamicSlidingWindowLayer):
            if layer.get_seq_length() > 0:
                layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)
        else:  # ReservedLayer, or a layer type with state of its own
            layer.batch_select_indices(rows)


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


@dataclass
class RowCache:
    """One row's KV cache cut out of a decoding batch (:func:`row_cache`): every layer's keys and values of its
    ``length`` real tokens, ``[heads, length, dim]``, the padding left out."""

    keys: list[Tensor]
    values: list[Tensor]
    length: int


def row_cache(cache, mask: Tensor, row: int) -> RowCache:
    """Row ``row`` of a batch's ``cache``: its columns where ``mask`` (that row's attention mask, as wide as the
    cache) is 1, copied, so that the batch's buffers can go."""
    columns = mask.nonzero().squeeze(-1)
    layers = cache.layers
    return RowCache(
        [layer.keys[row][:, columns] for layer in layers],
        [layer.values[row][:, columns] for layer in layers],
        int(columns.numel()),
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


def reserve(cache, extra: int) -> None:
    """Give every layer of a prefilled ``DynamicCache`` room for ``extra`` more tokens (:class:`ReservedLayer`)."""
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer and layer.is_initialized:
            cache.layers[i] = ReservedLayer(layer, extra)


def reserved_cache(capacity: int) -> DynamicCache:
    """An empty ``DynamicCache`` whose layers hold ``capacity`` columns in one buffer from their first update
    (:class:`ReservedLayer`): a prefill in pieces and the decode after it write into it in place, where dynamic
    layers would concatenate the whole cache at each piece (the old and the grown cache alive together: with
    pieces, a one-batch call peaked 1.23x higher than in one pass; benchmarks/decode_parts.py). A transformers
    without lazily replicated layers gets a plain ``DynamicCache``."""
    cache = DynamicCache()
    if getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:
        cache.layer_class_to_replicate = lambda: ReservedLayer(capacity=capacity)
    return cache


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in a buffer reserved ahead: for the whole decode after a
    prefill (``ReservedLayer(layer, extra)``: the prefilled layer copied into a buffer ``extra`` columns longer),
    or for a whole prefill in pieces and its decode (``ReservedLayer(capacity=n)``: empty, its buffer allocated
    at the first update, sized by it).

    transformers' dynamic layer concatenates the whole cache with each new token, so one decoding step
    copies ``batch x length`` keys and values per layer: quadratic in the response length, and the
    dominant cost of long prompts decoded in many rows (py-spy: 60% of a 4-turn Minecraft tree's
    rollout). Here a step writes its token into the buffer in place; ``keys`` / ``values`` are views of
    the filled part, so attention sees exactly what the dynamic layer would give it. Past the reservation it
    grows as the dynamic layer does.
    """

    def __init__(self, layer: DynamicLayer | None = None, extra: int = 0, capacity: int = 0) -> None:
        super().__init__()
        self.capacity, self.length = capacity, 0
        if layer is not None:
            length = layer.keys.shape[-2]
            self._allocate(layer.keys, layer.values, length + extra)
            self._keys[:, :, :length] = layer.keys
            self._values[:, :, :length] = layer.values
            self.length = length
            self.keys, self.values = self._keys[:, :, :length], self._values[:, :, :length]

    def _allocate(self, keys: Tensor, values: Tensor, columns: int) -> None:
        batch, heads, _, dim = keys.shape
        self._keys = keys.new_empty(batch, heads, columns, dim)
        self._values = values.new_empty(batch, heads, columns, values.shape[-1])
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

    def batch_select_indices(self, indices: Tensor) -> None:
        """Keep only the rows ``indices`` (their reserved room included; :func:`select_rows` says why not by
        indexing)."""
        self._keys, self._values = self._keys.index_select(0, indices), self._values.index_select(0, indices)
        self.keys, self.values = self._keys[:, :, : self.length], self._values[:, :, : self.length]

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self._allocate(key_states, value_states, max(self.capacity, key_states.shape[-2]))
        end = self.length + key_states.shape[-2]
        if end > self._keys.shape[-2]:  # past the reservation: grow as the dynamic layer does
            self._keys = torch.cat([self.keys, key_states], dim=-2)
            self._values = torch.cat([self.values, value_states], dim=-2)
        else:
            self._keys[:, :, self.length : end] = key_states
            self._values[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values


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
        from collab.policy.lora_batch import per_row_adapters, supported

        self.model, self.row_adapters = model, row_adapters
        self.plain = not hasattr(model, "peft_config")  # a full agent's model: no adapters, the names are ignored
        self.ctx = per_row_adapters(model, row_adapters) if supported(model) and not self.plain else None
        if self.ctx is not None:
            self.ctx.__enter__()

    def __call__(self, **inputs):
        if self.plain:
            return self.model(**inputs)
        if self.ctx is not None:
            return self.model.get_base_model()(**inputs)
        return self.model(adapter_names=self.row_adapters, **inputs)

    def close(self) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(None, None, None)
            self.ctx = None
