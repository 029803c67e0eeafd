"""KV caches of a batched forward: the argument's name, the rows kept, buffers reserved ahead, one row cut out.

A prefill's cache is repeated for the rows that share its prompt (:func:`select_rows`), given room for the decode's
new tokens (:func:`reserve`, :func:`reserved_cache`: :class:`ReservedLayer` writes each step in place), and a
row that stops at a tool call keeps its own cache (:func:`row_cache`) for the round that goes on from it
(:func:`~collab.policy.prefill.resume_prefill`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch
from torch import Tensor
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer


@cache
def cache_key() -> str:
    """The name of a forward's KV-cache argument and output: ``cache`` since transformers renamed it (5.2x, which
    warns on the old name), ``past_key_values`` before (5.19 and older)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


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
