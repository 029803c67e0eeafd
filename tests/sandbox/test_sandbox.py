"""collab.sandbox: hostile programs fail within timeout + 1 s and leave the test process unharmed."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from collab import sandbox
from collab.sandbox import Limits, Pool, Result, run, run_tests
from tests.support.sandbox_procs import sandbox_pids

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="uid separation (signals, /proc, files) needs a root parent")
FAST = Limits(timeout_s=1.5, max_processes=16)


@pytest.fixture
def parent(tmp_path, monkeypatch):
    """A root-only private dir with a canary file, a secret in the environment; checks both afterwards."""
    monkeypatch.setenv("COLLAB_SECRET", "hunter2")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    canary = private / "canary.txt"
    canary.write_text("untouched")
    canary.chmod(0o600)

    def env():
        return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}

    before = (env(), canary.stat().st_mtime_ns, os.getpid(), os.getpgrp())
    yield canary
    assert env() == before[0]
    assert canary.read_text() == "untouched" and canary.stat().st_mtime_ns == before[1]
    assert (os.getpid(), os.getpgrp()) == before[2:]
    assert sandbox_pids() == []


def hostile(code: str, limits: Limits = FAST) -> Result:
    start = time.monotonic()
    r = run(code, limits=limits)
    elapsed = time.monotonic() - start
    assert not r.ok, r
    assert elapsed < limits.timeout_s + 1.0, (elapsed, r)
    return r


# ---- CPU and time ---------------------------------------------------------------------------------


def test_infinite_loop(parent):
    r = hostile("while True:\n    pass\n")
    assert r.timed_out and r.killed_by == "timeout"


def test_busy_cpu_loop_hits_cpu_limit(parent):
    r = hostile("x = 0\nwhile True:\n    x += 1\n", Limits(timeout_s=3.0, cpu_s=1))
    assert r.killed_by in ("cpu", "timeout", "signal SIGKILL")


def test_sleep_beyond_timeout(parent):
    assert hostile("import time\ntime.sleep(100)\n").timed_out


def test_closes_stdout_and_sleeps(parent):
    assert hostile("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(100)\n").timed_out


# ---- processes --------------------------------------------------------------------------------------


def test_fork_bomb(parent):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    hostile(code, Limits(timeout_s=1.5, max_processes=16))
    assert sandbox_pids() == []


def test_daemonized_grandchild_is_killed(parent):
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(100)\n"
        "    os._exit(0)\n"
        "time.sleep(100)\n"
    )
    assert hostile(code).timed_out
    assert sandbox_pids() == []


def test_daemon_outliving_a_successful_main_is_killed(parent):
    code = (
        "import os, signal, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    while True:\n"
        "        time.sleep(0.01)\n"
        "print('main done')\n"
    )
    start = time.monotonic()
    r = run(code, limits=FAST)  # the main exits 0, so ok; its daemon must not survive or delay it
    assert time.monotonic() - start < FAST.timeout_s + 1.0
    assert r.stdout == "main done\n"
    assert sandbox_pids() == []


def test_fork_ignoring_sigterm(parent):
    code = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "os.fork()\n"
        "while True:\n"
        "    time.sleep(1)\n"
    )
    assert hostile(code).timed_out
    assert sandbox_pids() == []


def test_thread_bomb(parent):
    code = (
        "import threading, time\n"
        "for _ in range(100000):\n"
        "    threading.Thread(target=time.sleep, args=(100,), daemon=True).start()\n"
    )
    hostile(code)


# ---- memory and stack -------------------------------------------------------------------------------


def test_memory_bomb(parent):
    r = hostile("x = bytearray(10 * 1024 ** 3)\n")
    assert r.killed_by == "memory" and "MemoryError" in r.stderr


def test_gradual_memory_bomb(parent):
    # 256 MB steps reach the 1 GB limit in a few allocations; zero-filling them takes time on a loaded
    # machine, so this one gets a longer wall-clock budget than FAST (the memory limit must fire first).
    r = hostile("chunks = []\nwhile True:\n    chunks.append(bytearray(256 * 1024 ** 2))\n", Limits(timeout_s=4.0))
    assert r.killed_by == "memory"


@pytest.mark.parametrize(
    "body",
    [
        "def f(n):\n    return f(n + 1) + 1\nf(0)\n",  # Python frames: RecursionError or the timeout
        "import json\nx = []\nfor _ in range(200_000):\n    x = [x]\njson.dumps(x)\n",  # C stack: SIGSEGV
    ],
    ids=["python", "c-stack"],
)
def test_deep_recursion(parent, body):
    r = hostile("import sys\nsys.setrecursionlimit(10 ** 6)\n" + body)
    assert r.returncode != 0


# ---- exits ------------------------------------------------------------------------------------------


def test_sys_exit(parent):
    r = hostile("import sys\nsys.exit(3)\n")
    assert r.returncode == 3 and not r.timed_out and r.killed_by is None


def test_os_exit(parent):
    assert hostile("import os\nos._exit(7)\n").returncode == 7


# ---- the parent: signals, environment, files --------------------------------------------------------


@needs_root
@pytest.mark.parametrize(
    "call",
    [
        "os.kill(os.getppid(), signal.SIGKILL)",
        "os.kill(os.getppid(), signal.SIGTERM)",
        "os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)",
        "os.kill(-1, signal.SIGKILL); time.sleep(100)",
    ],
)
def test_signals_to_the_parent(parent, call):
    hostile(f"import os, signal, time\n{call}\n")


def test_reads_parent_environment(parent):
    r = hostile("import os, sys\nprint(dict(os.environ))\nsys.exit(0 if 'COLLAB_SECRET' in os.environ else 1)\n")
    assert "hunter2" not in r.stdout and "COLLAB_SECRET" not in r.stdout


@needs_root
def test_reads_parent_proc_environ(parent):
    code = (
        "import os, sys\n"
        "data = open(f'/proc/{os.getppid()}/environ', 'rb').read()\n"
        "sys.exit(0 if b'hunter2' in data else 1)\n"
    )
    r = hostile(code)
    assert "hunter2" not in r.stdout + r.stderr


@needs_root
def test_writes_parent_file(parent):
    r = hostile(f"open({str(parent)!r}, 'w').write('pwned')\n")
    # the parent's /tmp is not even visible in the sandbox's mount namespace; without it: EACCES
    assert "PermissionError" in r.stderr or "FileNotFoundError" in r.stderr


@needs_root
def test_writes_etc(parent):
    try:
        hostile("open('/etc/collab_test', 'w').write('pwned')\n")
        assert not os.path.exists("/etc/collab_test")
    finally:
        if os.path.exists("/etc/collab_test"):
            os.remove("/etc/collab_test")


def test_huge_file_is_capped(parent):
    """RLIMIT_FSIZE stops the write at ``max_file_mb`` (EFBIG), before any other limit (the 64 MB tmpfs of
    the working directory as root, the memory) could: the file holds at most ``max_file_mb``."""
    r = hostile(
        "import os\n"
        "try:\n"
        "    open('big.bin', 'wb').write(b'x' * (200 * 1024 ** 2))\n"
        "finally:\n"
        "    print(os.path.getsize('big.bin'))\n"
    )
    assert "OSError: [Errno 27] File too large" in r.stderr, r  # EFBIG
    assert 0 <= int(r.stdout) <= FAST.max_file_mb << 20, r


@needs_root
def test_tmp_is_private(parent):
    name = f"/tmp/collab-sandbox-escape-{os.getpid()}"
    r = run(f"open({name!r}, 'w').write('x')\nprint(open({name!r}).read())\n", limits=FAST)
    assert r.ok and r.stdout == "x\n"  # its own /tmp works ...
    assert not os.path.exists(name)  # ... but is not ours


# ---- network and output -----------------------------------------------------------------------------


@pytest.fixture
def server():
    """A TCP server on 127.0.0.1 recording everything it receives."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.2)
    received, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                received.append(conn.recv(1024) or b"<connected>")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], received
    stop.set()
    t.join()
    srv.close()


def test_network_connection(parent, server):
    port, received = server
    hostile(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'leak')\n")
    time.sleep(0.3)
    assert received == []


@pytest.mark.skipif(not sandbox.network_isolated(), reason="no network namespace on this machine")
def test_network_bypassing_the_socket_guard(parent, server):
    port, received = server
    r = hostile(f"import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))\ns.send(b'leak')\n")
    time.sleep(0.3)
    assert received == [] and "unreachable" in r.stderr


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_gigabytes_of_output(parent, stream):
    code = f"import sys\nchunk = 'x' * 1_000_000\nfor _ in range(2000):\n    sys.{stream}.write(chunk)\n"
    r = hostile(code)
    assert r.truncated and r.killed_by == "output"
    assert len(getattr(r, stream)) == FAST.max_output_bytes
    assert r.seconds < 1.0


# ---- benign programs --------------------------------------------------------------------------------

SOLUTION = """
from typing import List
import math, re, itertools, collections, heapq, functools, string


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    return any(abs(a - b) < threshold for a, b in itertools.combinations(numbers, 2))
"""


def test_humaneval_like_program_passes(parent):
    tests = (
        "assert has_close_elements([1.0, 2.0, 3.9], 0.3) is False\nassert has_close_elements([1.0, 2.8, 3.0], 0.3)\n"
    )
    r = run(SOLUTION + tests, limits=FAST)
    assert r.ok and r.returncode == 0 and r.killed_by is None and not r.truncated, r


def test_stdin_echo():
    r = run("import sys\nprint(sys.stdin.read().upper(), end='')\n", stdin="hello\nworld\n", limits=FAST)
    assert r.ok and r.stdout == "HELLO\nWORLD\n"


def test_failing_assert():
    r = run(SOLUTION + "assert has_close_elements([1.0, 2.0], 0.5)\n", limits=FAST)
    assert not r.ok and r.returncode == 1 and "AssertionError" in r.stderr and not r.timed_out


def test_run_tests_one_assert_at_a_time():
    tests = [
        "assert has_close_elements([1.0, 2.0, 3.9], 0.3) is False",
        "assert has_close_elements([1.0, 2.0], 0.5)",
        "assert has_close_elements([1.0, 1.1], 0.5)",
        "while True: pass",
    ]
    assert run_tests(SOLUTION, tests, limits=Limits(timeout_s=1.0)) == [True, False, True, False]


def test_pool_runs_in_parallel_and_keeps_order(parent):
    codes = [f"import time\ntime.sleep(0.5)\nprint({i})\n" for i in range(8)]
    codes[2] = codes[5] = "while True:\n    pass\n"
    start = time.monotonic()
    results = Pool(workers=4, limits=FAST).map(codes)
    total = time.monotonic() - start
    assert [r.timed_out for r in results] == [i in (2, 5) for i in range(8)]
    assert [r.stdout for i, r in enumerate(results) if i not in (2, 5)] == [f"{i}\n" for i in (0, 1, 3, 4, 6, 7)]
    assert total < 0.6 * sum(r.seconds for r in results), (total, [r.seconds for r in results])
