"""collab.sandbox against known escapes, run as root (as CI runs): each contained and leaving nothing.

Every test asserts containment and then that no process, socket or SysV shared-memory segment of the
sandbox is left (``leftovers()``: /proc, /proc/net, /proc/sysvipc/shm, ``ipcs -m`` and the run's cgroup).
The only sockets used are UNIX sockets the test creates itself (a path under /run, an abstract name).
Memory tests allocate modestly (a 256 MB run limit, 4 forks x 100 MB).
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from collab import sandbox
from collab.sandbox import Limits, Pool, run
from collab.sandbox.processes import own_uids
from tests.support.sandbox_procs import sandbox_pids

ROOT = os.geteuid() == 0
ISOLATED = ROOT and sandbox.network_isolated()
CGROUP = ROOT and sandbox.memory_containment().startswith("cgroup")
needs_root = pytest.mark.skipif(not ROOT, reason="the dedicated sandbox uid (signals, ptrace, cleanup) needs root")
needs_ns = pytest.mark.skipif(not ISOLATED, reason="needs root and unshare(2) (network, IPC, mount namespaces)")
FAST = Limits(timeout_s=3.0, max_processes=16)
CHECKOUT = Path(__file__).resolve().parents[2]


def _sandbox_uid(uid: int) -> bool:
    """A uid of this process's sandbox runs (not another pytest worker's)."""
    return uid in own_uids()


def leftovers() -> dict[str, list]:
    """Processes (not zombies), sockets and shared-memory segments of this process's sandbox uids; {} if none."""
    found: dict[str, list] = {"processes": sandbox_pids(), "sockets": [], "shm": [], "ipcs": [], "cgroup": []}
    for name in ("tcp", "tcp6", "udp", "udp6", "raw", "raw6"):
        try:
            with open(f"/proc/net/{name}") as f:
                rows = [line.split() for line in f][1:]
        except OSError:
            continue
        found["sockets"] += [(name, row[1]) for row in rows if len(row) > 7 and _sandbox_uid(int(row[7]))]
    with open("/proc/sysvipc/shm") as f:
        rows = [line.split() for line in f][1:]
    found["shm"] = [row[1] for row in rows if _sandbox_uid(int(row[7])) or _sandbox_uid(int(row[9]))]
    if shutil.which("ipcs"):  # owner is numeric: the sandbox uids have no passwd entry
        out = subprocess.run(["ipcs", "-m"], capture_output=True, text=True).stdout
        found["ipcs"] = [
            line for line in out.splitlines() if any(t.isdigit() and _sandbox_uid(int(t)) for t in line.split())
        ]
    for cg in list(sandbox._cg_all):
        found["cgroup"] += [p for path in cg.procs if os.path.exists(path) for p in open(path).read().split()]
    return {k: v for k, v in found.items() if v}


@pytest.fixture
def guard():
    """The test process is unharmed and nothing of the sandbox survives the test."""
    before = (os.getpid(), os.getpgrp(), len(os.listdir("/proc/self/fd")))
    yield
    assert (os.getpid(), os.getpgrp(), len(os.listdir("/proc/self/fd"))) == before
    assert leftovers() == {}


class Listener:
    """A UNIX stream listener of the test (path or abstract address) recording what it receives."""

    def __init__(self, address: str):
        self.address, self.received = address, []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(address)
        if not address.startswith("\0"):
            os.chmod(address, 0o777)  # anyone may connect: the world-writable socket an escape would look for
        self.sock.listen()
        self.sock.settimeout(0.1)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    self.received.append(conn.recv(1024) or b"<connected>")
                except OSError:
                    self.received.append(b"<connected>")

    def reachable_from_here(self) -> bool:
        """Control: an unsandboxed client gets through (then forgets what it sent)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(self.address)
            c.sendall(b"control")
        for _ in range(100):
            if self.received:
                break
            time.sleep(0.01)
        ok = self.received == [b"control"]
        self.received.clear()
        return ok

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()
        if not self.address.startswith("\0"):
            os.unlink(self.address)


def connect_code(address: str) -> str:
    """A program talking to ``address`` through ``_socket``, bypassing the socket module's guard."""
    return (
        "import _socket\n"
        "s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)\n"
        f"s.connect({address!r})\n"
        "s.send(b'leak')\n"
        "print('connected')\n"
    )


# ---- UNIX sockets -------------------------------------------------------------------------------------


@needs_ns
def test_host_unix_socket_by_path_is_absent(guard):
    listener = Listener(f"/run/collab-escape-{os.getpid()}.sock")  # a 0777 socket under /run
    try:
        assert listener.reachable_from_here()
        r = run(connect_code(listener.address), limits=FAST)
        time.sleep(0.2)
        assert not r.ok and "connected" not in r.stdout and "FileNotFoundError" in r.stderr, r
        assert listener.received == []
    finally:
        listener.close()
    assert leftovers() == {}


@needs_ns
def test_host_abstract_unix_socket_is_unreachable(guard):
    listener = Listener(f"\0collab-escape-{os.getpid()}")  # abstract: lives in the network namespace
    try:
        assert listener.reachable_from_here()
        r = run(connect_code(listener.address), limits=FAST)
        time.sleep(0.2)
        assert not r.ok and "connected" not in r.stdout and "ConnectionRefusedError" in r.stderr, r
        assert listener.received == []
    finally:
        listener.close()
    assert leftovers() == {}


# ---- memory of the whole run --------------------------------------------------------------------------

FORKS = """
import os, select, time
r, w = os.pipe()
kids = []
for i in range(4):
    try:
        pid = os.fork()
    except OSError:  # without a cgroup: at most fallback_processes
        break
    if pid == 0:
        os.close(r)
        try:
            block = b"x" * (100 << 20)  # 100 MB, every page touched
            os.write(w, b"1")
        except MemoryError:
            os.write(w, b"0")
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
os.close(w)
got, deadline = b"", time.monotonic() + 2.5
while len(got) < 4 and time.monotonic() < deadline:
    if select.select([r], [], [], 0.1)[0]:
        got += os.read(r, 4)
time.sleep(0.3)
alive = [pid for pid in kids if os.waitpid(pid, os.WNOHANG) == (0, 0)]
print(got.count(b"1"), len(alive))
"""


TWO_X_150 = """
import os, sys, time
pid = os.fork()
block = b"x" * (150 << 20)
if pid == 0:
    time.sleep(1)
    os._exit(0)
sys.exit(0 if os.waitpid(pid, 0)[1] == 0 else 1)
"""


def _peak_rss_mb(stop: threading.Event, peak: list) -> None:
    """Largest sum of anonymous and shared-memory RSS over the sandbox uids' processes, sampled."""
    while not stop.is_set():
        total = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/status") as f:
                    fields = dict(line.split(":", 1) for line in f)
                if _sandbox_uid(int(fields["Uid"].split()[0])):
                    total += sum(int(fields.get(k, "0 kB").split()[0]) for k in ("RssAnon", "RssShmem"))
            except (OSError, KeyError, ValueError):
                pass
        peak[0] = max(peak[0], total >> 10)
        time.sleep(0.05)


@needs_root
@pytest.mark.parametrize("mode", ["cgroup", "rlimit"])
def test_memory_is_limited_per_run(guard, monkeypatch, mode):
    if mode == "cgroup" and not CGROUP:
        pytest.skip(f"no writable memory cgroup here ({sandbox.memory_containment()})")
    if mode == "rlimit":  # as on a machine without a writable cgroup
        monkeypatch.setattr(sandbox, "_cgroup_parents", lambda: ("", ()))
    limits = Limits(timeout_s=6.0, memory_mb=256, max_processes=16)
    stop, peak = threading.Event(), [0]
    sampler = threading.Thread(target=_peak_rss_mb, args=(stop, peak))
    sampler.start()
    try:
        r = run(FORKS, limits=limits)
    finally:
        stop.set()
        sampler.join()
    # 4 x 100 MB would be 400 MB; per-process limits alone let all four through (the escape)
    assert peak[0] < 330, (peak, r)
    if r.ok:  # children holding 100 MB at the end: alive ones (cgroup), those without MemoryError (rlimit)
        holding = int(r.stdout.split()[1]) if mode == "cgroup" else int(r.stdout.split()[0])
        assert holding <= 2, r
    if mode == "cgroup":  # one process may use most of the run's memory: the limit is not split
        one = run("block = b'x' * (180 << 20)\nprint(len(block) >> 20)\n", limits=limits)
        assert one.ok and one.stdout == "180\n", one
        over = run(TWO_X_150, limits=limits)  # 2 x 150 MB: the OOM killer ends one of them
        assert not over.ok and over.killed_by == "memory", over
    else:  # processes x address space: 4 x 64 MB
        one = run("block = b'x' * (100 << 20)\n", limits=limits)
        assert not one.ok and one.killed_by == "memory", one
    assert leftovers() == {}


# ---- SysV shared memory -------------------------------------------------------------------------------

SHM = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget(0x5EED17, 64 << 20, 0o1666)  # IPC_CREAT | 0666, never IPC_RMID
assert shmid >= 0, os.strerror(ctypes.get_errno())
addr = libc.shmat(shmid, None, 0)
ctypes.memset(addr, 1, 64 << 20)  # 64 MB resident
libc.shmdt(ctypes.c_void_p(addr))
print(shmid)
"""

SHM_FIND = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(libc.shmget(0x5EED17, 0, 0), ctypes.get_errno() == 2)
"""


@needs_ns
def test_sysv_shared_memory_dies_with_the_run(guard):
    r = run(SHM, limits=FAST)
    assert r.ok, r
    later = run(SHM_FIND, limits=FAST)  # the next run (another IPC namespace) does not see it ...
    assert later.ok and later.stdout == "-1 True\n", later
    with open("/proc/sysvipc/shm") as f:  # ... nor does the host
        assert not any(line.split()[0] == str(0x5EED17) for line in f)
    if CGROUP:  # and its 64 MB are freed (charged to the run's cgroup until the namespace goes)
        cg = sandbox._cg_idle[-1]
        name = "memory.usage_in_bytes" if cg.version == "v1" else "memory.current"
        for _ in range(100):
            usage = int(open(os.path.join(cg.dirs[0], name)).read())
            if usage < 32 << 20:
                break
            time.sleep(0.02)
        assert usage < 32 << 20, usage
    assert leftovers() == {}


# ---- descriptors --------------------------------------------------------------------------------------

FDS = """
import os, resource
def exhaust(opener):
    fds = []
    try:
        while True:
            fds.append(opener())
    except OSError as e:
        return len(fds), e.errno
    finally:
        for fd in fds:
            os.close(fd) if isinstance(fd, int) else [os.close(x) for x in fd]
print(resource.getrlimit(resource.RLIMIT_NOFILE))
print(exhaust(lambda: os.open("/dev/null", os.O_RDONLY)))
print(exhaust(os.pipe), flush=True)
pid = os.fork()
if pid == 0:
    print(exhaust(lambda: os.open("/dev/null", os.O_RDONLY)), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_fd_exhaustion_is_contained(guard):
    r = run(FDS, limits=FAST)
    assert r.ok, r
    limit, files, pipes, child = r.stdout.splitlines()
    assert limit == "(256, 256)"
    for (count, err), fds_each in ((eval(files), 1), (eval(pipes), 2), (eval(child), 1)):
        assert 240 < count * fds_each <= 256 and err == errno.EMFILE, r.stdout
    assert open(os.devnull).close() is None  # the test process still opens files
    assert leftovers() == {}


# ---- processes: daemons, kill(-1), ptrace -------------------------------------------------------------

DAEMON = """
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        print(os.getpid(), flush=True)
        while True:
            time.sleep(0.01)
    os._exit(0)
time.sleep(0.3)
print('main done')
"""


@needs_root
def test_setsid_daemon_is_killed(guard):
    r = run(DAEMON, limits=FAST)
    assert r.ok and r.stdout.endswith("main done\n") and r.seconds < FAST.timeout_s, r
    daemon = int(r.stdout.split()[0])
    assert daemon not in leftovers().get("processes", [])  # gone, or a zombie awaiting init
    assert leftovers() == {}


KILL_ALL = """
import os, signal, time
end = time.monotonic() + 1.0
n = 0
while time.monotonic() < end:
    try:
        os.kill(-1, signal.SIGKILL)
        n += 1
    except OSError:
        pass
    time.sleep(0.01)
print('attacker survived', n)
"""


@needs_root
def test_kill_minus_one_reaches_only_the_run(guard):
    bystander = subprocess.Popen(["sleep", "30"], user=65534)  # another unprivileged uid (nobody)
    try:
        victim = "import time\ntime.sleep(1.5)\nprint('victim alive')\n"
        attack, other = Pool(workers=2, limits=FAST).map([KILL_ALL, victim])
        assert attack.stdout.startswith("attacker survived"), attack
        assert other.ok and other.stdout == "victim alive\n", other  # a concurrent run is untouched
        assert bystander.poll() is None  # so is a process of another uid, and the test process
    finally:
        bystander.kill()
        bystander.wait()
    assert leftovers() == {}


PTRACE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
for request in (16, 0x4206):  # PTRACE_ATTACH, PTRACE_SEIZE
    for pid in (os.getppid(), TARGET):
        rc = libc.ptrace(request, pid, None, None)
        print(request, pid == TARGET, rc, ctypes.get_errno())
"""


@needs_root
def test_ptrace_of_the_parent_fails(guard):
    target = subprocess.Popen(["sleep", "30"], user=65534)  # and of a process of another uid
    try:
        r = run(PTRACE.replace("TARGET", str(target.pid)), limits=FAST)
        assert r.ok, r
        rows = [line.split() for line in r.stdout.splitlines()]
        assert len(rows) == 4 and all(rc == "-1" and int(err) in (errno.EPERM, errno.ESRCH) for *_, rc, err in rows), r
        with open("/proc/self/status") as f:
            assert "TracerPid:\t0\n" in f.read()
        assert target.poll() is None
        with open(f"/proc/{target.pid}/status") as f:
            assert "TracerPid:\t0\n" in f.read()
    finally:
        target.kill()
        target.wait()
    assert leftovers() == {}


# ---- what the program may read ------------------------------------------------------------------------


@needs_ns
def test_checkout_home_and_private_files_are_absent(guard):
    paths = [
        str(CHECKOUT),
        str(CHECKOUT / "pyproject.toml"),
        __file__,
        sys.prefix,
        f"{sys.prefix}/pyvenv.cfg",
        "/work",
        "/root",
        "/home",
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/hostname",
        "/run",
        "/opt",
        "/mnt",
        "/var/lib",
        "/sys",
        "/proc/1/environ",
        f"/proc/{os.getpid()}/cmdline",
    ]
    paths = [p for p in paths if os.path.exists(p)]
    code = (
        "import os\n"
        f"for p in {paths!r}:\n"
        "    try:\n"
        "        os.listdir(p) if os.path.isdir(p) else open(p, 'rb').read(1)\n"
        "        print('READ', p)\n"
        "    except OSError as e:\n"
        "        print(type(e).__name__, p)\n"
    )
    r = run(code, limits=FAST)
    assert r.ok, r
    assert r.stdout.splitlines() == [f"FileNotFoundError {p}" for p in paths]
    assert leftovers() == {}


@needs_ns
def test_other_runs_directories_are_absent(guard):
    writer = "import os, time\nopen('secret', 'w').write('s3cret')\nprint(os.getcwd())\ntime.sleep(1.0)\n"
    reader = (
        "import glob, os, time\n"
        "time.sleep(0.5)\n"
        "print(glob.glob('/tmp/*') in ([], [os.getcwd()]), glob.glob('/tmp/*/secret'))\n"
    )
    w, r = Pool(workers=2, limits=FAST).map([writer, reader])
    assert w.ok and r.ok and r.stdout == "True []\n", (w, r)
    assert leftovers() == {}


@needs_ns
@pytest.mark.parametrize("python", [None, sys.executable], ids=["default", "venv-under-checkout"])
def test_stdlib_and_interpreter_work_in_the_jail(guard, python):
    # the venv's interpreter lives under the (hidden) checkout: its resolved files are exposed, nothing else
    code = (
        "import ctypes, decimal, json, multiprocessing, os, sqlite3, subprocess, sys, time, zlib\n"
        f"assert not os.path.exists({str(CHECKOUT)!r})\n"
        "out = subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True).stdout\n"
        "with multiprocessing.Pool(2) as pool:\n"
        "    squares = pool.map(abs, [-1, -2, -3])\n"
        "db = sqlite3.connect(':memory:')\n"
        "open('/tmp/x', 'w').write('tmp ok')\n"
        "home = os.getcwd() == os.environ['HOME']\n"
        "print(out.strip(), squares, db.execute('select 1').fetchone(), open('/tmp/x').read(), home)\n"
    )
    # 6 processes and threads: without a cgroup, that needs fallback_processes >= 6 (then 256 MB each)
    r = run(code, limits=Limits(timeout_s=8.0, max_processes=16, memory_mb=2048, fallback_processes=8, python=python))
    assert r.ok and r.stdout == "42 [1, 2, 3] (1,) tmp ok True\n", r
    assert leftovers() == {}


@needs_ns
@pytest.mark.skipif(
    tuple(map(int, os.uname().release.split("-")[0].split(".")[:2])) < (5, 8),
    reason="per-mount hidepid needs Linux 5.8+",
)
def test_proc_shows_only_the_run(guard):
    code = "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [os.getpid()])\n"
    r = run(code, limits=FAST)
    assert r.ok and r.stdout == "True\n", r
    assert leftovers() == {}
