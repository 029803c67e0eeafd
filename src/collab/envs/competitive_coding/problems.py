"""Stdin/stdout programming problems: loading, statements and output checkers (MARFT, 5.1, E.2).

MARFT's coding environment draws problems from CodeForces (Penedo et al. 2025, the ``open-r1/codeforces``
dataset) and rewards "the test case pass rate". Every loader here returns the same plain-dict record::

    {"id", "source", "statement", "tests": [{"input", "output"}, ...], "time_limit", "memory_limit",
     "checker", "title", "rating", "solution"}

``statement`` is what the agents read, in MARFT E.2's layout: the time and memory limits, then ``# Problem``,
``## Input Format``, ``## Output Format``, ``## Examples`` (```` ```input ```` / ```` ```output ```` blocks)
and ``## Note``.

The records it accepts (CodeForces style or local), the ones it skips and the checkers (``tokens``, ``tokens_ci``,
``float``): docs/environments.md, *competitive_coding*.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from collab.envs.published import read_published, split_source
from collab.envs.records import load_records
from collab.errors import UserError, unknown

__all__ = [
    "CHECKERS",
    "CF_FIELDS",
    "Skipped",
    "check_output",
    "guess_checker",
    "load_problems",
    "normalize",
    "render_statement",
]

CF_FIELDS = ("description", "input_format", "output_format")
"""Fields a CodeForces-style record must have (the statement)."""
LOCAL_FIELDS = ("statement", "tests")
DEFAULT_TIME_LIMIT = 2.0
DEFAULT_MEMORY_LIMIT = 256.0
FLOAT_TOLERANCE = 1e-6
NL = "\n"


class Skipped(Counter):
    """Records left out of a load, by reason (``no tests``, ``interactive``, ``special judge``)."""

    def __str__(self) -> str:
        return ", ".join(f"{n} {reason}" for reason, n in sorted(self.items())) or "none"


# -- checkers ------------------------------------------------------------------------------------------
def _tokens(got: str, want: str) -> bool:
    return got.split() == want.split()


def _tokens_ci(got: str, want: str) -> bool:
    return got.lower().split() == want.lower().split()


def _number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _floats(got: str, want: str) -> bool:
    g, w = got.split(), want.split()
    if len(g) != len(w):
        return False
    for a, b in zip(g, w):
        expected = _number(b)
        if expected is None:
            if a != b:
                return False
            continue
        value = _number(a)
        if value is None or abs(value - expected) > FLOAT_TOLERANCE * max(1.0, abs(expected)):
            return False
    return True


CHECKERS: dict[str, Callable[[str, str], bool]] = {"tokens": _tokens, "tokens_ci": _tokens_ci, "float": _floats}


def check_output(got: str, want: str, checker: str = "tokens") -> bool:
    """Whether stdout ``got`` is an accepted answer for expected output ``want`` (module docstring)."""
    return CHECKERS[checker](got, want)


_ANY_CASE = re.compile(r"\bin any (?:case|register)\b", re.I)
_FLOAT_ERROR = re.compile(r"\babsolute or relative error\b", re.I)


def guess_checker(text: str) -> str:
    """The checker a CodeForces statement implies (module docstring)."""
    if _ANY_CASE.search(text):
        return "tokens_ci"
    if _FLOAT_ERROR.search(text):
        return "float"
    return "tokens"


# -- statements ----------------------------------------------------------------------------------------
def _limit(value: Any, default: float) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return default
    return value if value > 0 else default


def render_statement(
    description: str,
    input_format: str | None,
    output_format: str | None,
    examples: list[Mapping[str, str]],
    note: str | None = None,
    time_limit: float = DEFAULT_TIME_LIMIT,
    memory_limit: float = DEFAULT_MEMORY_LIMIT,
) -> str:
    """A problem statement in MARFT E.2's layout (module docstring)."""
    parts = [
        f"Execution time limit: {float(time_limit)} seconds\nMemory limit: {float(memory_limit)} MB",
        f"# Problem\n\n{description.strip()}",
    ]
    for title, text in (("Input Format", input_format), ("Output Format", output_format)):
        if text and str(text).strip():
            parts.append(f"## {title}\n\n{str(text).strip()}")
    if examples:
        blocks = [
            f"```input\n{str(e['input']).strip(NL)}\n```\n\n```output\n{str(e['output']).strip(NL)}\n```"
            for e in examples
        ]
        parts.append("## Examples\n\n" + "\n\n".join(blocks))
    if note and str(note).strip():
        parts.append(f"## Note\n\n{str(note).strip()}")
    return "\n\n".join(parts)


# -- records -------------------------------------------------------------------------------------------
def _pairs(value: Any, where: str) -> list[dict[str, str]]:
    """A list of ``{input, output}`` tests (``None``: no tests)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, Mapping) and "input" in t and "output" in t for t in value):
        raise UserError(f'{where}: tests must be a list of {{"input": ..., "output": ...}} objects, got {value!r:.80}')
    return [{"input": str(t["input"]), "output": str(t["output"])} for t in value]


def _unique_inputs(tests: list[dict[str, str]]) -> list[dict[str, str]]:
    """``tests`` in order, without the later tests whose input an earlier one has."""
    first: dict[str, dict[str, str]] = {}
    for t in tests:
        first.setdefault(t["input"], t)
    return list(first.values())


def _record_id(record: Mapping[str, Any], i: int) -> str:
    if record.get("id") not in (None, ""):
        return str(record["id"])
    if record.get("contest_id") not in (None, "") and record.get("index") not in (None, ""):
        return f"{record['contest_id']}/{record['index']}"
    return str(i)


def normalize(record: Any, i: int, source: str) -> dict[str, Any] | str:
    """The problem of record ``i`` of file ``source``, or the reason it is skipped (a string).

    A record that is neither format, or a CodeForces record missing a statement field, is a UserError.
    """
    if not isinstance(record, Mapping):
        raise UserError(f"{source}: record {i} is a {type(record).__name__}, expected an object")
    pid = _record_id(record, i)
    where = f"{source}: record {i} (id {pid})"
    local = "statement" in record
    missing = [f for f in (LOCAL_FIELDS if local else CF_FIELDS) if f not in record]
    if missing or not record.get("statement" if local else "description"):
        have = ", ".join(sorted(record)) or "none"
        raise UserError(
            f"{where} has no {(missing or ['statement' if local else 'description'])[0]!r} "
            f"(it has: {have}); a problem needs {', '.join(CF_FIELDS)} plus examples/official_tests "
            f"(CodeForces style) or {', '.join(LOCAL_FIELDS)} (local)"
        )
    if record.get("interaction_format"):
        return "interactive"
    if record.get("generated_checker"):
        return "special judge"
    time_limit = _limit(record.get("time_limit"), DEFAULT_TIME_LIMIT)
    memory_limit = _limit(record.get("memory_limit"), DEFAULT_MEMORY_LIMIT)
    if local:
        statement, tests = str(record["statement"]).strip(), _pairs(record["tests"], where)
        default_checker, default_source = "tokens", "local"
    else:
        examples = _pairs(record.get("examples"), where)
        tests = _unique_inputs(examples + _pairs(record.get("official_tests"), where))
        statement = render_statement(
            record["description"],
            record["input_format"],
            record["output_format"],
            examples,
            record.get("note"),
            time_limit,
            memory_limit,
        )
        default_checker, default_source = (
            guess_checker(f"{record['output_format'] or ''}\n{record.get('note') or ''}\n{record['description']}"),
            "codeforces",
        )
    if not tests:
        return "no tests"
    checker = record.get("checker") or default_checker
    if checker not in CHECKERS:
        raise unknown(f"checker of {where}:", checker, CHECKERS)
    return {
        "id": pid,
        "source": str(record.get("source") or default_source),
        "statement": statement,
        "tests": tests,
        "time_limit": time_limit,
        "memory_limit": memory_limit,
        "checker": checker,
        "title": record.get("title"),
        "rating": record.get("rating"),
        "solution": record.get("solution"),
    }


def load_problems(path: str | Path) -> tuple[list[dict[str, Any]], Skipped]:
    """The problems of a json/jsonl file (either format, module docstring), or of ``codeforces:PATH`` (the
    hub's ``open-r1/codeforces`` parquet files, ``*`` patterns of shards allowed), and the count of skipped
    records."""
    name, source = split_source(str(path), ("codeforces",))
    problems, skipped = [], Skipped()
    for i, record in enumerate(read_published(name, source) if name else load_records(path)):
        problem = normalize(record, i, str(path))
        if isinstance(problem, str):
            skipped[problem] += 1
        else:
            problems.append(problem)
    if not problems:
        raise UserError(
            f"{path}: no usable problems (skipped: {skipped}); each needs at least one "
            f'{{"input", "output"}} test in tests, examples or official_tests'
        )
    return problems, skipped
