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
from collab.policy.draw import sample_tokens
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
