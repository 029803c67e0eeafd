"""A class's unit tests run the way the reference runs them, in collab's sandbox (:mod:`collab.sandbox`).

OpenMLRL/LLM_Collab_Code_Completion (read at 1b754a3), ``rewards/CE_reward.py``, ``run_unittests_with_details``,
rules T1-T5:

- T1: the program is the merged class, stripped at its end, a blank line, then the record's ``test``; if it does not
  compile nothing runs (the reward is then 0);
- T2: it is written to ``task_module_payload.py`` in the working directory and loaded from there as a module named
  ``task_module`` (so an ``if __name__ == "__main__":`` block does not run; the module is not put in
  ``sys.modules``), then unittest's default loader takes every test of that module (classes and methods in name
  order) and runs them with their output captured;
- T3: each test runs under a ``SIGALRM`` timer (40 s), raising an ``Exception`` subclass; after the third timed-out
  test the rest are neither run nor counted;
- T4: the result is one JSON line on standard output, which must be all the output: a class that prints while it is
  defined (outside a test) spoils it, as do a failure to load and the whole run's time limit (3 x 40 + 5 s), and
  then no test counts;
- T5: passed = tests run - failures - errors - skipped (an expected failure counts as passed).

One sandboxed program per class; the sandbox gives each its own folder as working directory, as the reference's
temporary directory. As the reference, nothing here defends against code written to print a result line of its own
and exit. The sandbox's interpreter runs without site-packages (``-I -S``): the 12 published classes that
import numpy, nltk, PIL and the like fail to load here (docs/fidelity.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from collab import sandbox

__all__ = ["MAX_TIMEOUTS", "TEST_TIMEOUT", "TestRun", "compiles", "program", "run_many"]

TEST_TIMEOUT = 40.0
MAX_TIMEOUTS = 3

_RUNNER = """\
import contextlib as _cl, importlib.util as _ilu, io as _io, json as _json, signal as _signal, sys as _sys
import unittest as _unittest


class _Timeout(Exception):
    pass


def _ring(signum, frame):
    raise _Timeout("Test timed out")


def _quiet():
    _signal.setitimer(_signal.ITIMER_REAL, 0)


class _Result(_unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records, self.timeouts = [], 0

    def startTest(self, test):
        super().startTest(test)
        _signal.signal(_signal.SIGALRM, _ring)
        _signal.setitimer(_signal.ITIMER_REAL, _LIMIT)

    def stopTest(self, test):
        _quiet()
        super().stopTest(test)

    def _record(self, test, outcome):
        _quiet()
        self.records.append([str(test), outcome])

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failed")

    def addError(self, test, err):
        super().addError(test, err)
        timeout = err[0] is _Timeout
        self.timeouts += timeout
        self._record(test, "timeout" if timeout else "error")
        if self.timeouts >= _MAX_TIMEOUTS:
            self.shouldStop = True

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped")


with open("task_module_payload.py", "w", encoding="utf-8") as _f:
    _f.write(_CODE)
try:
    _spec = _ilu.spec_from_file_location("task_module", "task_module_payload.py")
    _module = _ilu.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
except BaseException as _e:
    print(_json.dumps({"exception": type(_e).__name__ + ": " + str(_e)[:300]}))
    _sys.exit(2)
_suite = _unittest.defaultTestLoader.loadTestsFromModule(_module)
_stream = _io.StringIO()
with _cl.redirect_stdout(_stream), _cl.redirect_stderr(_stream):
    _res = _unittest.TextTestRunner(stream=_stream, verbosity=2, resultclass=_Result).run(_suite)
_bad = len(_res.failures) + len(_res.errors) + len(_res.skipped)
print(_json.dumps({"run": _res.testsRun, "passed": _res.testsRun - _bad, "records": _res.records}))
"""


@dataclass(frozen=True)
class TestRun:
    """What one class's test program gave (T4-T5): all zeros and no records when it gave no result line."""

    __test__ = False  # not a pytest test class

    run: int = 0
    passed: int = 0
    failing: tuple[str, ...] = ()
    """The tests that did not pass, in run order, each ``name (module.Class)`` with its outcome."""
    error: str = ""
    """Why no test counts (loading failed, the output was not the result line, the time limit), else ''."""


def program(merged: str, test: str) -> str:
    """T1: the module the tests run in."""
    return merged.rstrip() + "\n\n" + test.lstrip()


def compiles(code: str) -> bool:
    """T1's check."""
    try:
        compile(code, "<combined>", "exec")
    except Exception:  # as the reference: whatever compile raises
        return False
    return True


def limits(test_timeout: float) -> sandbox.Limits:
    """T4's time limit of one program."""
    return sandbox.Limits(timeout_s=test_timeout * MAX_TIMEOUTS + 5.0)


def read(result: sandbox.Result) -> TestRun:
    """T4-T5 from the program's output."""
    try:
        data = json.loads(result.stdout.strip())
    except ValueError:
        data = None
    try:
        failing = tuple(f"{name}: {outcome}" for name, outcome in data["records"] if outcome != "passed")
        return TestRun(int(data["run"]), int(data["passed"]), failing)
    except (TypeError, KeyError, ValueError):  # not the runner's line: an exception's, or none
        why = data.get("exception") if isinstance(data, dict) else None
        why = why or ("the time limit ran out" if result.timed_out else "other output than the result line")
        return TestRun(error=str(why))


def run_many(codes: Sequence[str], test_timeout: float, pool: sandbox.Pool) -> list[TestRun]:
    """The tests of each compiled module of ``codes`` (identical ones run once)."""
    head = f"_LIMIT, _MAX_TIMEOUTS = {float(test_timeout)!r}, {MAX_TIMEOUTS}\n"
    unique = list(dict.fromkeys(codes))
    results = pool.map([f"_CODE = {code!r}\n{head}\n{_RUNNER}" for code in unique])
    by_code = {code: read(r) for code, r in zip(unique, results)}
    return [by_code[code] for code in codes]
