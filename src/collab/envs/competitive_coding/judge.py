"""Judging stdin/stdout programs: find the program in a response, run it on every test, compare outputs.

MARFT (Section 5.1): "the reward in the coding environment is the test case pass rate". A test passes
when the program exits normally (code 0) within the time limit, without flooding its output, and its
stdout is accepted by the problem's checker (:mod:`~collab.envs.competitive_coding.problems`). Every
test of every answer of a batch runs through one :meth:`collab.sandbox.Pool.map` call, each in its own
sandboxed process, so they run in parallel; an identical (program, input) pair runs once.

How :func:`extract_program` finds the program of a response (after ``Final Answer:`` or ``Answer:``, the last
``python`` block, else unfenced code that compiles): docs/environments.md, *competitive_coding*.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from collab.envs.competitive_coding.problems import check_output
from collab.sandbox import Limits, Pool, Result

__all__ = ["Judgement", "compiles", "extract_program", "judge"]

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.S)
_OPEN_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*)\Z", re.S | re.I)  # a block never closed
_MAX_STARTS, _MAX_LINES = 8, 300  # bound the compile attempts of unfenced code
_PYTHON_TAGS = {"python", "py", "python3"}
_FINAL = re.compile(r"final\s+answer\s*:(?:\*\*)?", re.I)
_ANSWER = re.compile(r"^[ \t#>*_]*answer\s*:(?:\*\*|__)?", re.I | re.M)
_TARGET = r"[A-Za-z_][\w.\[\]]*"  # an assignment target: n, a[i], self.x
_CODE_LINE = re.compile(
    rf"^(?:(?:def|class|import|from|for|while|if|with|try)\b|print\s*\(|@|"
    rf"{_TARGET}(?:\s*,\s*{_TARGET})*\s*[-+*/%|&^]?=[^=])",
    re.M,
)


def compiles(code: str) -> bool:
    """``code`` compiles as a Python 3 module (syntax only; nothing runs)."""
    try:
        compile(code, "prog.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _fenced(text: str) -> str | None:
    """The last python-tagged fenced block of ``text``, else its last untagged one, else an unclosed one."""
    blocks = list(_FENCE.finditer(text))
    for wanted in (lambda tag: tag.lower() in _PYTHON_TAGS, lambda tag: tag == ""):
        chosen = [m.group(2) for m in blocks if wanted(m.group(1))]
        if chosen:
            return chosen[-1]
    unclosed = _OPEN_FENCE.search(text, blocks[-1].end() if blocks else 0)
    return unclosed.group(1) if unclosed else None


def _unfenced(text: str) -> str | None:
    """Code written without fences: from the first code-like line that starts a compiling run of lines,
    the longest such run; if none compiles, everything from the first code-like line."""
    starts = [m.start() for m in _CODE_LINE.finditer(text)]
    for start in starts[:_MAX_STARTS]:
        lines = text[start:].rstrip().split("\n")[:_MAX_LINES]
        for end in range(len(lines), 0, -1):
            candidate = "\n".join(lines[:end])
            if compiles(candidate):
                return candidate
    return text[starts[0] :].rstrip() if starts else None


def extract_program(response: str) -> str:
    """The program of an agent's response (module docstring); ``""`` when there is none."""
    parts = []
    final = list(_FINAL.finditer(response))
    answer = final or list(_ANSWER.finditer(response))
    if answer:
        parts.append(response[answer[-1].end() :])
    parts.append(response)
    for part in parts:
        code = _fenced(part)
        if code is None:
            code = _unfenced(part)
        if code is not None and code.strip():
            return code.strip("\n") + "\n"
    return ""


@dataclass(frozen=True)
class Judgement:
    """The outcome of one answer on one problem."""

    passed: int
    total: int
    has_code: bool
    compiled: bool
    timeouts: int
    """Tests that ran past their time limit."""

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def info(self) -> dict[str, float]:
        """The diagnostics logged as ``env/<name>`` (and read back by the judge line's verdict)."""
        return {
            "pass_rate": self.pass_rate,
            "compiled": float(self.compiled),
            "has_code": float(self.has_code),
            "timeouts": self.timeouts / self.total if self.total else 0.0,
            "tests_passed": float(self.passed),
            "tests_total": float(self.total),
        }


def _passed(result: Result, seconds: float, wall: float, want: str, checker: str) -> tuple[bool, bool]:
    """(passed, timed out) of one run with its own time limit ``seconds`` under the pool's ``wall`` clock.

    A problem whose limit is below the pool's is held to it after the fact, by the run's measured time
    (which includes the sandbox's start and clean-up, a few milliseconds).
    """
    timed_out = result.timed_out or result.killed_by == "cpu" or (seconds < wall and result.seconds > seconds)
    ok = result.ok and not timed_out and not result.truncated and check_output(result.stdout, want, checker)
    return ok, timed_out


def judge(
    problems: Sequence[Mapping],
    programs: Sequence[str],
    timeouts: Sequence[float],
    workers: int | None = None,
    memory_mb: int = 1024,
) -> list[Judgement]:
    """Run every program on every test of its problem (``timeouts``: seconds per test, per problem).

    One pool map runs them all, with the batch's longest time limit as the sandbox's wall clock; a run
    longer than its own problem's limit counts as a timeout. Programs that are empty or do not compile
    are not run. The output cap fits the largest expected output.
    """
    runnable = {code: bool(code.strip()) and compiles(code) for code in programs}
    jobs = [
        (code, t["input"])
        for problem, code in zip(problems, programs, strict=True)
        if runnable[code]
        for t in problem["tests"]
    ]
    unique = list(dict.fromkeys(jobs))
    results: dict[tuple[str, str], Result] = {}
    wall = max(timeouts, default=0.0)
    if unique:
        longest = max(len(t["output"].encode()) for p in problems for t in p["tests"])
        limits = Limits(timeout_s=wall, memory_mb=memory_mb, max_output_bytes=max(64_000, 2 * longest + 4096))
        results = dict(zip(unique, Pool(workers, limits).map([c for c, _ in unique], [s for _, s in unique])))
    out = []
    for problem, code, seconds in zip(problems, programs, timeouts, strict=True):
        passed = timed = 0
        if runnable[code]:
            for t in problem["tests"]:
                ok, late = _passed(
                    results[(code, t["input"])], seconds, wall, t["output"], problem.get("checker", "tokens")
                )
                passed += ok
                timed += late
        out.append(Judgement(passed, len(problem["tests"]), bool(code.strip()), runnable[code], timed))
    return out
