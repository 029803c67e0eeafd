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

**Memory.** As root, each run gets its own memory cgroup when one can be created: v1 (the ``memory``
hierarchy) or v2 (``unified`` with the memory controller enabled), nested under the parent's own
cgroup, so the parent's limits still bind. ``memory.limit_in_bytes`` (and ``memsw``) on v1 or
``memory.max`` (and ``memory.swap.max = 0``) on v2 is ``memory_mb`` for all processes of the run
together, tmpfs pages (/tmp, shared memory) and kernel memory included. The parent moves the launcher
into it while the interpreter starts, and the launcher waits until it is in before any program code
runs. Every process keeps ``RLIMIT_AS = memory_mb`` too, so one oversized allocation still raises
MemoryError; exceeding the run's limit with many processes gets one of them OOM-killed
(``killed_by='memory'`` when the run fails). Processes stay capped by ``RLIMIT_NPROC`` of the dedicated
uid (``max_processes``). The cgroups are reused between runs and removed when the parent exits; after
a run, every process in the cgroup is killed. Where no cgroup can be created (no memory controller,
read-only cgroupfs, v2 without delegation), the limit becomes *processes x address space*: the run may hold
``n = min(max_processes, fallback_processes)`` (4 by default) processes and threads (``RLIMIT_NPROC``
of its dedicated uid), each with ``memory_mb // n`` of address space, so that together they stay within
``memory_mb`` (files in the private tmpfs mounts add at most ``7 x max_file_mb``).
:func:`memory_containment` tells which applies (``'cgroup v1'``, ``'cgroup v2'``, ``'rlimit'``, or
``'per-process'`` when not root).

A guard replacing ``socket`` connects with a function raising OSError (an import hook, so it costs
nothing to programs that do not import socket) is added in every case; it is defence in depth only
(``_socket`` bypasses it). Where the parent is not root, timeout, limits, environment and output cap
still hold, but the network, IPC and the file system are not isolated, memory is limited per process
only and a same-uid child *can* signal the parent; as root where unshare(2) fails (e.g. a container
without CAP_SYS_ADMIN), uid, memory and limits hold but the namespaces are missing:
:func:`network_isolated` and :func:`memory_containment` tell which case applies. Not contained in any
case: the program shares the CPUs with training (up to its timeout).

The setup runs in the child as a short launcher (``_LAUNCHER``) before the program is compiled in the
same interpreter, rather than in a ``preexec_fn``, which is unsafe in a multi-threaded parent. As root
the interpreter must be usable by the sandbox uid: ``sys.executable`` (resolved, so that a venv's
link under the hidden checkout is not needed) if it is, else /usr/bin/python3.
"""

from __future__ import annotations

import atexit
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

__all__ = ["Limits", "Result", "run", "Pool", "run_tests", "network_isolated", "memory_containment"]

# Dedicated uids: base + (parent pid % 65536) * 4096 + slot, unused by any account on the machine.
# Slots rotate, so a uid is reused only 4096 runs later: killed processes that init has not reaped
# yet (zombies still count towards RLIMIT_NPROC) are long gone by then.
_UID_BASE = 1_500_000_000
_uid_lock = threading.Lock()
_uid_counter = itertools.count()
_slots_in_use: set[int] = set()

# Runs in the child before the program (as root when the parent is root): cgroup, namespaces, minimal
# root file system, limits, privilege drop, socket guard; then it compiles and executes prog.py in
# __main__ in place. argv: uid file_mb memory_mb rlimits... cgroup_name:hierarchies (or ':').
_LAUNCHER = r'''
def _setup():
    import os, resource, sys
    uid, file_mb, memory_mb, *limits = map(int, sys.argv[1:-1])
    with open("prog.py", "rb") as f:
        source = f.read()
    sys.executable = os.path.realpath(sys.executable)  # e.g. a venv's link, hidden below

    def die(what, err):
        os.write(2, ("collab sandbox: setup failed: %s: %s\n" % (what, err)).encode())
        os._exit(125)

    if uid >= 0:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)

        def mount(src, dst, fstype, flags, data=None):
            enc = lambda s: None if s is None else s.encode()
            if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
                err = ctypes.get_errno()
                raise OSError(err, "mount %s: %s" % (dst, os.strerror(err)))

        def jail():  # pivot_root into a fresh tmpfs holding what the program may see
            RO, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, MOVE, REC = 1, 2, 4, 8, 32, 4096, 8192, 16384
            workdir = new = os.getcwd()
            mount("tmpfs", new, "tmpfs", NOSUID | NODEV, "size=1m,mode=755")
            bound, masked = [], []

            def mkpoint(path, isdir):
                if isdir:
                    os.makedirs(new + path, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(new + path), exist_ok=True)
                    open(new + path, "a").close()

            def under(path, dirs):
                return any(path == d or path.startswith(d + "/") for d in dirs)

            def expose(path):
                if under(path, bound) and not under(path, masked) or os.path.lexists(new + path):
                    return
                if os.path.islink(path):
                    mkpoint(os.path.dirname(path), True)
                    os.symlink(os.readlink(path), new + path)
                elif os.path.exists(path):
                    mkpoint(path, os.path.isdir(path))
                    mount(path, new + path, None, BIND | REC)
                    mount(None, new + path, None, REMOUNT | BIND | RO | NOSUID | NODEV)
                    bound.append(path)

            for d in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
                expose(d)
            if os.path.isdir("/usr/local"):  # local installs and tools: hidden, but for the interpreter's files
                mount("tmpfs", new + "/usr/local", "tmpfs", NOSUID | NODEV, "size=64k,mode=755")
                masked.append("/usr/local")
            expose(sys.executable)
            for p in sys.path:
                expose(os.path.realpath(p))
            with open("/proc/self/maps") as f:  # libpython and friends, wherever they are
                for lib in {line.split(None, 5)[5].strip() for line in f if "/" in line}:
                    if lib.startswith("/") and not lib.endswith("(deleted)"):
                        expose(os.path.realpath(lib))
            for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "alternatives",
                         "hosts", "nsswitch.conf", "os-release", "mime.types"):
                expose("/etc/" + name)
            mkpoint("/etc", True)
            with open(new + "/etc/passwd", "w") as f:
                f.write("root:x:0:0::/:/usr/sbin/nologin\n")
                f.write("sandbox:x:%d:%d::%s:/usr/sbin/nologin\n" % (uid, uid, workdir))
            with open(new + "/etc/group", "w") as f:
                f.write("root:x:0:\nsandbox:x:%d:\n" % uid)
            mkpoint("/dev", True)
            mount("tmpfs", new + "/dev", "tmpfs", NOSUID | NOEXEC, "size=64k,mode=755")
            for name in ("null", "zero", "full", "random", "urandom"):
                mkpoint("/dev/" + name, False)
                mount("/dev/" + name, new + "/dev/" + name, None, BIND)
            for i, name in enumerate(("stdin", "stdout", "stderr")):
                os.symlink("/proc/self/fd/%d" % i, new + "/dev/" + name)
            os.symlink("/proc/self/fd", new + "/dev/fd")
            for d in ("/tmp", "/var/tmp", "/dev/shm"):
                mkpoint(d, True)
                mount("tmpfs", new + d, "tmpfs", NOSUID | NODEV, "size=%dm,mode=1777" % file_mb)
            mkpoint(workdir, True)
            opts = "size=%dm,mode=700,uid=%d,gid=%d" % (4 * file_mb, uid, uid)
            mount("tmpfs", new + workdir, "tmpfs", NOSUID | NODEV, opts)
            mkpoint("/proc", True)
            release = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
            # per-mount proc options since 5.8; before, hidepid would change the host's /proc as well
            opts = "hidepid=invisible" if release >= (5, 8) else None
            mount("proc", new + "/proc", "proc", NOSUID | NODEV | NOEXEC, opts)
            os.chdir(new)
            nr = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine)  # SYS_pivot_root
            if nr is not None and libc.syscall(nr, b".", b".") == 0:
                if libc.umount2(b".", 2) != 0:  # MNT_DETACH the old root, stacked over the new one
                    raise OSError(ctypes.get_errno(), "umount of the old root")
            else:  # no pivot_root (e.g. the root is initramfs): move the new root over / and chroot
                mount(".", "/", None, MOVE)
                os.chroot(".")
            os.chdir("/")
            mount(None, "/", None, REMOUNT | BIND | RO | NOSUID | NODEV)
            os.chdir(workdir)
            with open("prog.py", "wb") as f:  # for tracebacks
                f.write(source)

        libc.unshare(0x40000000)  # CLONE_NEWNET: fresh namespace, only a loopback that is down
        if libc.unshare(0x08000000) == 0:  # CLONE_NEWIPC: SysV objects die with the run
            for name, value in (("shmall", (memory_mb << 20) // resource.getpagesize()), ("msgmni", 16)):
                try:
                    with open("/proc/sys/kernel/" + name, "w") as f:
                        f.write(str(value))
                except OSError:
                    pass
        # CLONE_NEWNS, then MS_REC|MS_PRIVATE so that no mount propagates out of the namespace
        if libc.unshare(0x00020000) == 0 and libc.mount(b"none", b"/", None, 16384 | 262144, None) == 0:
            try:
                jail()
            except OSError as e:
                die("file system", e)
    cgroup, _, hierarchies = sys.argv[-1].rpartition(":")
    if cgroup:  # the parent moves us into the run's cgroups meanwhile; wait until it has
        import time
        for _ in range(10000):
            with open("/proc/self/cgroup") as f:
                if sum(line.rstrip("\n").endswith("/" + cgroup) for line in f) >= int(hierarchies):
                    break
            time.sleep(0.001)
        else:
            die("cgroup", "not joined")
    for i, name in enumerate(("CORE", "CPU", "AS", "FSIZE", "NPROC", "NOFILE")):
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
    python: str | None = None  # default: see _interpreter()
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


def _world_executable(path: str) -> bool:
    """True if every directory up to ``path`` is world-searchable and the file world-executable."""
    path = os.path.realpath(path)
    parts = [path] + [os.path.dirname(path)]
    while parts[-1] != "/":
        parts.append(os.path.dirname(parts[-1]))
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in parts)


@lru_cache(maxsize=None)
def _interpreter() -> str:
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
    return subprocess.run([_interpreter(), "-I", "-S", "-c", probe], env={}, timeout=30).returncode == 0


# ---- per-run cgroups ----------------------------------------------------------------------------------

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
            pid = name[len(_CG_PREFIX):].split("-")[0]
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
def _cgroup_parents() -> tuple[str, tuple[str, ...]]:
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
    version, _ = _cgroup_parents()
    return f"cgroup {version}" if version else "rlimit"


class _Cgroup:
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
_cg_idle: list[_Cgroup] = []
_cg_all: list[_Cgroup] = []
_cg_counter = itertools.count()


def _acquire_cgroup(limits: Limits) -> _Cgroup | None:
    """An empty cgroup of this process set to ``limits``, or None where cgroups are unavailable."""
    global _cg_owner
    version, parents = _cgroup_parents()
    if not parents:
        return None
    with _cg_lock:
        if _cg_owner != os.getpid():
            if _cg_owner is None:
                atexit.register(_remove_cgroups)
            _cg_owner = os.getpid()
            _cg_idle.clear()
            _cg_all.clear()
        cg = _cg_idle.pop() if _cg_idle else None
        n = next(_cg_counter)
    if cg is None:
        name = f"{_CG_PREFIX}{os.getpid()}-{n}"
        made = []
        try:
            for parent in parents:
                made.append(os.path.join(parent, name))
                os.mkdir(made[-1])
        except OSError:
            _Cgroup(version, made[:-1]).remove()
            return None
        cg = _Cgroup(version, made)
        with _cg_lock:
            _cg_all.append(cg)
    try:
        cg.configure(limits.memory_mb << 20)
    except OSError:
        _release_cgroup(cg, reuse=False)
        return None
    return cg


def _release_cgroup(cg: _Cgroup, reuse: bool = True) -> None:
    with _cg_lock:
        if _cg_owner == os.getpid() and reuse:
            _cg_idle.append(cg)
            return
        if cg in _cg_all:
            _cg_all.remove(cg)
    cg.remove()


def _remove_cgroups() -> None:
    if _cg_owner != os.getpid():
        return
    with _cg_lock:
        groups = list(_cg_all)
        _cg_all.clear()
        _cg_idle.clear()
    for cg in groups:
        try:
            cg.kill()
        except OSError:
            pass
        cg.remove()


# ---- runs ---------------------------------------------------------------------------------------------


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


def _rlimits(limits: Limits, uid: int | None, cgroup: _Cgroup | None) -> list[int]:
    """(soft, hard) pairs of RLIMIT_CORE, CPU, AS, FSIZE, NPROC, NOFILE."""
    cpu = limits.cpu_s if limits.cpu_s is not None else math.ceil(limits.timeout_s) + 1
    mem, processes = limits.memory_mb << 20, limits.max_processes
    if uid is not None and cgroup is None:  # no cgroup: processes x address space within memory_mb
        processes = max(1, min(processes, limits.fallback_processes))
        mem //= processes
    fsize, files = limits.max_file_mb << 20, limits.max_open_files
    return [0, 0, cpu, cpu + 1, mem, mem, fsize, fsize, processes, processes, files, files]


def run(code: str, stdin: str = "", limits: Limits | None = None) -> Result:
    """Run ``code`` as a Python program in a sandboxed child process and return its :class:`Result`."""
    limits = limits or Limits()
    start = time.monotonic()
    deadline = start + limits.timeout_s
    workdir = tempfile.mkdtemp(prefix="collab-sandbox-")  # mode 0700
    proc = uid = slot = cgroup = None
    bufs = {"stdout": bytearray(), "stderr": bytearray()}
    timed_out = truncated = setup_failed = False
    ooms = 0
    try:
        if os.geteuid() == 0:
            uid, slot = _claim_uid()
            cgroup = _acquire_cgroup(limits)
        with open(os.path.join(workdir, "prog.py"), "w", encoding="utf-8") as f:
            f.write(code)
        if uid is not None:
            os.chown(workdir, uid, uid)
        args = [-1 if uid is None else uid, limits.max_file_mb, limits.memory_mb, *_rlimits(limits, uid, cgroup)]
        args.append(f"{cgroup.name}:{len(cgroup.procs)}" if cgroup is not None else ":")
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        python = limits.python or _interpreter()
        proc = subprocess.Popen(
            [python, "-I", "-S", "-B", "-c", _LAUNCHER, *map(str, args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=workdir, env=env, start_new_session=True, close_fds=True,
        )
        if cgroup is not None:  # while the interpreter starts (moving a process waits for an RCU grace period)
            try:
                for path in cgroup.procs:
                    _write(path, proc.pid)
            except OSError:
                setup_failed = True
                _killpg(proc.pid)
        threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True).start()
        timed_out, truncated = _collect(proc, bufs, deadline, limits.max_output_bytes)
        while not (timed_out or truncated or _exited(proc.pid)):  # closed its output but runs on?
            timed_out = time.monotonic() > deadline
            time.sleep(0.002)
    finally:
        if proc is not None:
            _killpg(proc.pid)  # the leader is not reaped yet, so its group id cannot have been reused
        reuse = True
        if cgroup is not None:  # every process of the run is in it (the launcher joins it first)
            try:
                reuse = cgroup.kill()
            except OSError:
                reuse = False
            if not reuse:
                _kill_uid(uid)
            ooms = cgroup.oom_kills()
        elif uid is not None:
            _kill_uid(uid)
        if proc is not None:
            proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                pipe.close()
        shutil.rmtree(workdir, ignore_errors=True)
        if cgroup is not None:
            _release_cgroup(cgroup, reuse)
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
    elif rc != 0 and (ooms or "MemoryError" in stderr[-2000:]):
        killed_by = "memory"
    elif setup_failed or rc == 125 and stderr.startswith("collab sandbox: setup failed"):
        killed_by = "setup"
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
