"""Reading the two roles' actions in PettingLLMs' grid games (Plan-Path, Sudoku, Sokoban).

The tool agent writes a Python program whose printed output names an action list; the plan agent writes its
reasoning and ends with a line ``#### <action list>``. How each is read follows PettingLLMs'
``pettingllms/multi_agent_env/stateful/utils.py``: :func:`final_action` is ``extract_final_action``,
:func:`program` is ``extract_code_from_response`` and :func:`printed_action` is ``extract_actions_from_code_output``,
with one difference: a list is read with :func:`ast.literal_eval` (never ``eval``), and a printed
``**Actions List**:`` is read up to its matching bracket (the reference's non-greedy ``\\[.*?\\]`` stops at the
first ``]``, so a printed Sudoku grid, the format its prompt asks for, never parses there).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

MOVES = ("U", "D", "L", "R")
_FINAL = re.compile(r"(?m)^\s*####\s+(.+)$")
_FENCES = (
    re.compile(r"```python\s*(.*?)```", re.S),
    re.compile(r"```\s*(.*?)```", re.S),
    re.compile(r"```python\s*(.*?)$", re.S),
)
_OPEN_FENCE = re.compile(r"```\s*(.*?)$", re.S)
_CODE_WORDS = ("def ", "import ", "from ", "=", "print(", "return", "if ", "for ", "while ")
MAX_LIST_CHARS = 20_000
"""A longer list is not read: literal_eval of a huge nested text costs memory and recursion."""


def one_move(response: str) -> list[str] | None:
    """A ``one_move`` answer (one token of :data:`MOVES`) as a one-move list; None for anything else."""
    move = response.strip()
    return [move] if move in MOVES else None


def _literal_list(text: str) -> list | None:
    if len(text) > MAX_LIST_CHARS:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return None
    return value if isinstance(value, list) else None


def final_action(text: str, moves: bool) -> list | None:
    """The list after the last ``#### `` line of the plan agent's response, or None when there is none.

    ``moves``: a Plan-Path or Sokoban list may also be written without quotes (``#### [U, R]``)."""
    found = _FINAL.findall(text)
    if not found:
        return None
    body = found[-1].strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None
    value = _literal_list(body)
    if value is not None or not moves:
        return value
    inner = [item.strip().strip("\"'") for item in body[1:-1].split(",")]
    inner = [item for item in inner if item]
    return inner if all(item in MOVES for item in inner) else None


def program(text: str) -> str:
    """The tool agent's program: the last fenced block (a ```python one first), an unclosed fence's code, or else
    the whole response."""
    for fence in _FENCES:
        found = fence.findall(text)
        if found:
            return found[-1].strip()
    found = _OPEN_FENCE.findall(text)
    if found and any(word in found[-1] for word in _CODE_WORDS):
        return found[-1].strip()
    return text.strip()


def _bracketed(text: str, start: int) -> str | None:
    """The text from ``text[start]`` (a ``[``) to its matching ``]``."""
    depth = 0
    for k in range(start, len(text)):
        depth += {"[": 1, "]": -1}.get(text[k], 0)
        if depth == 0:
            return text[start : k + 1]
    return None


def _fits(value: list, game: str) -> bool:
    if game == "plan_path":
        return all(isinstance(a, str) and a in MOVES for a in value)
    if game == "sudoku":
        return bool(value) and isinstance(value[0], list) and all(isinstance(r, list) and r for r in value)
    return True


def printed_action(output: str | None, game: str) -> list | None:
    """The action list the tool agent's program printed: after the last ``**Actions List**:``, else after the last
    ``Actions:``, else the first whole line that is a list fitting the game; None when there is none or the program
    failed (``output`` None)."""
    if output is None:
        return None
    for label in ("**Actions List**:", "Actions:"):
        at = output.rfind(label)
        if at < 0:
            continue
        start = output.find("[", at + len(label))
        if start < 0 or output[at + len(label) : start].strip():
            continue
        body = _bracketed(output, start)
        value = None if body is None else _literal_list(body)
        if value is not None and _fits(value, game):
            return value
    for line in output.strip().splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            value = _literal_list(line)
            if value is not None and _fits(value, game):
                return value
    return None


def show(value: Any, limit: int) -> str:
    """An action as the feedback shows it, cut to ``limit`` characters."""
    text = "none" if value is None else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
