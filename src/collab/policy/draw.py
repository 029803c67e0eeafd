"""One token per row from a truncated distribution: nucleus (top-p) and top-k truncation, the exponential race
among a few hundred candidates, and inverse-CDF draws with rejection where the nucleus is wider than them.
:func:`collab.policy.sampling.decode` calls :func:`sample_tokens` once a decoding step."""

from __future__ import annotations

import torch
from torch import Tensor


def dropped(sorted_probs: Tensor, top_p: Tensor, top_k: Tensor) -> Tensor:
    """Where each row's probabilities, in descending order, lie outside its top-k or its nucleus top-p: at rank k
    and after, and where the mass strictly before the token already reaches top-p (rows with k=0, p=1: nowhere)."""
    ranks = torch.arange(sorted_probs.shape[-1], device=sorted_probs.device).expand_as(sorted_probs)
    before = sorted_probs.cumsum(-1) - sorted_probs
    # the top_p < 1 guard: float rounding reaches 1 before the last token
    return ((top_k[:, None] > 0) & (ranks >= top_k[:, None])) | ((before >= top_p[:, None]) & (top_p[:, None] < 1))


def truncate(logits: Tensor, top_p: Tensor, top_k: Tensor) -> Tensor:
    """Mask logits outside each row's top-k and nucleus top-p (rows with k=0, p=1 unchanged)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    sorted_logits = sorted_logits.masked_fill(dropped(sorted_logits.softmax(-1), top_p, top_k), float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def _categorical(probs: Tensor, slots: Tensor | None = None, width: int | None = None) -> Tensor:
    """One draw per row: argmax of p / E with E ~ Exp(1) (the exponential race; cheaper than multinomial).

    ``slots`` (optional): row i of ``probs`` is row ``slots[i]`` of a batch of ``width`` rows. The
    draws are made for the whole width and each row takes its slot's, so a row samples the same
    token whether or not the other rows of its batch are still there (see :func:`collab.policy.sampling.decode`).
    """
    if slots is None:
        return (probs / torch.empty_like(probs).exponential_()).argmax(-1)
    noise = probs.new_empty(width, probs.shape[-1]).exponential_()
    return (probs / noise[slots]).argmax(-1)


def _uniforms(rows: int, draws: int, device, slots: Tensor | None = None, width: int | None = None) -> Tensor:
    """``draws`` uniforms in [0, 1) per row, float64, made for the whole ``width`` and taken at each row's slot (as
    :func:`_categorical`'s noise): a step draws the same numbers whichever rows are still in the batch."""
    if slots is None:
        return torch.rand(rows, draws, dtype=torch.float64, device=device)
    return torch.rand(width, draws, dtype=torch.float64, device=device)[slots]


BLOCK = 256
"""Tokens per block of :func:`inverse_cdf`'s two-level search."""


def inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """Each row's token by inverse CDF: the first whose cumulative mass exceeds ``u`` (``(rows,)``, uniform in
    [0, 1)) times the row's total mass.

    Two levels in float64: the block of :data:`BLOCK` tokens the point falls in, from the blocks' masses, then
    the token within that block, so that only one block per row is summed cumulatively (a float32 running sum
    over a vocabulary of 150,000 tokens drifts by ~1e-5; a float64 one costs ten times a pass over it). The point
    is kept below the total mass of the row and of its block, so a token of probability 0 (outside a closed
    action vocabulary) is never drawn. A row whose mass is not finite raises ``FloatingPointError``."""
    rows, vocab = probs.shape
    blocks = -(-vocab // BLOCK)
    padded = torch.nn.functional.pad(probs, (0, blocks * BLOCK - vocab)).view(rows, blocks, BLOCK)
    block_cdf = padded.sum(-1, dtype=torch.float64).cumsum(-1)
    total = block_cdf[:, -1:]
    if not bool(torch.isfinite(total).all()):  # a NaN row would index past the vocabulary (a CUDA device assert)
        rows_off = torch.nonzero(~torch.isfinite(total[:, 0])).flatten().tolist()
        raise FloatingPointError(
            f"the next-token probabilities of decoding row(s) {rows_off} are NaN or infinite: the model's logits are "
            "not finite (a diverged update, or a NaN from an attention kernel); nothing can be sampled from them"
        )
    target = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    block = torch.searchsorted(block_cdf, target, right=True)
    before = torch.where(block > 0, block_cdf.gather(-1, (block - 1).clamp_min(0)), 0.0)
    within = padded.gather(1, block[:, :, None].expand(rows, 1, BLOCK)).squeeze(1).double().cumsum(-1)
    last = within[:, -1:]
    rest = torch.minimum(target - before, torch.nextafter(last, torch.zeros_like(last)))
    return (block * BLOCK + torch.searchsorted(within, rest, right=True)).squeeze(-1)


def kept(probs: Tensor, tokens: Tensor, top_p: Tensor, top_k: Tensor) -> Tensor:
    """Whether each row's token lies in the row's top-k and nucleus top-p: fewer than ``top_k`` tokens are more
    likely than it, and their mass is below ``top_p`` (the mass strictly before it, as in :func:`truncate`;
    tokens of equal probability are kept or dropped together). Rows with k=0 and p=1 keep every token."""
    above = probs > probs.gather(-1, tokens[:, None])
    keep = (top_p >= 1) | ((probs * above).sum(-1) < top_p)
    if bool((top_k > 0).any()):
        keep &= (top_k <= 0) | (above.sum(-1) < top_k)
    return keep


def rejection_sample(
    probs: Tensor,
    top_p: Tensor,
    top_k: Tensor,
    slots: Tensor | None = None,
    width: int | None = None,
    rounds: int = 8,
) -> Tensor:
    """Sample each row of ``probs`` (a softmax) from its top-k / top-p truncation without sorting the vocabulary.

    A token drawn from the whole distribution by inverse CDF (:func:`inverse_cdf`) is kept when it lies in its
    row's top-k and nucleus (:func:`kept`); a row whose token is not draws again. The whole distribution
    conditioned on the kept set is the truncated, renormalised distribution, exactly, and a nucleus holds at
    least ``top_p`` of the mass, so a row keeps its draw with probability ``top_p`` or more each round. A row
    still without a token after ``rounds`` (a small top-k over a flat distribution) draws from its sorted
    truncation (:func:`truncate`). The uniforms of every round are drawn at once, ``rounds + 1`` per row of the
    width, so the random stream after a step does not depend on how many rounds its rows took. Each round costs
    two passes over the vocabulary: 64 rows of 49,152 near-uniform tokens on 2 cores take ~20 ms where the full
    sort and a race over the vocabulary took ~230 (benchmarks/sampling.py).
    """
    rows = len(probs)
    u = _uniforms(rows, rounds + 1, probs.device, slots, width)
    tokens = torch.zeros(rows, dtype=torch.long, device=probs.device)
    pending = torch.ones(rows, dtype=torch.bool, device=probs.device)
    for r in range(rounds):
        drawn = inverse_cdf(probs, u[:, r])
        accept = pending & kept(probs, drawn, top_p, top_k)
        tokens = torch.where(accept, drawn, tokens)
        pending &= ~accept
        if not bool(pending.any()):
            return tokens
    rest = pending.nonzero().squeeze(-1)
    truncated = truncate(probs[rest].log(), top_p[rest], top_k[rest]).softmax(-1)
    return tokens.index_put((rest,), inverse_cdf(truncated, u[rest, rounds]))


def sample_tokens(
    logits: Tensor,
    top_p: Tensor,
    top_k: Tensor,
    candidates: int | tuple[int, ...] = (256, 2048),
    slots: Tensor | None = None,
    width: int | None = None,
) -> Tensor:
    """Sample one token per row from ``softmax(logits)`` truncated to its top-k / top-p.

    The nucleus usually lies among the few hundred most likely tokens: when the ``c`` most likely
    tokens of every row hold its nucleus (and its top-k), the draw is made among them by the exponential
    race (:func:`_categorical`), which is exact and avoids sorting the whole vocabulary. ``candidates`` are
    the sizes ``c`` tried, smallest first; at temperature 0.8 and top-p 0.95 some row of 64 needs more than
    256 candidates at 55 of 96 steps, never more than 911 (benchmarks/rollout.py's large shape). A row
    without truncation (p=1, k=0) or a nucleus wider than every size (a flat distribution: a high
    temperature, a random model) is drawn by inverse CDF (:func:`rejection_sample`): a race over the whole
    vocabulary would draw an exponential per token, and the full sort costs more still. ``slots`` and
    ``width``: the rows' places in the batch they were sampled from (:func:`_categorical`).
    """
    probs = logits.softmax(-1)
    if bool(((top_p < 1) | (top_k > 0)).all()):
        most = probs.amax(-1)
        for size in (candidates,) if isinstance(candidates, int) else candidates:
            c = min(size, logits.shape[-1])
            if bool(((top_p < 1) & (c * most < top_p * (1 - 1e-4))).any()):
                continue  # some row's c most likely tokens hold less than its top-p: the nucleus is wider
            values, index = probs.topk(c, dim=-1)
            head = values.sum(-1)
            covered = ((top_p < 1) & (head >= top_p)) | ((top_p >= 1) & (top_k > 0) & (top_k <= c))
            if bool(covered.all()):
                values = values.masked_fill(dropped(values, top_p, top_k), 0.0)
                return index.gather(-1, _categorical(values, slots, width)[:, None]).squeeze(-1)
    return rejection_sample(probs, top_p, top_k, slots, width)
