"""The warm interpreter of :mod:`tests.support.warm`: imports torch, Lightning, transformers and peft once, then forks
one child per request, each running ``python -m <module> <args>`` as a fresh interpreter would (its own environment,
cwd, stdin /dev/null, stdout and stderr files, ``sys.exit(main())``, a traceback and exit code 1 for an uncaught
exception). Requests arrive one JSON line each on stdin and may overlap; the answers, one JSON line each on stdout,
are the child's pid when it is forked and its exit code when it ends (in any order).

The parent runs no torch operation and starts no thread: a child forked from it starts as a fresh process would,
its thread count from the ``OMP_NUM_THREADS`` of its own environment."""

import atexit
import importlib
import json
import os
import select
import signal
import sys
import traceback

import lightning.pytorch.cli  # noqa: F401  (imported once, here, for every child)
import peft  # noqa: F401
import torch
import torch.distributed.fsdp  # noqa: F401
import transformers  # noqa: F401

import collab.evaluate  # noqa: F401
import collab.fit  # noqa: F401
import tests.support.ddp_probe  # noqa: F401

DEFAULT_THREADS = torch.get_num_threads()


def child(req: dict) -> None:
    code = 1
    try:
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        sys.path[0] = req["cwd"]  # as ``python -m`` puts its cwd first (a ``module:Class`` of the cwd imports)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
        os.dup2(os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        # the OpenMP runtime read the parent's OMP_NUM_THREADS when it loaded: this child's is set here
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", DEFAULT_THREADS)))
        signal.alarm(req["timeout"])
        sys.argv = [req["module"], *req["args"]]
        try:
            code = importlib.import_module(req["module"]).main()
        except SystemExit as e:
            code = e.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(announce: bool = True) -> None:
    """Fork a child per request until stdin closes and every child has ended (``announce``: say ready first)."""
    if announce:
        print(json.dumps({"ready": True}), flush=True)
    running, pending, stdin_open = {}, b"", True
    while stdin_open or running:
        readable, _, _ = select.select([0] if stdin_open else [], [], [], 0.02)
        if readable:  # read unbuffered: select() cannot see lines already in a buffer
            chunk = os.read(0, 65536)
            stdin_open = bool(chunk)
            pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            req = json.loads(line)
            pid = os.fork()
            if pid == 0:
                child(req)
            running[pid] = req["id"]
            print(json.dumps({"id": req["id"], "pid": pid}), flush=True)
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            print(json.dumps({"id": running.pop(pid), "code": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    serve()
