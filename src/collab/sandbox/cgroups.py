"""Per-run memory cgroups: one run's processes together stay within ``Limits.memory_mb``.

As root, each run gets a memory cgroup (v1 or v2) nested under the parent's own, whose limit binds all
its processes together; where none can be made, the limit becomes *processes x address space*
(docs/design.md, *The sandbox*, says how). :func:`memory_containment` tells which applies.
"""

from __future__ import annotations

import atexit
import itertools
import os
import signal
import threading
import time
from functools import lru_cache

_CG_PREFIX = "collab-sandbox-"


def _write(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _own_cgroup_dirs() -> dict[str, str]:
    """{'memory' | 'unified': directory of this process's cgroup in that hierarchy}."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else ["unified"]:
                own[c] = path
    dirs = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, (fstype, _, superopts) = left.split(), right.split()[:3]
            root, point = fields[3], fields[4]
            names = ["unified"] if fstype == "cgroup2" else superopts.split(",") if fstype == "cgroup" else []
            for name in names:
                path = own.get(name)
                if name in ("memory", "unified") and name not in dirs and path is not None:
                    rel = os.path.relpath(path, root)
                    if not rel.startswith(".."):
                        dirs[name] = os.path.normpath(os.path.join(point, rel))
    return dirs


def _probe(parent: str, control_file: str) -> bool:
    """Whether a child cgroup with ``control_file`` can be made under ``parent``; removes stale ones."""
    try:
        for name in os.listdir(parent):  # left by parents that were killed
            pid = name[len(_CG_PREFIX) :].split("-")[0]
            if name.startswith(_CG_PREFIX) and pid.isdigit() and not _pid_alive(int(pid)):
                try:
                    os.rmdir(os.path.join(parent, name))
                except OSError:
                    pass
        probe = os.path.join(parent, f"{_CG_PREFIX}{os.getpid()}-probe")
        os.mkdir(probe)
        try:
            return os.path.exists(os.path.join(probe, control_file))
        finally:
            os.rmdir(probe)
    except OSError:
        return False


_probe_lock = threading.Lock()


@lru_cache(maxsize=None)
def cgroup_parents() -> tuple[str, tuple[str, ...]]:
    """('v1' | 'v2', (directory,)) under which per-run cgroups go (the memory hierarchy), or ('', ()).

    No pids cgroup: RLIMIT_NPROC of the run's dedicated uid already caps its processes, and zombies
    that init has not reaped yet would still count in a reused cgroup."""
    if os.geteuid() != 0 or not os.path.exists("/proc/self/cgroup"):
        return "", ()
    with _probe_lock:  # a Pool's first runs ask at once; their probes must not collide
        return _find_cgroup_parents()


def _find_cgroup_parents() -> tuple[str, tuple[str, ...]]:
    try:
        dirs = _own_cgroup_dirs()
    except (OSError, ValueError):
        return "", ()
    if "memory" in dirs and _probe(dirs["memory"], "memory.limit_in_bytes"):
        return "v1", (dirs["memory"],)
    unified = dirs.get("unified")
    if unified:
        try:
            if "memory" in _read(os.path.join(unified, "cgroup.controllers")).split():
                enabled = _read(os.path.join(unified, "cgroup.subtree_control")).split()
                if "memory" not in enabled:  # only possible where the own cgroup holds no process (root)
                    _write(os.path.join(unified, "cgroup.subtree_control"), "+memory")
                if _probe(unified, "memory.max"):
                    return "v2", (unified,)
        except OSError:
            pass
    return "", ()


def memory_containment() -> str:
    """How ``Limits.memory_mb`` binds here: 'cgroup v1' / 'cgroup v2' (the run as a whole), 'rlimit'
    (processes x address space, see ``Limits.fallback_processes``) or 'per-process' (not root)."""
    if os.geteuid() != 0:
        return "per-process"
    version, _ = cgroup_parents()
    return f"cgroup {version}" if version else "rlimit"


class Cgroup:
    """One run's cgroup (a directory per hierarchy); reused by later runs once emptied."""

    def __init__(self, version: str, dirs: list[str]):
        self.version, self.dirs = version, dirs
        self.name = os.path.basename(dirs[0]) if dirs else ""
        self.procs = [os.path.join(d, "cgroup.procs") for d in dirs]
        self.settings: int | None = None
        self.ooms = 0

    def configure(self, memory: int) -> None:
        if self.settings == memory:
            return
        self.settings = None
        mem = self.dirs[0]
        if self.version == "v1":
            files = [os.path.join(mem, "memory.limit_in_bytes")]
            if os.path.exists(os.path.join(mem, "memory.memsw.limit_in_bytes")):  # swap accounting
                files.append(os.path.join(mem, "memory.memsw.limit_in_bytes"))
            try:
                for path in files:
                    _write(path, memory)
            except OSError:  # raising memory above memsw (or lowering memsw below memory): other order
                for path in reversed(files):
                    _write(path, memory)
        else:
            _write(os.path.join(mem, "memory.max"), memory)
            if os.path.exists(os.path.join(mem, "memory.swap.max")):
                _write(os.path.join(mem, "memory.swap.max"), 0)
        self.settings = memory

    def join(self, pid: int) -> None:
        """Move process ``pid`` into this cgroup (in every hierarchy)."""
        for path in self.procs:
            _write(path, pid)

    def oom_kills(self) -> int:
        """OOM kills in this cgroup since the last call."""
        name = "memory.oom_control" if self.version == "v1" else "memory.events"
        try:
            fields = dict(line.split() for line in _read(os.path.join(self.dirs[0], name)).splitlines())
            total = int(fields.get("oom_kill", 0))
        except (OSError, ValueError):
            return 0
        new, self.ooms = total - self.ooms, total
        return new

    def kill(self) -> bool:
        """SIGKILL everything in the cgroup until it is empty; False if it would not empty."""
        for _ in range(200):
            pids = set()
            for path in self.procs:
                pids.update(int(p) for p in _read(path).split())
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.002)
        return False

    def remove(self) -> None:
        for d in self.dirs:
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last killed processes exit
                    time.sleep(0.01)


_cg_lock = threading.Lock()
_cg_owner: int | None = None  # the pid that made the cgroups below (a forked child starts its own)
IDLE: list[Cgroup] = []  # emptied cgroups of this process, ready for the next run
ALL: list[Cgroup] = []  # every cgroup this process made (removed at exit)
_cg_counter = itertools.count()


def acquire(memory_mb: int, version: str, parents: tuple[str, ...]) -> Cgroup | None:
    """An empty cgroup of this process limited to ``memory_mb``, or None where none can be made.

    ``version, parents``: :func:`cgroup_parents`."""
    global _cg_owner
    if not parents:
        return None
    with _cg_lock:
        if _cg_owner != os.getpid():
            if _cg_owner is None:
                atexit.register(remove_all)
            _cg_owner = os.getpid()
            IDLE.clear()
            ALL.clear()
        cg = IDLE.pop() if IDLE else None
        n = next(_cg_counter)
    if cg is None:
        name = f"{_CG_PREFIX}{os.getpid()}-{n}"
        made = []
        try:
            for parent in parents:
                made.append(os.path.join(parent, name))
                os.mkdir(made[-1])
        except OSError:
            Cgroup(version, made[:-1]).remove()
            return None
        cg = Cgroup(version, made)
        with _cg_lock:
            ALL.append(cg)
    try:
        cg.configure(memory_mb << 20)
    except OSError:
        release(cg, reuse=False)
        return None
    return cg


def release(cg: Cgroup, reuse: bool = True) -> None:
    """Hand ``cg`` back for the next run (``reuse``: it is empty), else remove it."""
    with _cg_lock:
        if _cg_owner == os.getpid() and reuse:
            IDLE.append(cg)
            return
        if cg in ALL:
            ALL.remove(cg)
    cg.remove()


def remove_all() -> None:
    """Kill what is left in this process's cgroups and remove them (at exit)."""
    if _cg_owner != os.getpid():
        return
    with _cg_lock:
        groups = list(ALL)
        ALL.clear()
        IDLE.clear()
    for cg in groups:
        try:
            cg.kill()
        except OSError:
            pass
        cg.remove()
