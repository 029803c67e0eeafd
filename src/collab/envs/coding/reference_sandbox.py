"""``reward_mode: reference``, rules R7-R9: the tests of one (aux, main) pair run the way the reference runs them.

One sandboxed program per pair executes the combined code once in a namespace holding ``math`` and
then every test in that namespace under a ``SIGALRM`` timer, stopping after ``MAX_TIMEOUTS``
timeouts; each test is reported on a copy of stderr (the rules: :mod:`collab.envs.coding.reference`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from collab import sandbox
from collab.envs.coding.harness import TestReport

TEST_TIMEOUT = 10.0  # the reference's per-test alarm, seconds
MAX_TIMEOUTS = 3


@dataclass
class RefReport(TestReport):
    """The tests of one pair as the reference runs them (R7-R9)."""

    __test__ = False

    loaded: bool = True
    """R7: the combined code executed without an exception (else no test counts)."""
    timeouts: int = 0


_MARK = "__COLLAB_REF__"

# Runs the agents' code and the tests the way the reference does, reporting each test on a copy of
# stderr as ``_MARK json`` (the last report of a test wins, so text the agents print cannot replace it).
_RUNNER = """\
import json as _json, math as _math, os as _os, re as _re, signal as _signal

_fd = _os.dup(2)


def _say(*fields):
    _os.write(_fd, ("\\n{mark} " + _json.dumps(fields) + "\\n").encode())


class _Timeout(Exception):
    pass


def _ring(signum, frame):
    raise _Timeout("Code execution timed out")


def _why(e):
    try:
        text = str(e)
    except BaseException:
        text = ""
    return [type(e).__name__, text[:500]]


_ns = {{"math": _math}}
try:
    exec(_CODE, _ns)
except BaseException as e:
    _say("load", *_why(e))
    _os._exit(0)
_say("loaded")
_call = _re.compile(r"assert\\s+(\\w+)\\(([^)]*)\\)\\s*==\\s*(.+)")
_timeouts = 0
for _i, _case in enumerate(_CASES):
    if _timeouts >= {max_timeouts}:
        break
    try:
        _signal.signal(_signal.SIGALRM, _ring)
        _signal.setitimer(_signal.ITIMER_REAL, _LIMIT)
        _m = _call.search(_case)
        if _m:
            eval(_m.group(1) + "(" + _m.group(2) + ")", _ns)
            eval(_m.group(3), _ns)
        exec(_case, _ns)
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _say(_i, "pass")
    except _Timeout:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _timeouts += 1
        _say(_i, "timeout")
    except BaseException as e:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _say(_i, "fail", *_why(e))
_say("done")
_os._exit(0)
""".format(mark=_MARK, max_timeouts=MAX_TIMEOUTS)


def program(code: str, cases: Sequence[str], timeout: float) -> str:
    """The sandboxed program running ``cases`` against ``code`` as the reference does."""
    return f"_CODE = {code!r}\n_CASES = {list(cases)!r}\n_LIMIT = {float(timeout)!r}\n\n" + _RUNNER


def _report(result: sandbox.Result, cases: Sequence[str], timeout: float) -> RefReport:
    events: dict[Any, list] = {}
    for line in result.stderr.split("\n"):
        if line.startswith(_MARK + " "):
            try:
                fields = json.loads(line[len(_MARK) + 1 :])
            except ValueError:
                continue
            if isinstance(fields, list) and fields and isinstance(fields[0], (int, str)):
                events[fields[0]] = fields[1:]
    if "load" in events:
        kind, text = (events["load"] + ["", ""])[:2]
        failure = f"(loading the code)\n{kind}" + (f": {text}" if text else "")
        return RefReport([False] * len(cases), [failure] * len(cases), loaded=False)
    passed, failures, timeouts = [], [], 0
    for i, case in enumerate(cases):
        event = events.get(i)
        if event and event[0] == "pass":
            passed.append(True)
            failures.append(None)
            continue
        passed.append(False)
        if event and event[0] == "timeout":
            timeouts += 1
            failures.append(f"{case}\nTimeout: the test did not finish within {timeout} s")
        elif event:
            kind, text = (event[1:] + ["", ""])[:2]
            failures.append(f"{case}\n{kind}" + (f": {text}" if text else ""))
        elif timeouts >= MAX_TIMEOUTS:
            failures.append(f"{case}\nSkipped: {MAX_TIMEOUTS} tests timed out before it")
        else:
            failures.append(f"{case}\nTimeout: the program did not finish its tests")
    return RefReport(passed, failures, loaded="loaded" in events, timeouts=timeouts)


def run_many(
    items: Sequence[tuple[str, Sequence[str]]],
    timeout: float = TEST_TIMEOUT,
    workers: int = 1,
    limits: sandbox.Limits | None = None,
) -> list[RefReport]:
    """Reports of ``(code, cases)`` pairs, each pair's tests in one sandboxed program (identical ones once).

    The program's wall-clock limit is ``len(cases) * timeout + 5`` s; ``limits`` gives the other limits.
    """
    base = limits or sandbox.Limits()
    programs = [program(code, cases, timeout) for code, cases in items]
    sizes = {p: len(cases) for p, (_, cases) in zip(programs, items)}
    unique = list(sizes)

    def run(prog: str) -> sandbox.Result:
        wall = sizes[prog] * timeout + 5.0
        lim = sandbox.Limits(
            timeout_s=wall,
            cpu_s=math.ceil(wall) + 1,
            memory_mb=base.memory_mb,
            max_output_bytes=base.max_output_bytes,
            max_processes=base.max_processes,
            max_file_mb=base.max_file_mb,
            python=base.python,
        )
        return sandbox.run(prog, "", lim)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
        results = dict(zip(unique, ex.map(run, unique)))
    return [_report(results[p], cases, timeout) for p, (_, cases) in zip(programs, items)]
