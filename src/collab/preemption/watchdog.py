"""The signal itself: noticed wherever the main thread is, forwarded to the ranks rank 0 started, and the
watchdog that ends a process which has not stopped ``hard_exit`` seconds after it.

Python runs signal handlers only between bytecodes, not while the main thread waits in a gloo collective or a
vLLM call: a thread reads the signal from ``signal.set_wakeup_fd`` (written by the C-level handler at once).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

from collab.preemption import state
from collab.preemption.line import stop_line
from collab.preemption.state import SIGTERM_EXIT_CODE, _rank_zero, _State


class PreemptionConnector(_SignalConnector):
    """Lightning's signal connector without its broadcast inside the handler (a collective that can meet
    another one, or block): the handler notes the signal (:func:`notice`), and with one process sets
    Lightning's flag as Lightning does; under DDP :func:`collab.preemption.agree` sets it on every rank at a
    step's end."""

    def register_signal_handlers(self) -> None:
        super().register_signal_handlers()
        _watch(state._state)

    def _sigterm_notifier_fn(self, signum, frame) -> None:
        notice()
        if self.trainer.world_size == 1:
            self.received_sigterm = True

    def teardown(self) -> None:
        _unwatch(state._state)
        super().teardown()


def notice() -> None:
    """A SIGTERM came (the handler, or the reader thread while the main thread waits in C): note the time;
    once, forward it to the ranks this process started and arm the watchdog."""
    s = state._state
    if s.received_at is None:
        s.received_at = time.monotonic()
    if s.disarmed or not s.noticed.acquire(blocking=False):
        return
    trainer = s.run()
    launcher = getattr(getattr(trainer, "strategy", None), "launcher", None)
    if getattr(launcher, "procs", None):
        stand_down_observer()
        with contextlib.suppress(Exception):
            launcher.kill(signal.SIGTERM)
    s.watchdog = threading.Timer(max(0.0, s.hard_exit - (time.monotonic() - s.received_at)), _hard_exit, args=(s,))
    s.watchdog.daemon = True
    s.watchdog.start()


def stand_down_observer() -> None:
    """Stop Lightning's child-process observer in this process (rank 0 of a run it launched). Within 5 s of a
    child's non-zero exit it SIGKILLs every rank and this process, which then ends with -9 instead of its own
    status: after a SIGTERM the children end with 143 on purpose while this process still reaps them and
    writes its line. This process ends its children itself from here on (:func:`_reap`)."""
    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    for thread in threading.enumerate():
        if isinstance(thread, _ChildProcessObserver):
            thread._run = lambda: True  # its loop ends at its next look, before it can kill anything


def _watch(s: _State) -> None:
    """Read SIGTERM from the wakeup fd in a thread (the C-level handler writes it at once)."""
    if s.wakeup is not None or threading.current_thread() is not threading.main_thread():
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
        old = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except (ValueError, OSError):
        reader.close(), writer.close()
        return
    if old != -1:  # someone else's (an event loop): leave it theirs, the handler alone notices
        signal.set_wakeup_fd(old)
        reader.close(), writer.close()
        return
    s.wakeup = (old, reader, writer)

    def read() -> None:
        with reader, contextlib.suppress(OSError):  # closed when _unwatch closes the writer
            while data := reader.recv(64):
                if signal.SIGTERM in data and s is state._state:
                    notice()

    threading.Thread(target=read, name="collab-sigterm", daemon=True).start()


def _unwatch(s: _State) -> None:
    if s.wakeup is None or threading.current_thread() is not threading.main_thread():
        return
    old, reader, writer = s.wakeup
    s.wakeup = None
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(old)
    writer.close()  # the reader sees the end
    with contextlib.suppress(OSError):
        reader.shutdown(socket.SHUT_RDWR)


def _hard_exit(s: _State) -> None:
    """The watchdog: the line (rank 0, "forced"), the children killed, exit 143 (``os._exit``; files written
    before are whole: :mod:`collab.training.resume`)."""
    if s.disarmed or s is not state._state:
        return
    trainer = s.run()
    try:
        if _rank_zero(trainer) and not s.announced:
            s.announced = True
            print(stop_line(trainer, None, forced=True), file=sys.stderr, flush=True)
        _reap(trainer, time.monotonic())
    finally:
        os._exit(SIGTERM_EXIT_CODE)


def _reap(trainer, deadline: float) -> None:
    """Wait for the ranks this process started until ``deadline`` (monotonic), then kill them."""
    procs = getattr(getattr(getattr(trainer, "strategy", None), "launcher", None), "procs", None) or []
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(Exception):
                proc.kill()
                proc.wait(timeout=5)
