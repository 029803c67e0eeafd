"""``python -m collab.fit`` runs started from a warm interpreter (:mod:`tests.support.warm_server`), one per test
worker, instead of a fresh interpreter each.

A fresh interpreter spends 6-8 CPU seconds importing torch, Lightning, transformers and peft before it reads its
first argument, and a 2-process run under Lightning's launcher pays that twice, one after the other (rank 0 imports,
then starts rank 1, which imports while rank 0 waits): most of a tiny 2-step run's time. The server imports them once
and forks each process of a run, so both ranks start at once.

:func:`ranks` starts a run's processes as Lightning's launcher starts its children (``MASTER_ADDR``,
``MASTER_PORT``, ``NODE_RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` set, so Lightning creates no process): what
differs from a user's ``--trainer.devices 2`` is only who starts rank 0 and that the ranks share the server's hash
seed. Lightning's own launcher, torchrun and a fresh interpreter's imports keep tests of their own (test_ddp.py's
launchers, the quick start's tests, test_bad_input's ``REAL`` cases)."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the checkout on ``PYTHONPATH`` (the tests' helpers and ``src``)."""
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}", **extra}


@dataclass
class Child:
    """A forked run: its pid (for signals) and, once it ends, its exit code and output files."""

    server: Server
    id: int
    pid: int
    stdout: Path
    stderr: Path

    def wait(self, timeout: float = 600) -> int:
        with self.server.changed:
            if not self.server.changed.wait_for(lambda: self.id in self.server.codes, timeout):
                raise subprocess.TimeoutExpired(f"forked run {self.id} (pid {self.pid})", timeout)
            return self.server.codes[self.id]

    def result(self, timeout: float = 600) -> subprocess.CompletedProcess:
        code = self.wait(timeout)
        return subprocess.CompletedProcess([str(self.pid)], code, self.stdout.read_text(), self.stderr.read_text())


class Server:
    """One warm interpreter (by default :mod:`tests.support.warm_server`; ``command`` another that ends in its
    ``serve``, with ``env``); :meth:`start` may be called from several threads. ``ready``: the first line it
    printed, parsed."""

    def __init__(self, command: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="warm-"))  # the children's stdout and stderr files
        self.proc = subprocess.Popen(
            command or [sys.executable, "-m", "tests.support.warm_server"],
            env=env or child_env(TOKENIZERS_PARALLELISM="false"),
            cwd=self.folder,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.ready = json.loads(self.proc.stdout.readline())
        self.count = 0
        self.pids: dict[int, int] = {}
        self.codes: dict[int, int] = {}
        self.changed = threading.Condition()  # guards count, stdin, pids and codes
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            answer = json.loads(line)
            with self.changed:
                if "pid" in answer:
                    self.pids[answer["id"]] = answer["pid"]
                else:
                    self.codes[answer["id"]] = answer["code"]
                self.changed.notify_all()

    def start(
        self, args: list[str], cwd: Path, env: dict[str, str], module: str = "collab.fit", timeout: int = 600
    ) -> Child:
        """``python -m module args`` in ``cwd`` with exactly ``env``, ended by SIGALRM after ``timeout`` seconds;
        its stdout and stderr go to files of the server's folder (:class:`Child`)."""
        with self.changed:
            self.count += 1
            id = self.count
            out, err = self.folder / f"{id}.out", self.folder / f"{id}.err"
            request = {
                "id": id,
                "module": module,
                "args": list(args),
                "cwd": str(cwd),
                "env": dict(env),
                "stdout": str(out),
                "stderr": str(err),
                "timeout": int(timeout),
            }
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            self.changed.wait_for(lambda: id in self.pids)
            return Child(self, id, self.pids.pop(id), out, err)

    def run(
        self, args: list[str], cwd: Path, env: dict[str, str], module: str = "collab.fit", timeout: int = 600
    ) -> subprocess.CompletedProcess:
        """:meth:`start`, to the run's end (a minute more than its alarm: the code comes once the alarm ended it)."""
        return self.start(args, cwd, env, module, timeout).result(timeout + 60)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


_server: Server | None = None
_lock = threading.Lock()


def server() -> Server:
    """This test worker's server, started at its first use."""
    global _server
    with _lock:
        if _server is None or _server.proc.poll() is not None:
            _server = Server()
            atexit.register(_server.close)
        return _server


def run(args: list[str], cwd: Path, env: dict[str, str], module: str = "collab.fit", timeout: int = 600):
    """One forked run of ``python -m module args``, to its end (:meth:`Server.run`)."""
    return server().run(args, cwd, env, module, timeout)


def start_ranks(args: list[str], cwd: Path, env: dict[str, str], world: int = 2, timeout: int = 600) -> list[Child]:
    """``world`` processes of ``python -m collab.fit args`` (which must ask for ``world`` devices), each with the
    variables Lightning's launcher gives the processes it starts."""
    cluster = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NODE_RANK": "0", "WORLD_SIZE": str(world)}
    return [server().start(args, cwd, {**env, **cluster, "LOCAL_RANK": str(r)}, timeout=timeout) for r in range(world)]


def ranks(args: list[str], cwd: Path, env: dict[str, str], world: int = 2, timeout: int = 600):
    """:func:`start_ranks` to their end (:func:`finish`)."""
    return finish(start_ranks(args, cwd, env, world, timeout), timeout)


def finish(children: list[Child], timeout: float = 600) -> subprocess.CompletedProcess:
    """The processes of one run to their end: the highest exit code, the first's stdout, every one's stderr. One
    that fails ends the others, which would wait for it at a collective."""
    owner = children[0].server
    deadline = time.monotonic() + timeout
    with owner.changed:
        while not all(c.id in owner.codes for c in children) and time.monotonic() < deadline:
            if any(owner.codes.get(c.id, 0) != 0 for c in children):
                for c in children:
                    if c.id not in owner.codes:
                        os.kill(c.pid, signal.SIGKILL)
            owner.changed.wait(1.0)
    results = [c.result(max(0.0, deadline - time.monotonic())) for c in children]
    return subprocess.CompletedProcess(
        [str(c.pid) for c in children],
        max(r.returncode for r in results),
        results[0].stdout,
        "".join(r.stderr for r in results),
    )
