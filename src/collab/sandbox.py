"""Run untrusted generated programs in separate, limited processes.

Generated code never runs in the training process. :func:`run` starts each program in its own
interpreter and returns a :class:`Result`; :class:`Pool` runs many in parallel; :func:`run_tests`
runs one assert at a time against a candidate solution (the coding reward).

Protections, outermost first:

* **Separate process, own session.** ``start_new_session=True`` puts the program in a new process
  group, so one ``killpg`` reaches the program and everything it forks.
* **Wall-clock timeout.** On expiry the whole group gets SIGKILL. The group (and, see below, the
  sandbox uid) is killed again at the end of *every* run, so daemonized leftovers do not survive.
* **CPU, memory, file, process limits** (``setrlimit`` in the child before any program code runs):
  ``RLIMIT_CPU`` (SIGXCPU, then SIGKILL one second later), ``RLIMIT_AS`` (allocations beyond it raise
  MemoryError), ``RLIMIT_FSIZE``, ``RLIMIT_NPROC`` (fork bombs) and ``RLIMIT_CORE=0``.
* **Clean environment.** The child gets ``PATH``, ``LANG``, ``HOME`` and ``TMPDIR`` only, none of the
  parent's variables, and runs ``python -I -S -B`` (ignores ``PYTHON*`` variables, user and site
  packages, writes no bytecode; the stdlib still imports).
* **Private working directory.** A fresh 0700 temp dir is the cwd, ``HOME`` and ``TMPDIR``; it is
  removed afterwards.
* **Capped output.** stdout and stderr are read incrementally; past ``max_output_bytes`` reading stops,
  the result is marked ``truncated`` and the group is killed, so gigabytes of output end at once.

When the parent runs as root (as on our training machines), the child additionally

* **drops to a dedicated, unprivileged uid** (one per concurrent run, never used by anything else) with
  no supplementary groups and ``PR_SET_NO_NEW_PRIVS``: it cannot signal the parent, read
  ``/proc/<parent>/environ`` or write files owned by root, and ``RLIMIT_NPROC`` (which does not bind
  root) applies. Because the uid is dedicated, killing *every* process of that uid after the run is
  safe; this catches children that escaped the process group with ``setsid``.
* **has no network**: it enters a new network namespace, whose only interface (loopback) is down.
* **writes only to small private tmpfs mounts**: in a new mount namespace, the working directory and the
  world-writable /tmp, /var/tmp, /dev/shm and /run/lock are size-limited tmpfs mounts of its own, so
  files neither leak between runs nor fill the disk; everything else belongs to other uids.

A guard replacing ``socket`` connects with a function raising OSError (an import hook, so it costs
nothing to programs that do not import socket) is added in every case; it is defence in depth only
(``_socket`` bypasses it). Where the parent is not root or namespaces are unavailable, timeout, limits,
environment and output cap still hold, but the network is not blocked and a same-uid child *can* signal
the parent: :func:`network_isolated` tells which case applies. Not contained in any case: the program
shares the CPUs with training (up to its timeout) and sees other processes' command lines in /proc.

The setup runs in the child as a short launcher (``_LAUNCHER``) before the program is compiled in the
same interpreter, rather than in a ``preexec_fn``, which is unsafe in a multi-threaded parent. As root
the interpreter must be usable by the sandbox uid: ``sys.executable`` if it is, else /usr/bin/python3.
"""

from __future__ import annotations

import itertools
import math
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["Limits", "Result", "run", "Pool", "run_tests", "network_isolated"]

# Dedicated uids: base + (parent pid % 65536) * 4096 + slot, unused by any account on the machine.
# Slots rotate, so a uid is reused only 4096 runs later: killed processes that init has not reaped
# yet (zombies still count towards RLIMIT_NPROC) are long gone by then.
_UID_BASE = 1_500_000_000
_uid_lock = threading.Lock()
_uid_counter = itertools.count()
_slots_in_use: set[int] = set()

# Runs in the child before the program (as root when the parent is root): namespaces, limits,
# privilege drop, socket guard; then it compiles and executes prog.py in __main__ in place.
_LAUNCHER = r'''
def _setup():
    import os, resource, sys
    uid, file_mb, *limits = map(int, sys.argv[1:])
    with open("prog.py", "rb") as f:
        source = f.read()
    if uid >= 0:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.unshare(0x40000000)  # CLONE_NEWNET: fresh namespace, only a loopback that is down
        # CLONE_NEWNS, then MS_REC|MS_PRIVATE so that no mount propagates out of the namespace
        if libc.unshare(0x00020000) == 0 and libc.mount(b"none", b"/", None, 16384 | 262144, None) == 0:
            workdir = os.getcwd()
            for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):  # the world-writable directories
                if os.path.isdir(d):
                    opts = "size=%dm,mode=1777" % file_mb
                    libc.mount(b"tmpfs", d.encode(), b"tmpfs", 2 | 4, opts.encode())  # MS_NOSUID|MS_NODEV
            os.makedirs(workdir, exist_ok=True)  # the work dir: a small tmpfs owned by the sandbox uid
            opts = "size=%dm,mode=700,uid=%d,gid=%d" % (4 * file_mb, uid, uid)
            if libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", 2 | 4, opts.encode()) == 0:
                with open(os.path.join(workdir, "prog.py"), "wb") as f:  # for tracebacks
                    f.write(source)
            os.chdir(workdir)
    for i, name in enumerate(("CORE", "CPU", "AS", "FSIZE", "NPROC")):
        resource.setrlimit(getattr(resource, "RLIMIT_" + name), (limits[2 * i], limits[2 * i + 1]))
    if uid >= 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    from importlib.machinery import PathFinder

    class SocketGuard:  # patches socket if and when the program imports it (importing it costs ~10 ms)
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name != "socket":
                return None
            spec = PathFinder.find_spec(name, path)
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                def refuse(*args, **kwargs):
                    raise OSError(101, "network access is disabled in the sandbox")
                module.socket.connect = module.socket.connect_ex = module.socket.sendto = refuse
                module.create_connection = refuse
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, SocketGuard)
    sys.argv[:] = ["prog.py"]
    return compile(source, "prog.py", "exec")
__file__ = "prog.py"
exec(globals().pop("_setup")())
'''


@dataclass
class Limits:
    """Resource limits of one program.

    ``timeout_s`` wall clock; ``cpu_s`` CPU seconds (default ``ceil(timeout_s) + 1``); ``memory_mb``
    address space; ``max_output_bytes`` per stream; ``max_processes`` processes and threads of the
    sandbox uid (without root it counts *all* processes of the user, training included); ``max_file_mb``
    largest file written (and size of the private /tmp). ``python``: the program's interpreter.
    """

    timeout_s: float = 8.0
    cpu_s: int | None = None
    memory_mb: int = 1024
    max_output_bytes: int = 64_000
    max_processes: int = 32
    max_file_mb: int = 16
    python: str | None = None  # default: see _interpreter()


@dataclass
class Result:
    """Outcome of one program. ``ok`` means exit code 0 within the timeout."""

    ok: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    killed_by: str | None  # 'timeout', 'output', 'cpu', 'memory', 'signal SIGKILL', ...
    seconds: float
    truncated: bool


def _world_executable(path: str) -> bool:
    """True if every directory up to ``path`` is world-searchable and the file world-executable."""
    path = os.path.realpath(path)
    parts = [path] + [os.path.dirname(path)]
    while parts[-1] != "/":
        parts.append(os.path.dirname(parts[-1]))
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in parts)


@lru_cache(maxsize=None)
def _interpreter() -> str:
    """The training interpreter, unless the sandbox uid cannot use it (e.g. it lives under /root)."""
    if os.geteuid() != 0 or _world_executable(sys.executable):
        return sys.executable
    return shutil.which("python3", path="/usr/bin:/bin") or sys.executable


@lru_cache(maxsize=None)
def network_isolated() -> bool:
    """Whether sandboxed programs get their own network namespace (needs root and unshare(2))."""
    if os.geteuid() != 0:
        return False
    probe = "import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare(0x40000000) != 0)"
    return subprocess.run([_interpreter(), "-I", "-S", "-c", probe], env={}, timeout=30).returncode == 0


def _claim_uid() -> tuple[int, int]:
    with _uid_lock:
        if len(_slots_in_use) >= 4096:
            raise RuntimeError("more than 4096 concurrent sandboxed programs")
        slot = next(_uid_counter) % 4096
        while slot in _slots_in_use:
            slot = next(_uid_counter) % 4096
        _slots_in_use.add(slot)
    return _UID_BASE + (os.getpid() % 65536) * 4096 + slot, slot


def _kill_uid(uid: int) -> None:
    """SIGKILL every live process whose real uid is ``uid``, repeating until none is left (fork races)."""
    for _ in range(100):
        found = False
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if line[:4] in ("Stat", "Uid:"))
                if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
                    os.kill(int(pid), signal.SIGKILL)
                    found = True
            except (OSError, KeyError, ValueError):
                pass  # exited meanwhile
        if not found:
            return
        time.sleep(0.005)


def _exited(pid: int) -> bool:
    """Whether the child has exited, *without* reaping it (WNOWAIT keeps its pid and group id taken)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
    except OSError:
        pass  # the program exited or closed stdin
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def run(code: str, stdin: str = "", limits: Limits | None = None) -> Result:
    """Run ``code`` as a Python program in a sandboxed child process and return its :class:`Result`."""
    limits = limits or Limits()
    start = time.monotonic()
    deadline = start + limits.timeout_s
    cpu = limits.cpu_s if limits.cpu_s is not None else math.ceil(limits.timeout_s) + 1
    workdir = tempfile.mkdtemp(prefix="collab-sandbox-")  # mode 0700
    proc = uid = slot = None
    bufs = {"stdout": bytearray(), "stderr": bytearray()}
    timed_out = truncated = False
    try:
        if os.geteuid() == 0:
            uid, slot = _claim_uid()
        with open(os.path.join(workdir, "prog.py"), "w", encoding="utf-8") as f:
            f.write(code)
        if uid is not None:
            os.chown(workdir, uid, uid)
        mem, fsize = limits.memory_mb << 20, limits.max_file_mb << 20
        rlimits = [0, 0, cpu, cpu + 1, mem, mem, fsize, fsize, limits.max_processes, limits.max_processes]
        args = [-1 if uid is None else uid, limits.max_file_mb, *rlimits]  # CORE, CPU, AS, FSIZE, NPROC
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        python = limits.python or _interpreter()
        proc = subprocess.Popen(
            [python, "-I", "-S", "-B", "-c", _LAUNCHER, *map(str, args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=workdir, env=env, start_new_session=True, close_fds=True,
        )
        threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True).start()
        timed_out, truncated = _collect(proc, bufs, deadline, limits.max_output_bytes)
        while not (timed_out or truncated or _exited(proc.pid)):  # closed its output but runs on?
            timed_out = time.monotonic() > deadline
            time.sleep(0.002)
    finally:
        if proc is not None:
            _killpg(proc.pid)  # the leader is not reaped yet, so its group id cannot have been reused
        if uid is not None:
            _kill_uid(uid)
        if proc is not None:
            proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                pipe.close()
        shutil.rmtree(workdir, ignore_errors=True)
        if slot is not None:
            with _uid_lock:
                _slots_in_use.discard(slot)
    rc = proc.returncode
    stdout = bufs["stdout"].decode("utf-8", "replace")
    stderr = bufs["stderr"].decode("utf-8", "replace")
    killed_by = None
    if timed_out:
        killed_by = "timeout"
    elif truncated:
        killed_by = "output"
    elif rc == -signal.SIGXCPU:
        killed_by = "cpu"
    elif rc != 0 and "MemoryError" in stderr[-2000:]:
        killed_by = "memory"
    elif rc is not None and rc < 0:
        killed_by = f"signal {signal.Signals(-rc).name}"
    ok = rc == 0 and not timed_out
    return Result(ok, rc, stdout, stderr, timed_out, killed_by, time.monotonic() - start, truncated)


def _collect(proc: subprocess.Popen, bufs: dict, deadline: float, cap: int) -> tuple[bool, bool]:
    """Read stdout/stderr until both close, the deadline passes or a stream exceeds ``cap`` bytes.

    Returns ``(timed_out, truncated)``; on either, the process group has been killed. Once the main
    process has exited, only what is already buffered is read (a daemonized grandchild holding the
    pipes open does not extend the run).
    """
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    try:
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _killpg(proc.pid)
                return True, False
            exited = _exited(proc.pid)
            events = sel.select(0 if exited else min(remaining, 0.1))
            if exited and not events:
                return False, False
            for key, _ in events:
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[key.data]
                buf += chunk
                if len(buf) > cap:
                    del buf[cap:]
                    _killpg(proc.pid)
                    return False, True
        return False, False
    finally:
        sel.close()


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
