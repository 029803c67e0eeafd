"""Per-assert test programs of coding tasks and running them in the sandbox (CoLLM, E.2, F.2).

A failing test prints the failing statement and ``ExcType: message`` after a ``__COLLAB_FAIL__`` marker line, asserts
rewritten with ``ast`` to show ``expected X, got Y`` (the E.2 diagnostics: docs/environments.md, *Coding diagnostics*).

A test passes when its program exits 0 *and* printed the pass marker last, so agent code that calls
``exit(0)`` before the test runs does not pass. The agents' code runs as a module named ``solution``
(not ``__main__``), so example usage under ``if __name__ == "__main__":`` does not run, as with
HumanEval's harness, which executes completions in a fresh namespace. None of this defends against
code written to fool the checker (an object whose ``__eq__`` is always true passes ``==`` asserts).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from collab.envs.coding.tasks import display, parse_tests
from collab.sandbox import Limits, Pool, Result

__all__ = ["TestReport", "diagnose", "run_many", "run_task_tests", "test_program"]

FAIL_MARK, END_MARK, PASS_MARK = "__COLLAB_FAIL__", "__COLLAB_END__", "__COLLAB_PASS__"


# Runs first in every test program. _collab_at[0] is the index in _collab_src of the statement of the
# test being executed (set before each one); _collab_fail prints the diagnostic block and exits.
_PRELUDE = f"""\
import sys as _collab_sys, os as _collab_os
__name__ = "solution"
_collab_sys.modules[__name__] = _collab_sys.modules["__main__"]
_collab_at = [None]


def _collab_repr(value):
    try:
        text = repr(value)
    except BaseException:
        text = object.__repr__(value)
    return text if len(text) <= 300 else text[:240] + " ... " + text[-50:]


def _collab_why(kind, expected, got, *msg):
    if kind in ("==", "is"):
        text = "expected %s, got %s" % (_collab_repr(expected), _collab_repr(got))
    elif kind in ("truthy", "falsy"):
        text = "expected a %s value, got %s" % (kind, _collab_repr(got))
    else:
        text = "expected a value %s %s, got %s" % (kind, _collab_repr(expected), _collab_repr(got))
    if msg:
        try:
            text += " (%s)" % (msg[0],)
        except BaseException:
            pass
    return text


def _collab_fail(exc, line):
    try:
        text = str(exc)
    except BaseException:
        text = ""
    text = text if len(text) <= 2000 else text[:2000] + " ..."
    block = "\\n{FAIL_MARK}\\n%s\\n%s%s\\n{END_MARK}\\n" % (line, type(exc).__name__, ": " + text if text else "")
    try:
        _collab_sys.stdout.flush()
    except BaseException:
        pass
    _collab_sys.__stderr__.write(block)
    _collab_sys.__stderr__.flush()
    _collab_os._exit(1)


def _collab_hook(kind, exc, tb):  # an exception outside the test: in the agents' module-level code
    import traceback
    frames = [f for f in traceback.extract_tb(tb) if f.filename == "prog.py" and f.line]
    _collab_fail(exc, frames[-1].line if frames else "(module level)")


def _collab_run(check, candidate):
    _collab_at[0] = -1
    try:
        check(candidate())
    except BaseException as e:
        _collab_fail(e, _collab_src[_collab_at[0]])
    try:
        _collab_sys.stdout.flush()
    except BaseException:
        pass
    _collab_sys.__stdout__.write("\\n{PASS_MARK}\\n")
    _collab_sys.__stdout__.flush()
    _collab_os._exit(0)


_collab_sys.excepthook = _collab_hook
"""

_SYMBOLS = {
    ast.Eq: "==",
    ast.Is: "is",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.IsNot: "is not",
}
_FUTURE = re.compile(r"^from\s+__future__\s+import\b.*$", re.M)


def test_program(task: dict[str, Any], code: str, i: int) -> str:
    """The program for test ``i``: prelude, imports, helpers, ``code``, setup, then test ``i`` in a
    ``check(candidate)`` function called with the entry point, its asserts rewritten (module docstring)."""
    block = task["tests"][i]
    stmts = parse_tests(block).body
    sources: list[str] = []
    check = ast.parse("def _collab_check(candidate):\n    pass\n").body[0]
    check.body = _instrument(stmts, block, sources)
    sources.append(f"candidate = {task['entry_point']}")
    parts = (task.get("imports", ""), task.get("helpers", ""), code, task.get("setup", ""))
    module = "\n\n".join(p.strip("\n") for p in parts if p.strip())
    future = _FUTURE.findall(module)  # ``from __future__`` must open the file
    test = (
        f"_collab_src = {sources!r}\n\n\n{ast.unparse(ast.fix_missing_locations(check))}\n\n\n"
        f"_collab_run(_collab_check, lambda: {task['entry_point']})\n"
    )
    return "".join(line + "\n" for line in future) + _PRELUDE + "\n\n" + _FUTURE.sub("", module) + "\n\n\n" + test


def _instrument(stmts: Sequence[ast.stmt], source: str, sources: list[str]) -> list[ast.stmt]:
    """Each statement preceded by ``_collab_at[0] = k`` (``sources[k]`` its text), asserts rewritten, recursively."""
    out: list[ast.stmt] = []
    for node in stmts:
        sources.append(display(source, node))
        out.append(ast.parse(f"_collab_at[0] = {len(sources) - 1}").body[0])
        if isinstance(node, ast.Assert):
            out.extend(_rewrite_assert(node))
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, field, None)
            if not children:
                continue
            if isinstance(children[0], ast.stmt):
                setattr(node, field, _instrument(children, source, sources))
            else:  # except handlers, match cases: their bodies
                for child in children:
                    child.body = _instrument(child.body, source, sources)
        out.append(node)
    return out


def _rewrite_assert(node: ast.Assert) -> list[ast.stmt]:
    """``assert a OP b[, msg]`` -> evaluate ``a`` and ``b`` once, raise AssertionError(expected/got) on failure."""
    test, load = node.test, ast.Load()

    def name(n: str) -> ast.Name:
        return ast.Name(id=n, ctx=load)

    def assign(n: str, value: ast.expr) -> ast.Assign:
        return ast.Assign(targets=[ast.Name(id=n, ctx=ast.Store())], value=value, lineno=node.lineno)

    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        pre = [assign("_collab_l", test.left), assign("_collab_r", test.comparators[0])]
        holds = ast.Compare(left=name("_collab_l"), ops=test.ops, comparators=[name("_collab_r")])
        fails = ast.UnaryOp(op=ast.Not(), operand=holds)
        args = [ast.Constant(_SYMBOLS[type(test.ops[0])]), name("_collab_r"), name("_collab_l")]
    elif isinstance(test, ast.Constant):
        return [node]
    else:
        falsy = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
        pre = [assign("_collab_v", test.operand if falsy else test)]
        fails = name("_collab_v") if falsy else ast.UnaryOp(op=ast.Not(), operand=name("_collab_v"))
        args = [ast.Constant("falsy" if falsy else "truthy"), ast.Constant(None), name("_collab_v")]
    why = ast.Call(func=name("_collab_why"), args=args + ([node.msg] if node.msg is not None else []), keywords=[])
    error = ast.Call(func=name("AssertionError"), args=[why], keywords=[])
    return [*pre, ast.If(test=fails, body=[ast.Raise(exc=error, cause=None)], orelse=[])]


# ---------------------------------------------------------------------------------------------------
# Running the tests


@dataclass
class TestReport:
    """Outcome of every test of one task: ``failures[i]`` is the diagnostic block of failed test ``i``."""

    __test__ = False  # not a pytest test class

    passed: list[bool]
    failures: list[str | None]

    @property
    def n_passed(self) -> int:
        return sum(self.passed)

    @property
    def n_total(self) -> int:
        return len(self.passed)

    @property
    def pass_rate(self) -> float:
        return self.n_passed / self.n_total if self.passed else 0.0

    @property
    def first_failure(self) -> str | None:
        return next((f for f in self.failures if f is not None), None)


def run_task_tests(
    task: dict[str, Any], code: str, pool: Pool | None = None, limits: Limits | None = None
) -> TestReport:
    """Run every test of ``task`` against ``code``, each in its own sandboxed process, in parallel.

    ``limits`` is used for a new pool when ``pool`` is not given (the pool's own limits apply otherwise).
    """
    return run_many([(task, code)], pool or Pool(limits=limits))[0]


def run_many(items: Sequence[tuple[dict[str, Any], str]], pool: Pool | None = None) -> list[TestReport]:
    """Reports of many ``(task, code)`` pairs, all their tests submitted in one ``pool.map``.

    Identical programs (the same code sampled twice for a task) run once.
    """
    pool = pool or Pool()
    programs = [[test_program(task, code, i) for i in range(len(task["tests"]))] for task, code in items]
    unique = list(dict.fromkeys(p for progs in programs for p in progs))
    results = dict(zip(unique, pool.map(unique)))
    reports = []
    for (task, _), progs in zip(items, programs):
        failures = [diagnose(results[p], task["tests"][i], pool.limits) for i, p in enumerate(progs)]
        reports.append(TestReport([f is None for f in failures], failures))
    return reports


def diagnose(result: Result, test: str, limits: Limits) -> str | None:
    """``None`` if the test passed, else its diagnostic block (``test``: the test's source, for failures
    that the program could not report itself)."""
    if result.ok and f"\n{PASS_MARK}\n" in "\n" + result.stdout:
        return None
    line = _last_statement(test)
    block = _fail_block(result.stderr)
    if result.timed_out:
        return f"{line}\nTimeout: the test did not finish within {limits.timeout_s} s"
    if result.killed_by == "cpu":
        return (
            f"{line}\nTimeout: the test used more than its {limits.cpu_s or math.ceil(limits.timeout_s) + 1} s "
            "of CPU time"
        )
    if block is not None:
        return block
    if result.truncated:
        return f"{line}\nOutputLimit: the test printed more than {limits.max_output_bytes} bytes"
    if result.killed_by == "memory":
        return f"{line}\nMemoryError: the test exceeded the {limits.memory_mb} MB memory limit"
    if result.returncode == 0:
        return f"{line}\nSystemExit: the program exited before the test finished"
    return _traceback_tail(result.stderr) or f"{line}\nError: the program ended with exit code {result.returncode}" + (
        f" ({result.killed_by})" if result.killed_by else ""
    )


def _fail_block(stderr: str) -> str | None:
    start = stderr.rfind(f"\n{FAIL_MARK}\n")
    end = stderr.find(f"\n{END_MARK}", start + 1)
    if start < 0 or end < 0:
        return None
    return stderr[start + len(FAIL_MARK) + 2 : end]


def _last_statement(test: str) -> str:
    body = parse_tests(test).body
    return display(test, body[-1]) if body else test


def _traceback_tail(stderr: str) -> str | None:
    """``source line`` + ``ExcType: message`` of a traceback printed before the harness ran (a syntax error)."""
    lines = [line for line in stderr.rstrip().split("\n") if line.strip()]
    if not lines:
        return None
    source = None
    for j in range(len(lines) - 2, -1, -1):
        if lines[j].lstrip().startswith('File "prog.py"'):
            if j + 1 < len(lines) - 1:
                source = lines[j + 1].strip()
            break
    return f"{source}\n{lines[-1].strip()}" if source else lines[-1].strip()
