"""The call format: how an agent writes a tool call, how it reads the result.

A call is a JSON object between tags, the format of Qwen's chat templates (Qwen2.5 and Qwen3 render ``tools=`` so,
and so do Hermes-style templates)::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "123456 * 789"}}
    </tool_call>

Decoding stops at :data:`CALL_CLOSE`; :func:`parse_call` reads the call at the reply's end. A template that renders
tools (:func:`template_supports_tools`) gets them its own way; one that does not gets :func:`tools_prompt` after its
system prompt and each result as a user message in ``<tool_response>`` tags. A malformed call or an unknown tool is
an ``error: ...`` result naming what would be valid, never an exception (docs/environments.md, *Tools within a turn*).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from collab.tools.base import Tool

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<tool_response>", "</tool_response>"


@dataclass(frozen=True)
class ToolCall:
    """A call read from a reply: the tool's name and arguments, or why it could not be read (``error``)."""

    name: str | None
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def parse_call(reply: str) -> ToolCall | None:
    """The last call that ``reply`` opens (None: the reply calls nothing and is the agent's answer)."""
    start = reply.rfind(CALL_OPEN)
    if start < 0:
        return None
    body = reply[start + len(CALL_OPEN) :]
    end = body.find(CALL_CLOSE)
    if end < 0:
        return ToolCall(None, error=f"the call was not closed with {CALL_CLOSE}")
    try:
        call = json.loads(body[:end].strip())
    except ValueError as e:
        return ToolCall(None, error=f'the call is not JSON ({e.msg}); write {{"name": ..., "arguments": {{...}}}}')
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCall(None, error='the call needs a "name" (a string) and "arguments" (an object)')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(call["name"], error='the call\'s "arguments" must be an object')
    return ToolCall(call["name"], arguments)


def run_call(call: ToolCall, tools: dict[str, Tool]) -> str:
    """The result text of ``call`` against the agent's ``tools`` (errors as text)."""
    if call.error is not None:
        return f"error: {call.error}"
    if call.name not in tools:
        return f"error: unknown tool {call.name!r}; the tools are {', '.join(sorted(tools)) or 'none'}"
    return tools[call.name](call.arguments)


def call_opening(tool: Tool) -> str:
    """The start of a call to ``tool``, up to the value of its first required argument when that is a string
    (``<tool_call>\n{"name": "calculator", "arguments": {"expression": "``), else up to its arguments' object: what
    a forced call (``tool_choice``) puts at the start of a turn for the agent to go on from."""
    opening = f'{CALL_OPEN}\n{{"name": {json.dumps(tool.name)}, "arguments": {{'
    required = tool.parameters.get("required") or []
    if required and tool.parameters.get("properties", {}).get(required[0], {}).get("type") == "string":
        opening += f'{json.dumps(required[0])}: "'
    return opening


def template_supports_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders ``tools=`` (it reads a ``tools`` variable)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # named templates: the default one
        template = template.get("default", "")
    return "tools" in template


def tools_prompt(tools: list[Tool]) -> str:
    """collab's default tool instructions, for a system prompt whose template has no ``tools``."""
    schemas = "\n".join(json.dumps(t.schema(), separators=(", ", ": ")) for t in tools)
    return (
        "You may call tools. Their descriptions:\n"
        f"<tools>\n{schemas}\n</tools>\n"
        f"To call one, write {CALL_OPEN} with a JSON object of its name and arguments, then {CALL_CLOSE}:\n"
        f'{CALL_OPEN}\n{{"name": "TOOL", "arguments": {{...}}}}\n{CALL_CLOSE}\n'
        f"The result comes back between {RESULT_OPEN} and {RESULT_CLOSE}; then go on with your answer."
    )


def encode_with_tools(tokenizer, messages, tools: list[Tool]) -> list[int]:
    """Token ids of an agent's chat that shows its ``tools``, ending with the assistant turn's header: the
    template's own ``tools=`` where it renders them, else :func:`tools_prompt` after the system message (a system
    message of its own when the chat has none: a template's default system text is then replaced)."""
    from collab.policy.models import encode_chat

    messages = list(messages)
    if template_supports_tools(tokenizer):
        return encode_chat(tokenizer, messages, tools=[t.schema() for t in tools])
    text = tools_prompt(tools)
    if messages and messages[0].get("role") == "system":
        messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}
    else:
        messages.insert(0, {"role": "system", "content": text})
    return encode_chat(tokenizer, messages)


def result_message(result: str, native: bool) -> dict[str, str]:
    """The chat message carrying a tool's result: a ``tool`` message for a template that renders tools, else
    a user message in the same tags."""
    if native:
        return {"role": "tool", "content": result}
    return {"role": "user", "content": f"{RESULT_OPEN}\n{result}\n{RESULT_CLOSE}"}
