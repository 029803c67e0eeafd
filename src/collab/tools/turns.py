"""A turn with tool calls: decoding in rounds, the tools between them, the agent's own tokens marked.

Round 0 decodes every request's samples as ``team.generate`` does, each row stopping at its end token, its
length or a call's closing tag (:data:`~collab.tools.calls.CALL_CLOSE`). Between rounds, every row that ended
with a call runs it (:func:`~collab.tools.calls.run_call`), and its result joins the row's context as the chat
template renders a tool message, followed by the header of the agent's next turn (:func:`insertion_ids`); the next
round decodes those rows on from their kept KV cache (docs/environments.md, *Tools within a turn*). A
:class:`Completion` of a turn holds every token after the prompt, its ``own`` mask (True: the agent's; the inserted
results are not), the agent's tokens' behaviour log-probs only, its transcript as text, and its calls with their
results (``tool_calls``: the trajectory records them, so a resumed run does not run a tool again).

A forced call (``choice[agent]``, the env option ``tool_choice``) opens the turn with the start of a call
(:func:`~collab.tools.calls.call_opening`); those tokens are inserted, not the agent's (not in the loss).
Budgets (:class:`Budget`; docs/environments.md#tools-within-a-turn) end a turn cleanly, the reason in
``Completion.stop_reason``; a result that would overflow the context window is not inserted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from collab.policy.sampling import Completion, GenerationRequest
from collab.tools.base import Budget, Tool
from collab.tools.calls import (
    CALL_CLOSE,
    RESULT_CLOSE,
    RESULT_OPEN,
    call_opening,
    parse_call,
    result_message,
    run_call,
    template_supports_tools,
)


@dataclass
class ToolUse:
    """One call of a turn: what the agent asked and what it read back."""

    name: str | None
    arguments: dict[str, Any]
    result: str
    seconds: float


@dataclass
class _Row:
    agent: int
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    own: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    calls: list[ToolUse] = field(default_factory=list)
    seconds: float = 0.0
    finished: bool = False
    stop_reason: str | None = None
    adapter_version: int | None = None
    tools: dict[str, Tool] = field(default_factory=dict)
    """The tools the row's agent may call, bound to the request's task."""
    round_start: int = 0
    """Where the current round's tokens start in ``ids`` (a forced call's opening counts as round 0's)."""
    transcript: list[str] = field(default_factory=list)
    past: Any = None
    """The KV cache of the row's context up to its last token, from the round that ended at its call."""

    def insert(self, ids: list[int]) -> None:
        """Tokens in the agent's context that it did not write."""
        self.ids += ids
        self.own += [False] * len(ids)

    def add(self, c: Completion, tokenizer) -> None:
        self.ids += c.completion_ids
        self.own += [True] * len(c.completion_ids)
        self.logprobs += c.logprobs
        self.finished, self.adapter_version, self.past = c.finished, c.adapter_version, c.past
        self.transcript.append(tokenizer.decode(self.ids[self.round_start :], skip_special_tokens=True))

    def own_tokens(self) -> int:
        return sum(self.own)


def insertion_ids(tokenizer, result: str) -> list[int]:
    """The tokens that follow an agent's call in its context: the end of its turn, the result as the template
    renders it (a ``tool`` message where the template renders tools, else collab's ``<tool_response>`` user
    message: :func:`~collab.tools.calls.result_message`) and the header of its next turn."""
    native = template_supports_tools(tokenizer)
    marker = "\x00CALL\x00"
    chat = [{"role": "user", "content": "u"}, {"role": "assistant", "content": marker}]
    before = tokenizer.apply_chat_template(chat, tokenize=False)
    after = tokenizer.apply_chat_template(
        chat + [result_message(result, native)], tokenize=False, add_generation_prompt=True
    )
    end_of_turn = before[before.index(marker) + len(marker) :]
    text = end_of_turn + after[len(before) :]
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def context_window(team, agent: int) -> int | None:
    config = getattr(team.model_of(agent), "config", None)
    return getattr(config, "max_position_embeddings", None)


def generate_with_tools(
    team,
    requests: list[GenerationRequest],
    tools: dict[int, dict[str, Tool]],
    budget: Budget = Budget(),
    max_new_tokens: int = 128,
    choice: dict[int, str] | None = None,
) -> list[list[Completion]]:
    """``team.generate`` with tool calls within the turn (the module docstring); ``tools[agent]``: the tools an
    agent may call by name (an agent without any decodes as usual: its first round is its turn); ``choice[agent]``:
    the tool whose call opens the agent's turn (None or absent: the agent decides)."""
    rows: list[list[_Row]] = []
    for r in requests:
        bound = {name: tool.for_task(r.task) for name, tool in tools.get(r.agent, {}).items()}
        rows.append([_Row(r.agent, list(r.prompt_ids), tools=bound) for _ in range(r.n)])
    asks = []
    for r, group in zip(requests, rows):
        forced = (choice or {}).get(r.agent)
        opening = []
        if forced:
            text = call_opening(group[0].tools[forced])
            opening = list(team.tokenizer_of(r.agent)(text, add_special_tokens=False)["input_ids"])
        for row in group:
            row.insert(opening)
        limit = _limit(team, group[0], budget, max_new_tokens)
        asks.append(GenerationRequest(r.agent, list(r.prompt_ids) + opening, r.n, limit))
    for group, outs in zip(rows, team.generate(asks, max_new_tokens, stop=CALL_CLOSE)):
        for row, c in zip(group, outs):
            row.add(c, team.tokenizer_of(row.agent))
    pending = [row for group in rows for row in group]
    while pending:
        again = []
        for row in pending:
            if not _call(team, row, row.tools, budget, max_new_tokens):
                row.past = None  # its turn is over
            elif budget.end_after_calls and len(row.calls) >= budget.calls:
                row.finished, row.past = True, None  # the result ends the turn
            else:
                again.append(row)
        if not again:
            break
        asks = [
            GenerationRequest(
                row.agent,
                row.prompt_ids + row.ids,
                1,
                _limit(team, row, budget, max_new_tokens) - row.own_tokens(),
                past=row.past,
            )
            for row in again
        ]
        for row, outs in zip(again, team.generate(asks, max_new_tokens, stop=CALL_CLOSE)):
            row.add(outs[0], team.tokenizer_of(row.agent))
        pending = again
    return [[_completion(row) for row in group] for group in rows]


def _limit(team, row: _Row, budget: Budget, max_new_tokens: int) -> int:
    """The agent's own tokens the turn may hold."""
    return budget.tokens or team.specs[row.agent].sampling.max_new_tokens or max_new_tokens


def _call(team, row: _Row, tools: dict[str, Tool], budget: Budget, max_new_tokens: int) -> bool:
    """Run the call that ends ``row``'s round, if any, and insert its result: whether the row decodes on."""
    if not tools:
        return False
    tokenizer = team.tokenizer_of(row.agent)
    text = row.transcript[-1]  # this round's: a call is read from the round that wrote it
    if not text.rstrip().endswith(CALL_CLOSE):
        return False  # answered (or cut at its length): the turn is over
    call = parse_call(text)
    if call is None:  # a closing tag without an opening one: no call, the reply is the answer
        return False
    if len(row.calls) >= budget.calls:
        row.stop_reason = f"call budget ({budget.calls} calls a turn)"
        return False
    if row.seconds >= budget.tool_seconds:
        row.stop_reason = f"tool time budget ({budget.tool_seconds:g} s a turn)"
        return False
    if row.own_tokens() >= _limit(team, row, budget, max_new_tokens):
        row.stop_reason = "token budget"
        return False
    start = time.perf_counter()
    result = run_call(call, tools)
    seconds = time.perf_counter() - start
    row.seconds += seconds
    row.calls.append(ToolUse(call.name, dict(call.arguments), result, seconds))
    inserted = insertion_ids(tokenizer, result)
    window = budget.context or context_window(team, row.agent)
    if window is not None and len(row.prompt_ids) + len(row.ids) + len(inserted) + 1 > window:
        row.stop_reason = f"context window ({window} tokens): the result of call {len(row.calls)} does not fit"
        return False
    row.insert(inserted)
    row.transcript.append(f"\n{RESULT_OPEN}\n{result}\n{RESULT_CLOSE}\n")
    row.round_start, row.finished = len(row.ids), False
    return True


def _completion(row: _Row) -> Completion:
    return Completion(
        row.agent,
        row.prompt_ids,
        row.ids,
        "".join(row.transcript),
        row.logprobs,
        row.finished and row.stop_reason is None,
        adapter_version=row.adapter_version,
        own=None if all(row.own) else row.own,
        tool_calls=row.calls,
        stop_reason=row.stop_reason,
    )
