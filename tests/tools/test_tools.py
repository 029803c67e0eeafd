"""The tools (collab.tools): exact arithmetic, BM25 against a hand computation, the sandboxed python tool, the
call format, and the registry. A call the tool cannot run is an ``error: ...`` result, never an exception."""

import json
import math
import os
import time
from pathlib import Path

import pytest

from collab import sandbox
from collab.errors import UserError
from collab.tools import make_tool, tool_names
from collab.tools.calculator import calculate
from collab.tools.calls import (
    CALL_CLOSE,
    CALL_OPEN,
    ToolCall,
    parse_call,
    result_message,
    run_call,
    template_supports_tools,
    tools_prompt,
)
from collab.tools.search import BM25, Search, read_corpus
from tests.sandbox.test_sandbox import parent  # noqa: F401 (a fixture: the caller's process, files and secrets)

CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "expression, value",
    [
        ("123456 * 654321", "80779853376"),  # 123456 * 654321 = 80,779,853,376
        ("987654 + 123456", "1111110"),
        ("0.1 + 0.2", "0.3"),  # decimals are exact, not floats (0.30000000000000004)
        ("7 / 4", "1.75"),
        ("1 / 3", "1/3 ≈ 0.333333333333"),
        ("2 ** -3", "0.125"),
        ("(3 + 4) * -2", "-14"),
        ("10 // 3 + 10 % 3", "4"),
        ("1.5e3 - 1_000", "500"),
        ("99999999999999999999 * 99999999999999999999", str(99999999999999999999**2)),
    ],
)
def test_the_calculator_is_exact(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    "expression, error",
    [
        ("__import__('os').system('true')", "not Call"),
        ("x + 1", "not Name"),
        ("(1).real", "not Attribute"),
        ("'a' * 3", "not str"),
        ("2 ^ 3", "use ** for a power"),
        ("1 / 0", "division by zero"),
        ("2 ** 0.5", "the exponent must be an integer"),
        ("9 ** 9 ** 9", "more than 4000 digits"),  # refused from its logarithm, before computing it
        ("10 ** 3000 * 10 ** 3000", "more than 4000 digits"),
        ("(1 + 2", "not an arithmetic expression"),
        ("1" * 1001, "at most 1000"),
    ],
)
def test_the_calculator_refuses_what_is_not_bounded_arithmetic(expression, error):
    start = time.perf_counter()
    result = make_tool("calculator")({"expression": expression})
    assert result.startswith("error: ") and error in result, result
    assert time.perf_counter() - start < 5  # a generous bound: a refused power is never computed


def test_bm25_scores_agree_with_a_hand_computation():
    """Query "apple" over d1 "apple banana", d2 "apple apple cherry", d3 "cherry date" (k1 1.5, b 0.75):
    N 3, n 2: idf = ln(1 + 1.5 / 2.5) = ln 1.6 = 0.4700036; avgdl 7/3;
    d1: tf 1, |d| 2: 0.4700036 * 2.5 / (1 + 1.5 (0.25 + 0.75 * 6/7)) = 0.4700036 * 2.5 / 2.3392857 = 0.5022939;
    d2: tf 2, |d| 3: 0.4700036 * 5 / (2 + 1.5 (0.25 + 0.75 * 9/7)) = 0.4700036 * 5 / 3.8214286 = 0.6149578."""
    docs = [{"title": "", "text": t} for t in ("apple banana", "apple apple cherry", "cherry date")]
    index = BM25(docs)
    scores = index.scores("Apple apple?")  # lowercased; a repeated query term counts once
    assert scores[0] == pytest.approx(0.5022939, rel=1e-6) and scores[1] == pytest.approx(0.6149578, rel=1e-6)
    assert scores[2] == 0.0
    assert index.top("apple", 5) == [1, 0]  # no zero-score document
    assert index.idf["date"] == pytest.approx(math.log(1 + 2.5 / 1.5))


def test_search_reads_corpora_in_both_formats_and_cuts_its_result(tmp_path):
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text(
        "\n".join(
            json.dumps(d)
            for d in (
                {"title": "Paris", "text": "Paris is the capital of France."},
                {"title": "Rome", "text": "Rome is the capital of Italy."},
            )
        )
    )
    text = tmp_path / "docs.txt"
    text.write_text("Paris\nThe capital of France.\n\nRome\nThe capital of Italy.\n")
    assert read_corpus(text)[1] == {"title": "Rome", "text": "Rome\nThe capital of Italy."}
    tool = make_tool("search", corpus=str(jsonl), max_chars=40)
    result = tool({"query": "capital of Italy", "k": 1})
    assert result == "[1] Rome: Rome is the capital of Italy."
    assert tool({"query": "capital", "k": 9}).endswith(" [truncated]")  # 2 documents, cut to 40 characters
    assert tool({"query": "Berlin"}) == "no document matches"
    assert tool({"k": 1}).startswith("error: search needs the argument 'query'")
    assert tool({"query": "x", "k": "two"}) == "error: search's 'k' must be a int, got str"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "no text"}\n')
    with pytest.raises(UserError, match="line 1: not a JSON object with a 'text' field"):
        Search(bad)


def test_python_runs_in_the_sandbox_and_reports_failures_as_text():
    tool = make_tool("python", timeout_s=1.0, max_chars=200)
    assert tool({"code": "print(sum(range(10)))"}) == "45"
    failed = tool({"code": "print('before')\n1 / 0"})
    assert failed.startswith("before\n") and "ZeroDivisionError: division by zero" in failed
    assert tool({"code": "while True: pass"}).endswith("error: stopped after 1 s (the time limit)")
    flood = tool({"code": "print('x' * 100000)"})
    assert len(flood) <= 200 + len(" [truncated]") and flood.endswith(" [truncated]")
    assert tool({"code": ""}) == "(no output)"


@pytest.mark.skipif(
    not (os.geteuid() == 0 and sandbox.network_isolated()), reason="the jail's file system and network need root"
)
def test_python_calls_are_jailed():
    tool = make_tool("python", timeout_s=3.0)
    hostile = (
        "import os, socket\n"
        f"print(os.path.exists({str(CHECKOUT / 'README.md')!r}))\n"
        "s = socket.socket(socket._socket.AF_INET, socket._socket.SOCK_STREAM)\n"
        "s.settimeout(1)\n"
        "try:\n    s.connect(('1.1.1.1', 53)); print('connected')\nexcept OSError as e:\n    print('no network')\n"
    )
    assert tool({"code": hostile}) == "False\nno network"


def test_calls_are_read_from_the_reply_and_errors_are_results():
    tools = {"calculator": make_tool("calculator")}
    call_text = '{"name": "calculator", "arguments": {"expression": "6 * 7"}}'
    reply = f"I will compute it.\n{CALL_OPEN}\n{call_text}\n{CALL_CLOSE}"
    call = parse_call(reply)
    assert call == ToolCall("calculator", {"expression": "6 * 7"}) and run_call(call, tools) == "42"
    as_string = f'{CALL_OPEN}{{"name": "calculator", "arguments": "{{\\"expression\\": \\"1+1\\"}}"}}{CALL_CLOSE}'
    assert run_call(parse_call(as_string), tools) == "2"
    assert parse_call("The answer is 42.") is None
    for text, error in (
        (f"{CALL_OPEN}{{oops}}{CALL_CLOSE}", "error: the call is not JSON"),
        (f'{CALL_OPEN}{{"arguments": {{}}}}{CALL_CLOSE}', 'error: the call needs a "name"'),
        (f'{CALL_OPEN}{{"name": "calculator", "arguments": [1]}}{CALL_CLOSE}', 'error: the call\'s "arguments"'),
        (f'{CALL_OPEN}{{"name": "calculator"', f"error: the call was not closed with {CALL_CLOSE}"),
        (
            f'{CALL_OPEN}{{"name": "web", "arguments": {{}}}}{CALL_CLOSE}',
            "error: unknown tool 'web'; the tools are calculator",
        ),
    ):
        assert run_call(parse_call(text), tools).startswith(error), text


def test_the_default_format_serves_templates_without_tools(tiny_tokenizer):
    assert not template_supports_tools(tiny_tokenizer)  # SmolLM2's template has no tools

    class Qwen:
        chat_template = "{%- if tools %}<tools>{{ tools }}</tools>{%- endif %}"

    assert template_supports_tools(Qwen())
    prompt = tools_prompt([make_tool("calculator")])
    schemas = prompt.split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(schemas)["function"]["name"] == "calculator"
    assert result_message("42", native=False) == {"role": "user", "content": "<tool_response>\n42\n</tool_response>"}
    assert result_message("42", native=True) == {"role": "tool", "content": "42"}


def test_the_registry_names_what_is_valid(tmp_path, monkeypatch):
    assert tool_names() == ["calculator", "python", "search"]
    with pytest.raises(UserError, match="unknown tool 'web'; valid: calculator, python, search"):
        make_tool("web")
    with pytest.raises(UserError, match="tool 'calculator' has no option 'digits'; its options: none"):
        make_tool("calculator", digits=3)
    (tmp_path / "my_tools.py").write_text(
        "from collab.tools import Tool\n"
        "class Echo(Tool):\n"
        "    name, description = 'echo', 'Say it back.'\n"
        "    parameters = {'type': 'object', 'properties': {'text': {'type': 'string'}}, 'required': ['text']}\n"
        "    def run(self, arguments):\n"
        "        return self.argument(arguments, 'text', str)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert make_tool("my_tools:Echo")({"text": "hi"}) == "hi"


HOSTILE_CALLS = {
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "memory bomb": "x = bytearray(10 * 1024 ** 3)\n",
    "daemon": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(100)\ntime.sleep(100)\n",
    "kill the parent": "import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(100)\n",
    "secrets": "import os\nprint('COLLAB_SECRET' in os.environ, os.environ.get('COLLAB_SECRET'))\n",
    "the parent's file": "open({path!r}, 'w').write('pwned')\n",
}


@pytest.mark.parametrize("name", list(HOSTILE_CALLS))
def test_hostile_programs_through_the_python_tool_end_as_text(name, parent):  # noqa: F811 (the sandbox's fixture)
    """The sandbox's hostile programs (tests/sandbox) sent as tool calls: each ends within its time limit as a
    result the agent reads, the caller's process, environment and files unharmed (the ``parent`` fixture checks
    them and that no sandboxed process is left)."""
    if name == "the parent's file" and os.geteuid() != 0:
        pytest.skip("keeping the parent's files needs the sandbox's uid separation (a root parent)")
    tool = make_tool("python", timeout_s=1.5)
    start = time.monotonic()
    result = run_call(ToolCall("python", {"code": HOSTILE_CALLS[name].format(path=str(parent))}), {"python": tool})
    assert time.monotonic() - start < 1.5 + 1.0 and isinstance(result, str)
    assert "hunter2" not in result
    if name == "secrets":
        assert result == "False None"
    elif name == "memory bomb":
        assert "MemoryError" in result
    else:
        assert "error:" in result or "Error" in result
