"""Prompts that show an agent its tools, in the template's own format or collab's default, and a team with tools
that decodes as the bare team while no call is made (collab.tools.team)."""

from __future__ import annotations

import copy

import torch

from collab.policy.models import encode_chat
from collab.policy.sampling import GenerationRequest
from collab.tools import make_tool
from collab.tools.calls import template_supports_tools, tools_prompt
from collab.tools.team import ToolTeam
from collab.tools.turns import insertion_ids
from tests.policy.test_team import make_team

CHAT = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 123 * 456?"}]
# A template of our own that renders tools= and tool messages (as Qwen's do, in fewer lines)
NATIVE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_the_default_format_goes_after_the_system_message(tiny_tokenizer):
    team = ToolTeam(make_team(1.0), {0: {"calculator": make_tool("calculator")}})
    shown = tiny_tokenizer.decode(team.encode(0, CHAT))
    assert f"You add numbers.\n\n{tools_prompt([make_tool('calculator')])}<|im_end|>" in shown
    assert shown.endswith("<|im_start|>assistant\n")


def test_a_template_that_renders_tools_gets_them_as_its_own(tiny_tokenizer):
    native = copy.deepcopy(tiny_tokenizer)
    native.chat_template = NATIVE
    assert template_supports_tools(native)
    from collab.tools.calls import encode_with_tools

    shown = native.decode(encode_with_tools(native, CHAT, [make_tool("calculator"), make_tool("python")]))
    assert shown.startswith("<|im_start|>system\nTools: calculator python<|im_end|>\n<|im_start|>system\nYou add")
    inserted = native.decode(insertion_ids(native, "56088"))
    assert inserted == "<|im_end|>\n<|im_start|>tool\n56088<|im_end|>\n<|im_start|>assistant\n"


def test_without_a_call_the_team_with_tools_decodes_as_the_bare_team(one_thread):
    bare = make_team(1.0, 1.0)
    with_tools = ToolTeam(bare, {1: {"calculator": make_tool("calculator")}})
    requests = [GenerationRequest(a, encode_chat(bare.tokenizer_of(a), CHAT), 2) for a in (0, 1)]
    assert with_tools.encode(0, CHAT) == bare.encode(0, CHAT)  # agent 0 has no tools
    torch.manual_seed(3)
    plain = bare.generate(requests)
    torch.manual_seed(3)
    tooled = with_tools.generate(requests)
    for a, b in zip(plain, tooled):
        for x, y in zip(a, b):
            assert not y.tool_calls and y.own is None  # the random tiny model calls nothing
            assert (x.completion_ids, x.logprobs, x.text, x.finished) == (
                y.completion_ids,
                y.logprobs,
                y.text,
                y.finished,
            )
