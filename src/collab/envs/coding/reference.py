"""``reward_mode: reference``: the CoopHumanEval reward exactly as the reference implementation computes it.

The reference is OpenMLRL/LLM_Collab_Code_Generation, ``rewards/code_rewards.py``
(``execution_reward_aux``, the version with maximum 4.0 that puts ``math`` in the tests' namespace)
and ``rewards/code_utils.py``. Everything here restates its rules, text and regex quirks included, so
that rewards can be compared with published curves; collab's own reading of CoLLM F.2 is
:mod:`~collab.envs.coding.static` + :mod:`~collab.envs.coding.reward` (``reward_mode: paper``), and
docs/fidelity.md lists where the two differ. The tests still run in collab's sandbox
(R7-R9: :mod:`~collab.envs.coding.reference_sandbox`).

Its rules, in the order the reference applies them (R1-R14, cited by the functions below), and what
cannot be reproduced: docs/fidelity.md, *The reference's coding reward*.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from collab.envs.coding.reference_sandbox import MAX_TIMEOUTS, TEST_TIMEOUT, RefReport, run_many
from collab.envs.coding.reward import RewardWeights
from collab.envs.coding.static import AUX, CodeFacts

__all__ = [
    "RefFacts",
    "RefReport",
    "analyze",
    "clean",
    "extract_function",
    "has_definition",
    "is_wrapper",
    "prompt_imports",
    "reference_reward",
    "run_many",
    "test_cases",
    "test_code",
    "uses_aux",
    "wastes_aux",
    "MAX_TIMEOUTS",
    "TEST_TIMEOUT",
]


_IMPORT_LINES = (re.compile(r"from\s+[\w.]+\s+import\s+.*"), re.compile(r"import\s+[\w.,\s]+"))
_ANY_DEF = re.compile(r"^(\s*)def\s+\w+\s*\(")
_SENTENCE = re.compile(r"[A-Z][a-z].*[.!?:]")
_CODE_MARKS = ("def ", "return ", "if ", "for ", "while ", "=", "(", ")", "[", "]")
_QUOTES = ('"""', "'''")


# ---------------------------------------------------------------------------------------------------
# Static rules (R1-R6, R12-R14)


def prompt_imports(prompt: str) -> str:
    """R1: the prompt's import lines, stripped, first occurrences only, one per line."""
    found: list[str] = []
    for line in (prompt or "").split("\n"):
        line = line.strip()
        if any(p.fullmatch(line) for p in _IMPORT_LINES) and line not in found:
            found.append(line)
    return "\n".join(found)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _in_block(line: str, indent: int) -> bool:
    return not line.strip() or line.startswith(" " * (indent + 1)) or line.startswith("\t")


def _sentence(line: str) -> bool:
    text = line.strip()
    return (
        bool(text)
        and not text.startswith(("#",) + _QUOTES)
        and not any(mark in line for mark in _CODE_MARKS)
        and _SENTENCE.fullmatch(text) is not None
    )


def clean(text: str) -> str:
    """R2: the function blocks of a response, sentence-like lines removed; ``""`` if no ``def`` is left."""
    if not text or not isinstance(text, str):
        return ""
    text = re.sub(r"```\s*\n?", "", re.sub(r"```python\s*\n?", "", text))
    lines = text.split("\n")
    blocks: list[list[str]] = []
    block: list[str] | None = None
    indent, i = 0, 0
    while i < len(lines):
        line, stripped = lines[i], lines[i].strip()
        if _ANY_DEF.match(line):
            if block:
                blocks.append(block)
            block, indent = [line], _indent(line)
        elif block is not None:
            if _in_block(line, indent):
                block.append(line)
            elif stripped.startswith(_QUOTES):
                block.append(line)
                quote = stripped[:3]
                if not (stripped.endswith(quote) and len(stripped) > 3):
                    i += 1
                    while i < len(lines):
                        block.append(lines[i])
                        if quote in lines[i]:
                            break
                        i += 1
            else:
                blocks.append(block)
                block = None
        i += 1
    if block:
        blocks.append(block)
    joined = "\n\n".join("\n".join(b) for b in blocks)
    result = "\n".join(line for line in joined.split("\n") if not _sentence(line)).strip()
    return result if re.search(r"def\s+\w+\s*\(", result) else ""


def extract_function(text: str, name: str) -> str:
    """R3: function ``name`` of the cleaned ``text`` (its first block; a repeat right after replaces it)."""
    if not text or not name:
        return ""
    header = re.compile(rf"^(\s*)def\s+{re.escape(name)}\s*\(")
    lines: list[str] = []
    inside, indent = False, 0
    for line in clean(text).split("\n"):
        if header.match(line):
            lines, inside, indent = [line], True, _indent(line)
        elif inside:
            if not _in_block(line, indent):
                break
            lines.append(line)
    return "\n".join(lines).strip()


def has_definition(text: str, name: str) -> bool:
    """R4: ``name`` is extracted and its text holds ``return`` followed by whitespace."""
    code = extract_function(text, name)
    return bool(code) and re.search(r"return\s+", code) is not None


def combine(aux_func: str, main_func: str, imports: str) -> str:
    """R5: imports, aux and main (each cleaned again), the non-empty parts joined by a blank line."""
    return "\n\n".join(p for p in (imports, clean(aux_func), clean(main_func)) if p)


def test_cases(test: str, entry_point: str) -> list[str]:
    """R6: the one-line asserts of ``check(candidate)`` that mention ``candidate``, renamed to the entry point."""
    if not test or not entry_point:
        return []
    body = re.search(r"def check\(candidate\):(.*?)(?=\n\ndef|\Z)", test, re.S)
    if body is None:
        return []
    cases: list[str] = []
    for line in body.group(1).strip().split("\n"):
        line = line.strip()
        if re.match(r"assert\s", line) and "candidate" in line and line not in cases:
            cases.append(line)
    return [c.replace("candidate", entry_point) for c in cases]


def uses_aux(main_func: str) -> bool:
    """R12: ``aux(`` appears anywhere in main's text (a word boundary before ``aux``)."""
    return bool(main_func) and re.search(rf"\b{AUX}\s*\(", main_func) is not None


def _body_lines(main_func: str) -> list[str]:
    """R13's lines of main: stripped, without blanks, comments, ``def`` lines and docstring lines."""
    body: list[str] = []
    in_doc = False
    for line in main_func.split("\n"):
        text = line.strip()
        if not text:
            continue
        if text.startswith(_QUOTES):  # checked before the end of an open docstring (R13)
            if not (text.endswith(text[:3]) and len(text) > 3):
                in_doc = True  # a one-line docstring leaves the state as it is
            continue
        if in_doc:
            if any(q in text for q in _QUOTES):
                in_doc = False
            continue
        if text.startswith("#") or text.startswith("def "):
            continue
        body.append(text)
    return body


def is_wrapper(main_func: str) -> bool:
    """R13: main's code, as the reference reads it, only returns aux's value."""
    if not main_func:
        return False
    body = _body_lines(main_func)
    if not body:
        return True
    if len(body) == 1:
        return body[0].startswith("return ") and AUX in body[0]
    if len(body) == 2:
        bound = re.search(rf"(\w+)\s*=\s*{AUX}\s*\(", body[0])
        return bound is not None and body[1] == f"return {bound.group(1)}"
    return False


def wastes_aux(main_func: str) -> bool:
    """R14: a stripped line of main is ``aux``, one whitespace, and one character in parentheses."""
    if not main_func or AUX not in main_func:
        return False
    return any(
        re.fullmatch(rf"{AUX}\s\([^)]\)", line.strip())
        for line in main_func.split("\n")
        if line.strip() and not line.strip().startswith("#")
    )


# ---------------------------------------------------------------------------------------------------
# One (aux, main) pair


@dataclass(frozen=True)
class RefFacts(CodeFacts):
    """:class:`CodeFacts` as the reference sees a pair (``aux_code``/``main_code``: the extracted
    functions; ``program``: the combined code; ``calls_aux``/``thin_wrapper``/``discards_aux``: R12-R14)."""

    aux_extracted: bool = False
    """R11: the extracted aux is non-empty (the bonus gate), with or without a return."""
    cases: tuple[str, ...] = ()
    """R6: the tests, as run."""


def test_code(task: Mapping[str, Any]) -> str:
    """The task's HumanEval-style test file (``test``); else one built from its test blocks."""
    if task.get("test"):
        return task["test"]
    lines = [f"    {line}" for block in task.get("tests", ()) for line in block.split("\n")]
    return "def check(candidate):\n" + "\n".join(lines) + "\n"


def analyze(aux_response: str, main_response: str, task: Mapping[str, Any]) -> RefFacts:
    """R1-R6 and R12-R14 for one pair."""
    entry_point = task["entry_point"]
    aux_func = extract_function(aux_response, AUX)
    main_func = extract_function(main_response, entry_point)
    program = combine(aux_func, main_func, prompt_imports(task.get("prompt", "")))
    try:
        ast.parse(program)
        syntax_error = None
    except SyntaxError as e:
        syntax_error = f"line {e.lineno}: {e.msg}"
    except ValueError as e:  # null bytes: the reference would raise here
        syntax_error = str(e)
    return RefFacts(
        aux_code=aux_func,
        main_code=main_func,
        program=program,
        aux_defined=has_definition(aux_response, AUX),
        main_defined=has_definition(main_response, entry_point),
        syntax_ok=syntax_error is None,
        syntax_error=syntax_error,
        calls_aux=uses_aux(main_func),
        discards_aux=wastes_aux(main_func),
        thin_wrapper=is_wrapper(main_func),
        aux_extracted=bool(aux_func),
        cases=tuple(test_cases(test_code(task), entry_point)),
    )


def reference_reward(
    facts: RefFacts, report: RefReport | None, weights: RewardWeights | None = None
) -> tuple[float, str, dict[str, float]]:
    """Total, stage (as :func:`~collab.envs.coding.reward.coding_reward`) and components, in the reference's order."""
    w = weights or RewardWeights()
    parts = {"structure": 0.0, "syntax": 0.0, "tests": 0.0, "cooperation": 0.0}
    reward = 0.0
    if facts.aux_defined:
        reward += w.aux_defined
        parts["structure"] += w.aux_defined
    if not facts.main_defined:
        return reward, "structure", parts
    reward += w.main_defined
    parts["structure"] += w.main_defined
    if not facts.syntax_ok:
        return reward, "syntax", parts
    reward += w.syntax
    parts["syntax"] = w.syntax
    if not facts.cases or report is None:
        return reward, "tests", parts
    passed = report.n_passed if report.loaded else 0
    if report.loaded:
        parts["tests"] = passed / len(facts.cases) * w.tests
        reward += parts["tests"]
    if passed > 0 and facts.aux_extracted and facts.calls_aux:
        bonus = w.calls_aux
        reward += w.calls_aux
        if not facts.thin_wrapper:
            reward += w.not_wrapper
            bonus += w.not_wrapper
        if facts.discards_aux:
            reward -= w.discard_penalty
            bonus -= w.discard_penalty
        parts["cooperation"] = bonus
    return reward, ("complete" if passed > 0 else "tests"), parts
