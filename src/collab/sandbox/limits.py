"""What one sandboxed run may use (:class:`Limits`), what it gave (:class:`Result`), its rlimits and its interpreter."""

from __future__ import annotations

import math
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache


@dataclass
class Limits:
    """Resource limits of one program.

    ``timeout_s`` wall clock; ``cpu_s`` CPU seconds (default ``ceil(timeout_s) + 1``); ``memory_mb``
    memory of the whole run (a cgroup; without one: see ``fallback_processes``; unprivileged: address
    space of each process); ``max_output_bytes`` per stream; ``max_processes`` processes and threads of
    the run (without root it counts *all* processes of the user, training included); ``max_file_mb``
    largest file written (and size of the private /tmp); ``max_open_files`` descriptors per process.
    ``fallback_processes``: as root without a cgroup, the run may have ``n = min(max_processes,
    fallback_processes)`` processes and threads, each with ``memory_mb // n`` of address space.
    ``python``: the program's interpreter.
    """

    timeout_s: float = 8.0
    cpu_s: int | None = None
    memory_mb: int = 1024
    max_output_bytes: int = 64_000
    max_processes: int = 32
    max_file_mb: int = 16
    python: str | None = None  # default: see interpreter()
    max_open_files: int = 256
    fallback_processes: int = 4


@dataclass
class Result:
    """Outcome of one program. ``ok`` means exit code 0 within the timeout."""

    ok: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    killed_by: str | None  # 'timeout', 'output', 'cpu', 'memory', 'setup', 'signal SIGKILL', ...
    seconds: float
    truncated: bool


def rlimits(limits: Limits, dedicated_uid: bool, in_cgroup: bool) -> list[int]:
    """(soft, hard) pairs of RLIMIT_CORE, CPU, AS, FSIZE, NPROC, NOFILE, in the launcher's order."""
    cpu = limits.cpu_s if limits.cpu_s is not None else math.ceil(limits.timeout_s) + 1
    mem, processes = limits.memory_mb << 20, limits.max_processes
    if dedicated_uid and not in_cgroup:  # no cgroup: processes x address space within memory_mb
        processes = max(1, min(processes, limits.fallback_processes))
        mem //= processes
    fsize, files = limits.max_file_mb << 20, limits.max_open_files
    return [0, 0, cpu, cpu + 1, mem, mem, fsize, fsize, processes, processes, files, files]


def _world_executable(path: str) -> bool:
    """True if every directory up to ``path`` is world-searchable and the file world-executable."""
    path = os.path.realpath(path)
    parts = [path] + [os.path.dirname(path)]
    while parts[-1] != "/":
        parts.append(os.path.dirname(parts[-1]))
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in parts)


@lru_cache(maxsize=None)
def interpreter() -> str:
    """The training interpreter, unless the sandbox uid cannot use it (e.g. it lives under /root).

    As root it is resolved: a venv's ``bin/python`` link (under the checkout, hidden in the sandbox)
    becomes the interpreter it points to; with ``-I -S`` the venv's packages are not used anyway.
    """
    if os.geteuid() != 0:
        return sys.executable
    if _world_executable(sys.executable):
        return os.path.realpath(sys.executable)
    return shutil.which("python3", path="/usr/bin:/bin") or sys.executable


@lru_cache(maxsize=None)
def network_isolated() -> bool:
    """Whether sandboxed programs get their own network namespace (needs root and unshare(2))."""
    if os.geteuid() != 0:
        return False
    probe = "import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare(0x40000000) != 0)"
    return subprocess.run([interpreter(), "-I", "-S", "-c", probe], env={}, timeout=30).returncode == 0
