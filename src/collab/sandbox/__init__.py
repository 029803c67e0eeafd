"""Run untrusted generated programs in separate, limited processes.

Generated code never runs in the training process. :func:`run` starts each program in its own
interpreter and returns a :class:`Result`; :class:`Pool` runs many in parallel; :func:`run_tests`
runs one assert at a time against a candidate solution (the coding reward).

Protections, outermost first:

* **Separate process, own session.** ``start_new_session=True`` puts the program in a new process
  group, so one ``killpg`` reaches the program and everything it forks.
* **Wall-clock timeout.** On expiry the whole group gets SIGKILL. The group (and, see below, the
  run's cgroup or sandbox uid) is killed again at the end of *every* run, so daemonized leftovers do
  not survive.
* **CPU, memory, file, descriptor, process limits** (``setrlimit`` in the child before any program code
  runs): ``RLIMIT_CPU`` (SIGXCPU, then SIGKILL one second later), ``RLIMIT_AS`` (allocations beyond it
  raise MemoryError), ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE`` (``max_open_files``, 256: descriptor
  exhaustion stays inside the process), ``RLIMIT_NPROC`` (fork bombs) and ``RLIMIT_CORE=0``.
* **Clean environment.** The child gets ``PATH``, ``LANG``, ``HOME`` and ``TMPDIR`` only, none of the
  parent's variables, and runs ``python -I -S -B`` (ignores ``PYTHON*`` variables, user and site
  packages, writes no bytecode; the stdlib still imports).
* **Private working directory.** A fresh 0700 temp dir is the cwd, ``HOME`` and ``TMPDIR``; it is
  removed afterwards.
* **Capped output.** stdout and stderr are read incrementally; past ``max_output_bytes`` reading stops,
  the result is marked ``truncated`` and the group is killed, so gigabytes of output end at once.

When the parent runs as root (as on our training machines and CI), the child additionally

* **drops to a dedicated, unprivileged uid** (one per concurrent run, never used by anything else) with
  no supplementary groups and ``PR_SET_NO_NEW_PRIVS``: it cannot signal (``kill(-1, 9)`` included) or
  ``ptrace`` the parent or other runs, or write files owned by root, and ``RLIMIT_NPROC`` (which does
  not bind root) applies. Because the uid is dedicated, killing *every* process of that uid after the
  run is safe; this catches children that escaped the process group with ``setsid``.
* **is memory-limited as a whole run** (``Limits.memory_mb`` is the memory of the run, all its
  processes together): see *Memory* below.
* **has no network**: it enters a new network namespace, whose only interface (loopback) is down.
  Abstract UNIX sockets (``\\0name``) belong to the network namespace, so listeners of the host are out
  of reach too.
* **has its own SysV IPC**: a new IPC namespace (shared memory, semaphores, message queues) dies with
  the run's last process, segments left behind included; its ``shmall`` is the run's memory and its
  ``msgmni`` 16.
* **sees a minimal file system** (a new mount namespace, then ``pivot_root`` into a fresh tmpfs). What
  generated code may read: read-only bind mounts of ``/usr`` (with ``/bin``, ``/sbin``, ``/lib*``,
  which are links into it or bind mounts too), the interpreter's own files wherever they are (its
  executable, every ``sys.path`` directory, i.e. the stdlib, and the shared libraries it has mapped:
  so a pyenv interpreter under /root still works, without the rest of /root), a few public files of
  ``/etc`` (dynamic loader cache and config, time zone, ``alternatives``, ``hosts``,
  ``nsswitch.conf``, ``os-release``, ``mime.types``) plus a generated ``passwd``/``group``;
  ``/dev/{null,zero,full,random,urandom}``; a ``/proc`` mounted with ``hidepid=invisible`` (kernel 5.8+:
  only the run's own processes are visible; older kernels: a plain /proc); and size-limited private
  tmpfs mounts it may write: the working directory (``4 x max_file_mb``), /tmp, /var/tmp and /dev/shm
  (``max_file_mb`` each). Everything else is absent: the project checkout, /work, /root, /home, /run
  (so UNIX sockets of the host reached by path, which network namespaces do not cover, do not exist),
  /opt, /mnt, /srv, /var, /sys, the rest of /etc, other runs' directories. If building this file
  system fails, the run does not start (exit code 125, ``killed_by='setup'``).

**Memory** (:mod:`collab.sandbox.cgroups`): as root, each run gets its own memory cgroup where one can
be made, so ``Limits.memory_mb`` binds all processes of the run together (tmpfs pages included); where
none can, the limit becomes *processes x address space*. :func:`memory_containment` tells which
applies (``'cgroup v1'``, ``'cgroup v2'``, ``'rlimit'``, or ``'per-process'`` when not root).

A guard replacing ``socket`` connects with a function raising OSError (an import hook, so it costs
nothing to programs that do not import socket) is added in every case; it is defence in depth only
(``_socket`` bypasses it). Where the parent is not root, timeout, limits, environment and output cap
still hold, but the network, IPC and the file system are not isolated, memory is limited per process
only and a same-uid child *can* signal the parent; as root where unshare(2) fails (e.g. a container
without CAP_SYS_ADMIN), uid, memory and limits hold but the namespaces are missing:
:func:`network_isolated` and :func:`memory_containment` tell which case applies. Not contained in any
case: the program shares the CPUs with training (up to its timeout).

The setup runs in the child, in :mod:`collab.sandbox.launcher` (a module of the standard library
only, whose source is passed with ``-c``: its docstring says why), before the program is compiled in
the same interpreter. As root the interpreter must be usable by the sandbox uid: ``sys.executable``
(resolved, so that a venv's link under the hidden checkout is not needed) if it is, else
/usr/bin/python3.

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
