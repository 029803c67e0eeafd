"""Batched sampling across agents: one decoding loop serves every agent and every sample on a base.

peft runs a batch whose rows use different adapters (``adapter_names=``), so the K samples of all n
agents go through the model together: n*K rows per decoding step instead of n separate ``generate``
calls. Each distinct prompt is prefilled once and its KV cache repeated for its samples, and prompts
that open with the same long start under one adapter prefill that start once
(:func:`~collab.policy.prefill.prefill`). Rows carry their own temperature, top-p, top-k, length limit and action
vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from collab import preemption
from collab.policy.kv_cache import RowCache, cache_key, reserve, row_cache
from collab.policy.lora_batch import AdapterRows
from collab.policy.prefill import prefill, resume_prefill
from collab.policy.prefixes import shares_prefixes


@dataclass
class GenerationRequest:
    """Sample ``n`` responses of ``agent`` to ``prompt_ids``."""

    agent: int
    prompt_ids: list[int]
    n: int = 1
    max_new_tokens: int | None = None
    """This request's length limit (None: its agent's ``max_new_tokens``): a tool-using turn's later rounds get
    what is left of the turn's (:mod:`collab.tools.turns`)."""
    task: Mapping[str, Any] | None = None
    """The env's task the response acts on (None: unknown): a tool of the task's own, such as the coding env's
    ``run_tests``, is bound to it (:meth:`collab.tools.Tool.for_task`)."""
    past: RowCache | None = field(default=None, repr=False, compare=False)
    """The KV cache of this request's first ``past.length`` prompt tokens, kept from the round that wrote them (a
    tool-using turn's next round, :mod:`collab.tools.turns`): only the rest of the prompt is prefilled."""


@dataclass
class Completion:
    """One sampled response."""

    agent: int
    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    logprobs: list[float] = field(default_factory=list)
    """Behaviour log-prob of each completion token under the agent's policy when it was sampled."""
    finished: bool = True
    """False when the response was cut at the length limit."""
    own: list[bool] | None = None
    """Which of ``completion_ids`` the agent wrote (None: all): a tool's result that joined the context within the
    turn is not the agent's, and has no behaviour log-prob (``logprobs`` holds the agent's tokens' only)."""
    tool_calls: list = field(default_factory=list)
    """The turn's tool calls with their results (:class:`collab.tools.turns.ToolUse`), in order."""
    stop_reason: str | None = None
    """Why a tool-using turn ended before its answer (a budget, the context window); None otherwise."""
    adapter_version: int | None = None
    """The version of the agent's adapter (a full agent: of its weights) that sampled it (``--model.engine vllm``:
    bumped at each export or load of changed weights, :mod:`collab.policy.vllm_engine`); ``None``: collab's own
    loop, which samples from the live weights."""
    past: RowCache | None = field(default=None, repr=False, compare=False)
    """A response that ended at ``decode``'s stop text (a tool call): the KV cache of its prompt and its tokens but
    the last (which was sampled, not yet fed), for the round that goes on from it; None otherwise."""

    @property
    def logprob(self) -> float:
        return float(sum(self.logprobs))

    @property
    def own_tokens(self) -> int:
        """The tokens the agent wrote (all of ``completion_ids`` but a tool's results)."""
        return len(self.completion_ids) if self.own is None else sum(self.own)


def own_rows(rows: list[Tensor], own: list[list[bool] | None]) -> list[Tensor]:
    """Each per-token tensor of ``rows`` (one row per completion token) at its completion's own tokens only."""
    return [r if o is None else r[torch.as_tensor(o, dtype=torch.bool, device=r.device)] for r, o in zip(rows, own)]


def action_mask(choice_ids: Tensor | None, vocab: int, device=None) -> Tensor | None:
    """Boolean mask over a vocabulary of ``vocab`` tokens, True at ``choice_ids`` (None: no restriction)."""
    if choice_ids is None:
        return None
    mask = torch.zeros(vocab, dtype=torch.bool, device=device)
    mask[choice_ids.to(mask.device)] = True
    return mask


def policy_logits(logits: Tensor, temperature: float | Tensor, mask: Tensor | None = None) -> Tensor:
    """Logits of an agent's policy: restricted to its action vocabulary, divided by the temperature.

    ``logits`` is ``(..., V)``. ``temperature`` is a float or a tensor of per-row temperatures whose
    shape is a prefix of ``logits.shape[:-1]`` (one per row of a batch). ``mask`` (optional) is a
    boolean ``(..., V)`` tensor broadcastable to ``logits``, False at the tokens outside the agent's
    closed action vocabulary (see :func:`action_mask`). A temperature of 0 means greedy sampling; its
    log-probs are taken at temperature 1.
    """
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    if isinstance(temperature, Tensor):
        scale = temperature.masked_fill(temperature <= 0, 1.0).to(logits.dtype)
        return logits / scale.reshape(scale.shape + (1,) * (logits.dim() - scale.dim()))
    return logits / temperature if temperature > 0 else logits


def truncate(logits: Tensor, top_p: Tensor, top_k: Tensor) -> Tensor:
    """Mask logits outside each row's top-k and nucleus top-p (rows with k=0, p=1 unchanged)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device).expand_as(logits)
    drop = (top_k[:, None] > 0) & (ranks >= top_k[:, None])
    probs = sorted_logits.softmax(-1)
    before = probs.cumsum(-1) - probs  # mass strictly before each token
    drop |= (before >= top_p[:, None]) & (top_p[:, None] < 1)  # float rounding reaches 1 early
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def _categorical(probs: Tensor, slots: Tensor | None = None, width: int | None = None) -> Tensor:
    """One draw per row: argmax of p / E with E ~ Exp(1) (the exponential race; cheaper than multinomial).

    ``slots`` (optional): row i of ``probs`` is row ``slots[i]`` of a batch of ``width`` rows. The
    draws are made for the whole width and each row takes its slot's, so a row samples the same
    token whether or not the other rows of its batch are still there (see :func:`decode`).
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
    action vocabulary) is never drawn."""
    rows, vocab = probs.shape
    blocks = -(-vocab // BLOCK)
    padded = torch.nn.functional.pad(probs, (0, blocks * BLOCK - vocab)).view(rows, blocks, BLOCK)
    block_cdf = padded.sum(-1, dtype=torch.float64).cumsum(-1)
    total = block_cdf[:, -1:]
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
                ranks = torch.arange(c, device=logits.device).expand_as(values)
                before = values.cumsum(-1) - values
                drop = ((top_k[:, None] > 0) & (ranks >= top_k[:, None])) | (
                    (before >= top_p[:, None]) & (top_p[:, None] < 1)
                )
                values = values.masked_fill(drop, 0.0)
                return index.gather(-1, _categorical(values, slots, width)[:, None]).squeeze(-1)
    return rejection_sample(probs, top_p, top_k, slots, width)


@torch.no_grad()
def decode(
    model, tokenizer, rows: list[GenerationRequest], adapters: list[str], settings, stop: str | None = None
) -> list[list[Completion]]:
    """Sample every request's ``n`` responses in one batched loop.

    ``settings[r] = (temperature, top_p, top_k, max_new_tokens, choice_ids)`` of request ``r``'s agent. ``stop``: a
    text that ends a response once its text ends with it (a tool call's closing tag), beside the end token.
    A response that ends (its end token or its length limit) leaves the batch before the next step:
    its KV cache rows, mask and settings are dropped, so the steps after it cost only the
    rows still running (agents with different length limits share a batch; responses end at different
    lengths). Each row keeps the random draws of its place in the original batch, so it samples the
    same tokens as it would with the finished rows still in the batch (up to the float rounding of a
    matrix product of another height, and as long as :func:`sample_tokens` takes the same path: its
    top-``c`` shortcut and its size ``c`` depend on every row of the batch, so a finished
    row that did not could change which exact draw, not which distribution, a running row samples).

    With a ``stop`` text, a row that ends at it keeps its KV cache (``Completion.past``); a next round whose
    requests all carry one (``GenerationRequest.past``) prefills only what follows it
    (:func:`~collab.policy.prefill.resume_prefill`). Models that do not share prefixes (a sliding window:
    :func:`~collab.policy.prefixes.shares_prefixes`) prefill the whole prompt again.
    """
    device = model.get_input_embeddings().weight.device
    pad = tokenizer.pad_token_id
    eos = {tokenizer.eos_token_id, pad} - {None}
    keep_caches = bool(stop) and shares_prefixes(model)
    cache, logits, index, mask, positions = _prefilled(model, rows, adapters, settings, keep_caches, pad, device)
    rix = index.tolist()
    batch = len(rix)
    limits = [_limit(settings[i]) for i in rix]
    reserve(cache, max(limits))  # a prefill in one pass left dynamic layers; one in pieces reserved the room already
    choices = [settings[i][4] for i in rix]
    state = _row_state(settings, rix, mask[index], positions[index, -1:], logits.shape[-1], device)
    tokens: list[list[int]] = [[] for _ in range(batch)]
    logps: list[list[float]] = [[] for _ in range(batch)]
    running = list(range(batch))  # the original row of each row of the batch
    tail = len(stop) if stop else 0  # a stop text is within its length in tokens (each at least one character)
    at_stop: set[int] = set()  # rows whose text ended with the stop text
    pasts: dict[int, RowCache] = {}  # their KV caches, for the round that goes on from them
    step_forward = AdapterRows(model, [adapters[i] for i in rix])
    for _ in range(max(limits)):
        preemption.check()  # a SIGTERM stops a long rollout or evaluation here (collab.preemption)
        nxt, logp = _next_tokens(logits, state, batch)
        keep = []
        for i, b in enumerate(running):
            t = int(nxt[i])
            tokens[b].append(t)
            logps[b].append(float(logp[i, t]))
            if tail and tokenizer.decode(tokens[b][-tail:], skip_special_tokens=True).endswith(stop):
                at_stop.add(b)
            if t not in eos and len(tokens[b]) < limits[b] and b not in at_stop:
                keep.append(i)
            elif keep_caches and b in at_stop:
                pasts[b] = row_cache(cache, state["mask"][i], i)
        if not keep:
            break
        if len(keep) < len(running):  # the finished rows leave the batch
            kept = torch.tensor(keep, device=device)
            cache.batch_select_indices(kept)
            state = {k: v if v is None else v[kept] for k, v in state.items()}
            nxt = nxt[kept]
            running = [running[i] for i in keep]
            step_forward.close()
            step_forward = AdapterRows(model, [adapters[rix[b]] for b in running])
        cache, logits = _step(step_forward, nxt, state, cache)
    step_forward.close()
    results: list[list[Completion]] = [[] for _ in rows]
    for b, r in enumerate(rix):
        finished = bool(tokens[b]) and (tokens[b][-1] in eos or choices[b] is not None or b in at_stop)
        text = tokenizer.decode(tokens[b], skip_special_tokens=True)
        results[r].append(
            Completion(rows[r].agent, list(rows[r].prompt_ids), tokens[b], text, logps[b], finished, past=pasts.get(b))
        )
    return results


def _limit(setting) -> int:
    """A request's new tokens at most (a closed action vocabulary: one), the cache's room after its prompt."""
    return 1 if setting[4] is not None else setting[3]


def _prefilled(model, rows: list[GenerationRequest], adapters, settings, keep_caches: bool, pad, device):
    """The requests' prompts prefilled (:func:`~collab.policy.prefill.resume_prefill` when each carries its cache),
    each prompt's cache and last logits repeated for its n samples: ``(cache, logits, index, mask, positions)``,
    ``index`` the request of each sample, ``mask`` and ``positions`` per request."""
    if keep_caches and rows and all(r.past is not None and r.n == 1 for r in rows):
        out, mask, positions = resume_prefill(
            model, [r.past for r in rows], [r.prompt_ids[r.past.length :] for r in rows], adapters, pad, device
        )
    else:
        room = max(_limit(s) for s in settings)
        out, mask, positions = prefill(model, [r.prompt_ids for r in rows], adapters, pad, device, room=room)
    index = torch.repeat_interleave(
        torch.arange(len(rows), device=device), torch.tensor([r.n for r in rows], device=device)
    )
    cache = out[cache_key()]
    cache.batch_select_indices(index)
    return cache, out.logits[index, -1].float(), index, mask, positions


def _row_state(settings, rix: list[int], mask: Tensor, positions: Tensor, vocab: int, device) -> dict:
    """The per-row tensors of a decoding batch (row ``b`` samples for request ``rix[b]``): attention mask, last
    position, sampling settings, closed action vocabulary (``allowed``, None without one) and place in the batch."""
    state = {
        "mask": mask,
        "positions": positions,
        "temperature": torch.tensor([settings[i][0] for i in rix], device=device, dtype=torch.float),
        "top_p": torch.tensor([settings[i][1] for i in rix], device=device, dtype=torch.float),
        "top_k": torch.tensor([settings[i][2] for i in rix], device=device),
        "allowed": None,
        "slots": torch.arange(len(rix), device=device),
    }
    choices = [settings[i][4] for i in rix]
    if any(c is not None for c in choices):  # closed action vocabularies as a row mask
        state["allowed"] = torch.ones(len(rix), vocab, dtype=torch.bool, device=device)
        for b, c in enumerate(choices):
            if c is not None:
                state["allowed"][b] = action_mask(c, vocab, device)
    return state


def _next_tokens(logits: Tensor, state: dict, width: int) -> tuple[Tensor, Tensor]:
    """Each running row's next token (greedy at temperature 0) and its policy's log-probs."""
    pol = policy_logits(logits, state["temperature"], state["allowed"])
    logp = pol.log_softmax(-1)
    greedy = state["temperature"] <= 0
    if bool(greedy.all()):  # nothing to draw (an evaluation)
        return pol.argmax(-1), logp
    sampled = sample_tokens(pol, state["top_p"], state["top_k"], slots=state["slots"], width=width)
    return torch.where(greedy, pol.argmax(-1), sampled), logp


def _step(step_forward, nxt: Tensor, state: dict, cache):
    """Feed each running row its token ``nxt``: ``(cache, next logits)``; ``state``'s mask and positions advance."""
    state["mask"] = torch.cat([state["mask"], torch.ones_like(state["mask"][:, :1])], dim=-1)
    state["positions"] = state["positions"] + 1
    out = step_forward(
        input_ids=nxt[:, None],
        attention_mask=state["mask"],
        position_ids=state["positions"],
        **{cache_key(): cache},
        use_cache=True,
    )
    return out[cache_key()], out.logits[:, -1].float()
