"""A turn with tool calls (collab.tools.turns): rounds of decoding, the tool between them, the result in the
context but not the agent's own, budgets that end the turn with a reason. The agents are scripted (the decoder
is tested in tests/policy); the tokens are SmolLM2's, through its chat template."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from collab.policy.models import encode_chat
from collab.policy.sampling import Completion, GenerationRequest
from collab.tools import make_tool
from collab.tools.calls import CALL_CLOSE, CALL_OPEN, RESULT_CLOSE, RESULT_OPEN
from collab.tools.turns import Budget, generate_with_tools, insertion_ids


def call(expression: str) -> str:
    return f"{CALL_OPEN}{json.dumps({'name': 'calculator', 'arguments': {'expression': expression}})}{CALL_CLOSE}"


class Scripted:
    """A team whose agent writes ``script[k]`` in round k (k: the results in its context so far), one log-prob
    of -0.5 a token; it records each round's requests and stops where a stop text would."""

    def __init__(self, tokenizer, script: list[str], max_new_tokens: int = 64, window: int = 8192) -> None:
        self.tokenizer, self.script, self.rounds = tokenizer, script, []
        self.specs = [SimpleNamespace(sampling=SimpleNamespace(max_new_tokens=max_new_tokens))]
        self.model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=window))

    def tokenizer_of(self, agent):
        return self.tokenizer

    def model_of(self, agent):
        return self.model

    def generate(self, requests, max_new_tokens=128, stop=None):
        self.rounds.append(requests)
        out = []
        for r in requests:
            k = self.tokenizer.decode(r.prompt_ids).count(RESULT_OPEN)
            ids = self.tokenizer(self.script[k], add_special_tokens=False)["input_ids"][: r.max_new_tokens]
            text = self.tokenizer.decode(ids)
            out.append([Completion(r.agent, list(r.prompt_ids), ids, text, [-0.5] * len(ids)) for _ in range(r.n)])
        return out


@pytest.fixture
def calculator():
    return {0: {"calculator": make_tool("calculator")}}


def prompt_ids(tokenizer) -> list[int]:
    return encode_chat(tokenizer, [{"role": "user", "content": "What is 123 * 456?"}])


def test_a_call_runs_between_rounds_and_its_result_is_context_only(tiny_tokenizer, calculator):
    first, answer = "Let me compute it. " + call("123 * 456"), " The answer is 56088."
    team = Scripted(tiny_tokenizer, [first, answer])
    p = prompt_ids(tiny_tokenizer)
    (c,) = generate_with_tools(team, [GenerationRequest(0, p, 1)], calculator)[0]
    own1 = tiny_tokenizer(first, add_special_tokens=False)["input_ids"]
    own2 = tiny_tokenizer(answer, add_special_tokens=False)["input_ids"]
    inserted = insertion_ids(tiny_tokenizer, "56088")
    assert c.completion_ids == own1 + inserted + own2
    assert c.own == [True] * len(own1) + [False] * len(inserted) + [True] * len(own2)
    assert c.logprobs == [-0.5] * (len(own1) + len(own2))  # the agent's tokens' only
    # the text is the turn's transcript: what the agent wrote, each call followed by its result
    transcript = f"{tiny_tokenizer.decode(own1)}\n{RESULT_OPEN}\n56088\n{RESULT_CLOSE}\n{tiny_tokenizer.decode(own2)}"
    assert c.text == transcript and c.finished and c.stop_reason is None
    assert [(u.name, u.arguments, u.result) for u in c.tool_calls] == [
        ("calculator", {"expression": "123 * 456"}, "56088")
    ]
    shown = tiny_tokenizer.decode(inserted)  # the end of the agent's turn, the result, its next turn's header
    assert (
        shown
        == f"<|im_end|>\n<|im_start|>user\n{RESULT_OPEN}\n56088\n{RESULT_CLOSE}<|im_end|>\n<|im_start|>assistant\n"
    )
    second = team.rounds[1][0]
    assert second.prompt_ids == p + own1 + inserted and second.max_new_tokens == 64 - len(own1)


def test_errors_are_results_and_budgets_end_the_turn(tiny_tokenizer, calculator):
    p = prompt_ids(tiny_tokenizer)
    bad = f'{CALL_OPEN}{{"name": "web", "arguments": {{}}}}{CALL_CLOSE}'
    team = Scripted(tiny_tokenizer, [bad, " I cannot search."])
    (c,) = generate_with_tools(team, [GenerationRequest(0, p, 1)], calculator)[0]
    assert c.tool_calls[0].result == "error: unknown tool 'web'; the tools are calculator" and c.finished

    looping = Scripted(tiny_tokenizer, [call("1 + 1")] * 5, max_new_tokens=200)
    (c,) = generate_with_tools(looping, [GenerationRequest(0, p, 1)], calculator, Budget(calls=2))[0]
    assert len(c.tool_calls) == 2 and c.stop_reason == "call budget (2 calls a turn)" and not c.finished
    assert c.text.endswith(CALL_CLOSE)  # the third call was written, not run

    ending = Scripted(tiny_tokenizer, [call("1 + 1"), call("2 + 2"), " four"], max_new_tokens=200)
    budget = Budget(calls=2, end_after_calls=True)
    (c,) = generate_with_tools(ending, [GenerationRequest(0, p, 1)], calculator, budget)[0]
    assert [u.result for u in c.tool_calls] == ["2", "4"] and c.finished and c.stop_reason is None
    assert len(ending.rounds) == 2 and c.text.endswith(f"{RESULT_OPEN}\n4\n{RESULT_CLOSE}\n")  # no third round

    short = Scripted(tiny_tokenizer, [call("2 * 3"), " six"], window=len(p) + 30)
    (c,) = generate_with_tools(short, [GenerationRequest(0, p, 1)], calculator)[0]
    assert c.stop_reason.startswith(f"context window ({len(p) + 30} tokens)") and c.own is None
    assert len(c.prompt_ids) + len(c.completion_ids) <= len(p) + 30


def test_a_closing_tag_alone_is_an_answer(tiny_tokenizer, calculator):
    team = Scripted(tiny_tokenizer, [f"The answer is 4.{CALL_CLOSE}"])
    (c,) = generate_with_tools(team, [GenerationRequest(0, prompt_ids(tiny_tokenizer), 1)], calculator)[0]
    assert len(team.rounds) == 1 and c.tool_calls == [] and c.text == f"The answer is 4.{CALL_CLOSE}"


def test_an_agent_without_tools_answers_in_one_round(tiny_tokenizer):
    team = Scripted(tiny_tokenizer, [call("1 + 1")])
    group = generate_with_tools(team, [GenerationRequest(0, prompt_ids(tiny_tokenizer), 2)], {})[0]
    assert len(team.rounds) == 1 and len(group) == 2
    assert all(c.own is None and not c.tool_calls for c in group)


def test_a_forced_call_opens_the_turn_with_tokens_the_agent_did_not_write(tiny_tokenizer, calculator):
    """``tool_choice``: the turn starts with the opening of a call up to its first argument's value; the agent
    writes the rest of the call, which runs like any other; the opening is in the context and the text, not in
    the agent's own tokens."""
    from collab.tools.calls import call_opening

    opening = call_opening(calculator[0]["calculator"])
    assert opening == f'{CALL_OPEN}\n{{"name": "calculator", "arguments": {{"expression": "'
    rest, answer = f'7 * 8"}}}}\n{CALL_CLOSE}', " So 56."
    team = Scripted(tiny_tokenizer, [rest, answer])
    p = prompt_ids(tiny_tokenizer)
    (c,) = generate_with_tools(team, [GenerationRequest(0, p, 2)], calculator, choice={0: "calculator"})[0][:1]
    forced = tiny_tokenizer(opening, add_special_tokens=False)["input_ids"]
    own1 = tiny_tokenizer(rest, add_special_tokens=False)["input_ids"]
    assert team.rounds[0][0].prompt_ids == p + forced and team.rounds[0][0].n == 2  # the samples share it
    assert c.completion_ids[: len(forced) + len(own1)] == forced + own1
    assert c.own[: len(forced)] == [False] * len(forced) and c.own[len(forced) : len(forced) + len(own1)] == [
        True
    ] * len(own1)
    assert len(c.logprobs) == c.own_tokens == sum(c.own)
    assert [(u.arguments, u.result) for u in c.tool_calls] == [({"expression": "7 * 8"}, "56")]
    assert c.text.startswith(tiny_tokenizer.decode(forced + own1)) and "\n56\n" in c.text
    # an agent that is not forced decodes from its prompt
    free = Scripted(tiny_tokenizer, [" 56"])
    (c,) = generate_with_tools(free, [GenerationRequest(0, p, 1)], calculator, choice={1: "calculator"})[0]
    assert free.rounds[0][0].prompt_ids == p and c.own is None and c.text == " 56"
