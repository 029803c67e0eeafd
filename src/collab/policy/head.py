"""Per-token log-probs and entropies from the output head without a full-vocabulary logits tensor.

A policy's log-prob of token ``y`` after the final hidden state ``h`` is ``log_softmax(W h / T)[y]`` (``W`` the
``V x H`` output head, ``T`` the temperature, restricted to the agent's action vocabulary): a row of ``V`` logits
per token. Computing them for a whole batch at once costs ``tokens x V x 4`` bytes (16 responses of 300 tokens
over SmolLM2's 49,152-token vocabulary: 0.9 GB), and ``log_softmax``'s backward keeps another tensor that size.
Here the tokens go through the head in chunks (:data:`CHUNK_BYTES` of logits at a time) and only the hidden
states are kept for the backward, where each chunk's log-probs are computed again with autograd, one chunk's
graph at a time (:class:`_ChunkedHead`): saved for the backward are ``tokens x H`` values (SmolLM2: 576 per token
against 49,152), computed in the backward one more head product per chunk. The values and gradients are those
of the one-pass computation: the same operations on the same rows, chunk by chunk.

:func:`hidden_states` runs a causal LM with its output head replaced by the identity, so that ``out.logits`` are
the final hidden states. A model whose forward post-processes the head's output (Gemma 2's soft-capping,
Granite's and Cohere's scales: :data:`POST_OPS`), whose head trains (LoRA on ``lm_head``) or whose head FSDP2
shards keeps the one-pass path (:func:`output_head` returns None).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch import Tensor, nn

CHUNK_BYTES = 64 * 2**20
"""Bytes of float32 logits computed at a time: ``CHUNK_BYTES / (4 V)`` tokens per chunk (SmolLM2: 341)."""

POST_OPS = ("final_logit_softcapping", "logits_scaling", "logit_scale", "output_multiplier_scale")
"""Config fields of architectures whose logits are not the head's output (applied by the model's forward after
the head): such a model takes the full-logits path."""


def vocab_size(head: nn.Module) -> int:
    """Rows of the output head (a ``Linear``'s ``out_features``, else its weight's first dimension)."""
    return getattr(head, "out_features", None) or head.weight.shape[0]


def chunk_tokens(vocab: int, budget: int = CHUNK_BYTES) -> int:
    """Tokens per chunk so that one chunk's float32 logits fit in ``budget`` bytes (at least 1)."""
    return max(1, budget // (4 * max(vocab, 1)))


class _ChunkedHead(torch.autograd.Function):
    """``fn(hidden[s:e], s, e) -> (logp, entropy or None)`` over chunks, keeping only ``hidden`` for the backward,
    where each chunk's forward is run again with autograd (one chunk's graph at a time)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, fn: Callable, chunk: int):
        ctx.fn, ctx.chunk = fn, chunk
        ctx.save_for_backward(hidden)
        logps, ents = [], []
        for s in range(0, hidden.shape[0], chunk):
            lp, ent = fn(hidden[s : s + chunk], s, s + chunk)
            logps.append(lp)
            ents.append(ent)
        has_entropy = ents[0] is not None if ents else False
        ctx.has_entropy = has_entropy
        logp = torch.cat(logps) if logps else hidden.new_zeros(0, dtype=torch.float32)
        entropy = torch.cat(ents) if has_entropy else logp.new_zeros(0)
        if not has_entropy:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp: Tensor, g_entropy: Tensor):
        (hidden,) = ctx.saved_tensors
        grad = torch.zeros_like(hidden)
        for s in range(0, hidden.shape[0], ctx.chunk):
            with torch.enable_grad():
                h = hidden[s : s + ctx.chunk].detach().requires_grad_()
                lp, ent = ctx.fn(h, s, s + ctx.chunk)
                outputs, grads = [lp], [g_logp[s : s + ctx.chunk]]
                if ctx.has_entropy and g_entropy is not None:
                    outputs.append(ent)
                    grads.append(g_entropy[s : s + ctx.chunk])
                torch.autograd.backward(outputs, grads)
            grad[s : s + ctx.chunk] = h.grad
        return grad, None, None


def token_logprobs(
    hidden: Tensor,
    head: nn.Module,
    targets: Tensor,
    temperature: Tensor,
    masks: tuple[Tensor, Tensor] | None = None,
    entropy: bool = False,
    chunk: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of each ``targets[t]`` (and the policy's entropy) after ``hidden[t]``: ``hidden`` ``(N, H)`` final
    hidden states, ``head`` the output head (frozen), ``temperature`` ``(N,)`` (0: greedy, scored at 1), ``masks``
    ``(allowed, which)``: ``allowed`` ``(M, V)`` boolean action vocabularies and ``which`` ``(N,)`` each token's
    (-1: none), or None. Chunked over tokens (``chunk``, default :func:`chunk_tokens`); the values of
    ``policy_logits(head(h).float(), T, mask).log_softmax(-1)`` at the targets; gradients flow to ``hidden``."""
    from collab.policy.sampling import policy_logits

    chunk = chunk or chunk_tokens(vocab_size(head))

    def mask_of(s: int, e: int) -> Tensor | None:
        if masks is None:
            return None
        allowed, which = masks
        rows = which[s:e]
        full = torch.ones(len(rows), allowed.shape[-1], dtype=torch.bool, device=allowed.device)
        some = rows >= 0
        full[some] = allowed[rows[some]]
        return full

    def fn(h: Tensor, s: int, e: int):
        lp = policy_logits(head(h).float(), temperature[s:e], mask_of(s, e)).log_softmax(-1)
        picked = lp.gather(-1, targets[s:e, None]).squeeze(-1)
        if not entropy:
            return picked, None
        # -sum p log p over the allowed tokens (masked ones: log p = -inf, p = 0, left out)
        return picked, -(lp.exp() * lp.masked_fill(~torch.isfinite(lp), 0.0)).sum(-1)

    logp, ent = _ChunkedHead.apply(hidden, fn, chunk)
    return logp, (ent if entropy else None)


def output_head(model) -> tuple[nn.Module, str, nn.Module] | None:
    """``(parent, name, head)`` of a causal LM's output head (inside a peft model too); None when it cannot take the
    chunked path: no head found, a head with trainable weights (LoRA on ``lm_head``), a head sharded by FSDP2
    (``--trainer.strategy fsdp``: its weight is whole only inside the model's forward), or logits post-processed by
    the model's forward (:data:`POST_OPS`)."""
    config = getattr(model, "config", None)
    if config is not None and any(getattr(config, f, None) not in (None, 1, 1.0) for f in POST_OPS):
        return None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or any(p.requires_grad or hasattr(p, "to_local") for p in head.parameters()):
        return None
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is head:
                return parent, name, head
    return None


@contextmanager
def hidden_states(model):
    """Within: the model's forward returns its final hidden states as ``logits`` (its head replaced by the
    identity); yields the head. The model must have one (:func:`output_head`)."""
    parent, name, head = output_head(model)
    setattr(parent, name, nn.Identity())
    try:
        yield head
    finally:
        setattr(parent, name, head)
