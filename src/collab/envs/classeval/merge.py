"""The team's class: each agent's methods cut from its response and put into the skeleton, as the reference does.

OpenMLRL/LLM_Collab_Code_Completion (read at 1b754a3), ``utils/parse_completion.py`` (M1, M2) and
``utils/merge.py`` (M3-M5), line-based rules restated here, quirks included:

- M1: of a response holding a code fence, only the text between the first fence line and the next fence (or the
  end); a fence with nothing after it on its line leaves nothing;
- M2: a line ``def NAME(`` (any indentation) of a method looked for opens its snippet, which runs to the next line
  ``def X`` at any indentation: a nested function cuts its method short, and a decorator line before the next
  method ends the snippet (which then no longer parses); the snippet is stripped; a second one of the same name
  replaces the first;
- M3: each method's snippet comes from the agent it is assigned to, kept if it parses on its own (``ast.parse``);
  what another agent writes of it is ignored here but counted by the overlap (the reward's lv3);
- M4: the class's lines run from ``class NAME:`` to the first later non-blank line indented less than the line
  after the header (a decorator excepted); a method's lines from its ``def`` (with the decorators right above it)
  to the next ``def`` at the same indentation, looked for from the line after the first of them: the next method's
  decorators go with a method, and a method that still has its decorator is only its decorator lines (its stub
  stays after the snippet and, defined later, replaces it);
- M5: the snippet replaces those lines, every non-blank line indented by the ``def``'s indentation (the rest of the
  snippet's indentation is kept); a method not found inside the class goes at its end, indented 4 more than the
  class body; with no snippet at all the skeleton is left exactly as written; otherwise line ends become ``\\n``,
  tabs 4 spaces, trailing spaces go, and the text ends with a newline.

The reference then runs autopep8 (``aggressive: 1``) over the merged class; collab does not (autopep8 is no
dependency of collab): code that only autopep8's fixes would make compile fails here (docs/fidelity.md).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

__all__ = ["merge", "overlaps", "snippets", "valid_snippets"]

_DEF = re.compile(r"^\s*def\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(.*")
_ANY_DEF = re.compile(r"^\s*def\s+[A-Za-z_]")


def _unfenced(text: str) -> str:
    """M1."""
    s = (text or "").replace("\r\n", "\n").strip()
    start = s.find("```")
    if start < 0:
        return s
    line_end = s.find("\n", start + 3)
    if line_end < 0:
        return ""
    end = s.find("```", line_end + 1)
    return (s[line_end + 1 : end] if end >= 0 else s[line_end + 1 :]).strip()


def snippets(text: str, wanted: Sequence[str]) -> dict[str, str]:
    """M2: the snippet of each method of ``wanted`` that ``text`` defines."""
    lines, out, i = _unfenced(text).splitlines(), {}, 0
    while i < len(lines):
        found = _DEF.match(lines[i])
        if not found or found.group(1) not in wanted:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not _ANY_DEF.match(lines[j]):
            j += 1
        out[found.group(1)] = "\n".join(line.rstrip() for line in lines[i:j]).strip()
        i = j
    return out


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except Exception:  # as the reference: whatever ast.parse raises (deep nesting included)
        return False
    return True


def valid_snippets(responses: Sequence[str], assigned: Sequence[Sequence[str]]) -> dict[str, str]:
    """M3: method -> the snippet its agent wrote, where that parses."""
    chosen = {}
    for text, mine in zip(responses, assigned):
        chosen.update({m: code for m, code in snippets(text, mine).items() if _parses(code)})
    return chosen


def overlaps(responses: Sequence[str], names: Sequence[str]) -> int:
    """The methods that two agents or more write (M2 over every method of the class), assigned or not."""
    seen = [set(snippets(text, names)) for text in responses]
    return sum(1 for m in names if sum(m in s for s in seen) > 1)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _class_lines(lines: list[str], name: str) -> tuple[int, int, int]:
    """M4: (header index, end index, body indentation) of class ``name``; (-1, -1, 0) if absent."""
    header = re.compile(rf"^\s*class\s+{re.escape(name)}\s*:\s*")
    start = next((i for i, line in enumerate(lines) if header.match(line)), -1)
    if start < 0:
        return -1, -1, 0
    body = next((_indent(s) for s in lines[start + 1 :] if s.strip()), 4)
    below = (k for k in range(start + 1, len(lines)) if lines[k].strip() and _indent(lines[k]) < body)
    end = next((k for k in below if not lines[k].lstrip().startswith("@")), len(lines))  # a decorator goes on
    return start, end, body


def _method_lines(lines: list[str], start: int, end: int, name: str) -> tuple[int, int, int]:
    """M4: (first index, end index, ``def`` indentation) of method ``name`` in the class's lines; (-1, -1, 0)."""
    head = re.compile(r"^\s*def\s+" + re.escape(name) + r"\s*\(")
    at = next((i for i in range(start + 1, end) if head.match(lines[i])), -1)
    if at < 0:
        return -1, -1, 0
    indent, first = _indent(lines[at]), at
    while first - 1 > start and lines[first - 1].lstrip().startswith("@"):
        first -= 1
    # from the line after the first decorator: a decorated method's own def ends its lines (M4)
    stop = next((j for j in range(first + 1, end) if _ANY_DEF.match(lines[j]) and _indent(lines[j]) == indent), end)
    return first, stop, indent


def _indented(code: str, spaces: int) -> list[str]:
    return [" " * spaces + line if line.strip() else line for line in code.strip().splitlines()]


def merge(skeleton: str, name: str, code: dict[str, str]) -> str:
    """M4-M5: the skeleton with each method of ``code`` replaced by its snippet."""
    if not code:
        return skeleton
    lines = skeleton.splitlines()
    start, end, _ = _class_lines(lines, name)
    if start < 0:
        return skeleton
    at = {m: _method_lines(lines, start, end, m)[0] for m in code}
    order = sorted(code, key=lambda m: (at[m] if at[m] >= 0 else len(lines), m))
    for m in order:
        start, end, body = _class_lines(lines, name)  # the lines moved with the last replacement
        first, stop, indent = _method_lines(lines, start, end, m)
        if first < 0:
            lines[end:end] = [*_indented(code[m], body + 4), ""]
        else:
            lines[first:stop] = _indented(code[m], indent)
    merged = "\n".join(lines).replace("\r\n", "\n").replace("\r", "\n").expandtabs(4)
    return "\n".join(line.rstrip() for line in merged.splitlines()) + "\n"
