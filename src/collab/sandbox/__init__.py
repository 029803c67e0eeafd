"""Run untrusted generated programs in separate, limited processes.

Generated code never runs in the training process. :func:`run` starts each program in its own
interpreter and returns a :class:`Result`; :class:`Pool` runs many in parallel; :func:`run_tests`
runs one assert at a time against a candidate solution (the coding reward).

The protections (process group, timeout, rlimits, clean environment, private folder, capped output; as
root a dedicated uid, a memory cgroup and network, IPC and mount namespaces), which apply when, and what
none contains: docs/design.md, *The sandbox*.

Files: this module runs programs (:func:`run`, :class:`Pool`, :func:`run_tests`);
:mod:`~collab.sandbox.limits` (:class:`Limits`, :class:`Result`, rlimits, the interpreter),
:mod:`~collab.sandbox.cgroups` (per-run memory cgroups), :mod:`~collab.sandbox.processes` (dedicated
uids, killing, capped output), :mod:`~collab.sandbox.launcher` (the child's setup: namespaces, the
minimal file system, limits, privilege drop).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from importlib.resources import files

from collab.sandbox import cgroups
from collab.sandbox.cgroups import memory_containment
from collab.sandbox.limits import Limits, Result, interpreter, network_isolated, rlimits
from collab.sandbox.processes import claim_uid, collect, exited, feed, kill_uid, killpg, release_uid

__all__ = ["Limits", "Result", "run", "Pool", "run_tests", "network_isolated", "memory_containment"]

# What the tests (tests/sandbox) reach through the package: this process's cgroups, and the cgroup discovery
# that run() asks (a test replaces it to take the no-cgroup path).
_cg_all, _cg_idle = cgroups.ALL, cgroups.IDLE
_cgroup_parents = cgroups.cgroup_parents


@lru_cache(maxsize=None)
def _launcher_source() -> str:
    """The text of :mod:`collab.sandbox.launcher`, which the child runs with ``-c``."""
    return files(__name__).joinpath("launcher.py").read_text(encoding="utf-8")


def run(code: str, stdin: str = "", limits: Limits | None = None) -> Result:
    """Run ``code`` as a Python program in a sandboxed child process and return its :class:`Result`."""
    limits = limits or Limits()
    start = time.monotonic()
    deadline = start + limits.timeout_s
    workdir = tempfile.mkdtemp(prefix="collab-sandbox-")  # mode 0700
    proc = uid = slot = cgroup = None
    bufs = {"stdout": bytearray(), "stderr": bytearray()}
    timed_out = truncated = setup_failed = False
    try:
        if os.geteuid() == 0:
            uid, slot = claim_uid()
            cgroup = cgroups.acquire(limits.memory_mb, *_cgroup_parents())
        proc = _start(code, workdir, uid, cgroup, limits)
        if cgroup is not None:  # while the interpreter starts (moving a process waits for an RCU grace period)
            try:
                cgroup.join(proc.pid)
            except OSError:
                setup_failed = True
                killpg(proc.pid)
        threading.Thread(target=feed, args=(proc.stdin, stdin.encode()), daemon=True).start()
        timed_out, truncated = collect(proc, bufs, deadline, limits.max_output_bytes)
        while not (timed_out or truncated or exited(proc.pid)):  # closed its output but runs on?
            timed_out = time.monotonic() > deadline
            time.sleep(0.002)
    finally:
        ooms = _clean_up(proc, workdir, uid, slot, cgroup)
    rc = proc.returncode
    stdout = bufs["stdout"].decode("utf-8", "replace")
    stderr = bufs["stderr"].decode("utf-8", "replace")
    killed_by = _killed_by(rc, timed_out, truncated, setup_failed, ooms, stderr)
    ok = rc == 0 and not timed_out
    return Result(ok, rc, stdout, stderr, timed_out, killed_by, time.monotonic() - start, truncated)


def _start(code: str, workdir: str, uid: int | None, cgroup: cgroups.Cgroup | None, limits: Limits) -> subprocess.Popen:
    """The launcher started on ``code``, in its own session, with a clean environment."""
    with open(os.path.join(workdir, "prog.py"), "w", encoding="utf-8") as f:
        f.write(code)
    if uid is not None:
        os.chown(workdir, uid, uid)
    args = [
        -1 if uid is None else uid,
        limits.max_file_mb,
        limits.memory_mb,
        *rlimits(limits, uid is not None, cgroup is not None),
    ]
    args.append(f"{cgroup.name}:{len(cgroup.procs)}" if cgroup is not None else ":")
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    python = limits.python or interpreter()
    return subprocess.Popen(
        [python, "-I", "-S", "-B", "-c", _launcher_source(), *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=workdir,
        env=env,
        start_new_session=True,
        close_fds=True,
    )


def _clean_up(
    proc: subprocess.Popen | None, workdir: str, uid: int | None, slot: int | None, cgroup: cgroups.Cgroup | None
) -> int:
    """Kill everything the run left, free its uid, cgroup and folder; returns the cgroup's OOM kills."""
    ooms = 0
    if proc is not None:
        killpg(proc.pid)  # the leader is not reaped yet, so its group id cannot have been reused
    reuse = True
    if cgroup is not None:  # every process of the run is in it (the launcher joins it first)
        try:
            reuse = cgroup.kill()
        except OSError:
            reuse = False
        if not reuse:
            kill_uid(uid)
        ooms = cgroup.oom_kills()
    elif uid is not None:
        kill_uid(uid)
    if proc is not None:
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
    shutil.rmtree(workdir, ignore_errors=True)
    if cgroup is not None:
        cgroups.release(cgroup, reuse)
    if slot is not None:
        release_uid(slot)
    return ooms


def _killed_by(
    rc: int | None, timed_out: bool, truncated: bool, setup_failed: bool, ooms: int, stderr: str
) -> str | None:
    """What ended the run, or ``None`` when it ended by itself."""
    if timed_out:
        return "timeout"
    if truncated:
        return "output"
    if rc == -signal.SIGXCPU:
        return "cpu"
    if rc != 0 and (ooms or "MemoryError" in stderr[-2000:]):
        return "memory"
    if setup_failed or rc == 125 and stderr.startswith("collab sandbox: setup failed"):
        return "setup"
    if rc is not None and rc < 0:
        return f"signal {signal.Signals(-rc).name}"
    return None


class Pool:
    """Runs many programs in parallel, each in its own sandboxed process (one thread per worker)."""

    def __init__(self, workers: int | None = None, limits: Limits | None = None):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.limits = limits or Limits()

    def map(self, codes: list[str], stdins: list[str] | None = None) -> list[Result]:
        """Run every program; results come back in input order."""
        stdins = stdins if stdins is not None else [""] * len(codes)
        if len(stdins) != len(codes):
            raise ValueError(f"{len(codes)} programs but {len(stdins)} stdins")
        with ThreadPoolExecutor(max_workers=self.workers) as ex:
            return list(ex.map(lambda c, s: run(c, s, self.limits), codes, stdins))


def run_tests(code: str, tests: list[str], limits: Limits | None = None, pool: Pool | None = None) -> list[bool]:
    """Run each test (an assert statement) on its own after ``code``; True where the program succeeded."""
    pool = pool or Pool(limits=limits)
    return [r.ok for r in pool.map([code + "\n" + test + "\n" for test in tests])]
