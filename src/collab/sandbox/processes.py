"""The parent's side of a run's processes: dedicated uids, killing, stdin, and reading capped output.

Dedicated uids (as root): ``UID_BASE + (parent pid % 65536) * 4096 + slot``, unused by any account on
the machine. Slots rotate, so a uid is reused only 4096 runs later: killed processes that init has not
reaped yet (zombies still count towards RLIMIT_NPROC) are long gone by then. Because the uid is
dedicated, killing *every* process of that uid after the run is safe (:func:`kill_uid`); this catches
children that escaped the process group with ``setsid``.
"""

from __future__ import annotations

import itertools
import os
import selectors
import signal
import subprocess
import threading
import time

UID_BASE = 1_500_000_000
_uid_lock = threading.Lock()
_uid_counter = itertools.count()
_slots_in_use: set[int] = set()


def claim_uid() -> tuple[int, int]:
    """``(uid, slot)``: a dedicated uid that no other run of this process holds (see :func:`release_uid`)."""
    with _uid_lock:
        if len(_slots_in_use) >= 4096:
            raise RuntimeError("more than 4096 concurrent sandboxed programs")
        slot = next(_uid_counter) % 4096
        while slot in _slots_in_use:
            slot = next(_uid_counter) % 4096
        _slots_in_use.add(slot)
    return own_uids()[slot], slot


def own_uids() -> range:
    """The uids this process's runs take (:func:`claim_uid`): other processes' sandboxes (another pytest worker's,
    say) have others."""
    base = UID_BASE + (os.getpid() % 65536) * 4096
    return range(base, base + 4096)


def release_uid(slot: int) -> None:
    """The uid of ``slot`` is free for a later run."""
    with _uid_lock:
        _slots_in_use.discard(slot)


def kill_uid(uid: int) -> None:
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


def exited(pid: int) -> bool:
    """Whether the child has exited, *without* reaping it (WNOWAIT keeps its pid and group id taken)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def killpg(pgid: int) -> None:
    """SIGKILL the process group ``pgid``, if it is still there."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def feed(pipe, data: bytes) -> None:
    """Write ``data`` to the program's stdin and close it (run in a thread: the program may never read)."""
    try:
        pipe.write(data)
    except OSError:
        pass  # the program exited or closed stdin
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def collect(proc: subprocess.Popen, bufs: dict, deadline: float, cap: int) -> tuple[bool, bool]:
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
                killpg(proc.pid)
                return True, False
            done = exited(proc.pid)
            events = sel.select(0 if done else min(remaining, 0.1))
            if done and not events:
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
                    killpg(proc.pid)
                    return False, True
        return False, False
    finally:
        sel.close()
