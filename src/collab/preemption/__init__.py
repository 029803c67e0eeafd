"""Preemption: a SIGTERM (a scheduler's notice before SIGKILL) is honoured within 30 seconds wherever the run is,
in one line on stderr and exit status 143 (what a user sees: docs/resume.md). Lightning looks at SIGTERM between
batches, which for collab are whole steps (a rollout of minutes), so the run also stops inside them:

- **Check points.** :func:`check` runs at every decoding step, eval batch, micro-batch and optimizer step and
  between vLLM calls; :func:`phase` names the part of the run around them; :func:`check_step` starts no step
  after a SIGTERM. For ``grace`` seconds (10; ``COLLAB_SIGTERM_GRACE``) the checks let the current step end
  (and save as usual); past it the next check raises :class:`Preempted`.
- **Consistency.** :class:`Preempted` means a step did not complete: the callbacks save nothing of it
  (:func:`mid_step`), no half-updated weights or half-drawn random state; the step before it is saved from its
  snapshot (``collab.training.resume.Snapshot``).
- **DDP.** Rank 0 forwards the signal to the ranks it started. Ranks meet the check points at different moments,
  so they agree only on the step end (one all-reduce per step, :func:`agree`) and save together there. A rank
  that stops inside a step runs no collective and destroys its process group; any error after a SIGTERM is read
  as the stop. Rank 0 waits for its children (:data:`CHILDREN_S`), then kills them: none is left orphaned.
- **Hard exit.** Python runs signal handlers only between bytecodes, not while the main thread waits in a gloo
  collective or a vLLM call: a thread reads the signal from ``signal.set_wakeup_fd``, forwards it and arms a
  watchdog that exits with 143 ``hard_exit`` seconds after it (20; ``COLLAB_SIGTERM_HARD_EXIT``).
- **Test hook.** ``COLLAB_SIGTERM_AT=<phase>[@<n>]`` makes the first :func:`check` inside the n-th such phase
  write the wall time to ``COLLAB_SIGTERM_FILE`` (when set) and send SIGTERM to the run's launching process.

Before Lightning registers its handlers (while the model loads) SIGTERM keeps its default action. The parts:
:mod:`~collab.preemption.state` (what a SIGTERM left in this process, :class:`Preempted`),
:mod:`~collab.preemption.line` (the one line), :mod:`~collab.preemption.watchdog` (the reader thread, the
forwarding and the hard exit).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import weakref
from collections.abc import Iterator

from lightning.pytorch.utilities.exceptions import SIGTERMException

from collab.errors import UserError, require
from collab.preemption import state
from collab.preemption.line import stop_line
from collab.preemption.state import (
    CHILDREN_S,
    GRACE_S,
    HARD_EXIT_S,
    PHASES,
    SIGTERM_EXIT_CODE,
    Preempted,
    _rank_zero,
    _State,
    _step,
    current,
    mid_step,
    received,
)
from collab.preemption.watchdog import PreemptionConnector, _reap, _unwatch


def _seconds(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    try:
        seconds = float(value) if value else default
    except ValueError:
        seconds = -1.0
    require(seconds >= 0, f"{name} must be a number of seconds >= 0, got {value!r}")
    return seconds


def _hook(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    name, _, n = value.partition("@")
    if name not in PHASES or not (n == "" or (n.isdigit() and int(n) >= 1)):
        raise UserError(
            f"COLLAB_SIGTERM_AT must be <phase>[@<n>] with a phase of {', '.join(PHASES)} and n >= 1, got {value!r}"
        )
    return name, int(n or 1)


# -- what the run calls ------------------------------------------------------------------------------
def attach(trainer) -> None:
    """Make ``trainer`` stop on SIGTERM at the check points (``CollabModule.setup``: before Lightning registers
    its signal handlers, which then are :class:`PreemptionConnector`'s). Disarms a previous run's watchdog."""
    disarm()
    state._state = _State(
        grace=_seconds("COLLAB_SIGTERM_GRACE", GRACE_S),
        hard_exit=_seconds("COLLAB_SIGTERM_HARD_EXIT", HARD_EXIT_S),
        hook=_hook(os.environ.get("COLLAB_SIGTERM_AT")),
        hook_file=os.environ.get("COLLAB_SIGTERM_FILE"),
        trainer=weakref.ref(trainer),
    )
    if not isinstance(trainer._signal_connector, PreemptionConnector):
        trainer._signal_connector = PreemptionConnector(trainer)


def disarm() -> None:
    """Cancel the watchdog and the signal reader and forget the signal (a process that goes on after a stopped
    run: ``collab.fit.main(argv)`` in tests and notebooks; the next run attaches afresh)."""
    s = state._state
    s.disarmed = True
    if s.watchdog is not None:
        s.watchdog.cancel()
    _unwatch(s)
    state._state = _State()


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Name the part of the run inside (the innermost names a stop), counting its beginnings (the hook's ``@n``)."""
    s = state._state
    s.phases.append(name)
    s.entered[name] = s.entered.get(name, 0) + 1
    try:
        yield
    except BaseException:
        if s.received_at is not None and s.stopped_in is None:
            s.stopped_in = (name, _step())
        raise
    finally:
        s.phases.pop()


def check(name: str | None = None) -> None:
    """Raise :class:`Preempted` when a SIGTERM came more than ``grace`` seconds ago (cheap otherwise)."""
    s = state._state
    if s.hook is not None and not s.fired:
        _fire(s, name or current())
    if s.received_at is not None:
        name = name or current()
        grace = s.grace if s.steps or name != "evaluation" else 0.0  # before the first step: nothing to reach
        if time.monotonic() - s.received_at >= grace:
            raise Preempted(name, _step())


def check_step() -> None:
    """At a step's start: no new step once a SIGTERM came."""
    if state._state.received_at is not None:
        raise Preempted("step", _step())


def agree(module) -> None:
    """At a step's end, every rank: whether any rank got a SIGTERM (one all-reduce under DDP). If so, every
    rank sets Lightning's flag, and its loop stops after this step on every rank at once (the save's
    collectives match). One process: the signal handler set the flag already. With sharded models the caller
    settles the forwards first (:func:`collab.runtime.lockstep.settle`)."""
    state._state.steps += 1
    trainer = module.trainer
    if trainer.world_size > 1:  # collab.runtime.collectives.global_max, written out: runtime/ sits above this module
        import torch

        flag = torch.tensor([float(received())], dtype=torch.float64)
        if float(trainer.strategy.reduce(flag, reduce_op="max")):
            trainer._signal_connector.received_sigterm = True


def stopped_by(exception: BaseException) -> bool:
    """Whether ``collab.fit`` should read ``exception`` as a SIGTERM stop (exit 143, the one line)."""
    return isinstance(exception, SIGTERMException) or (received() and isinstance(exception, Exception))


def stop(trainer, exception: BaseException) -> None:
    """The stop's end in ``collab.fit``: the one line (rank 0), the process group released after a stop inside a
    step, rank 0's children awaited (:data:`CHILDREN_S` then, else until 2 s before the hard exit), then killed."""
    s = state._state
    if _rank_zero(trainer) and not s.announced:
        s.announced = True
        print(stop_line(trainer, exception), file=sys.stderr, flush=True)
    deadline = (s.received_at or time.monotonic()) + s.hard_exit - 2.0
    if mid_step(exception):  # nothing to save on any rank: a rank still running is blocked in a collective
        import torch.distributed as dist

        with contextlib.suppress(Exception):
            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()  # a peer blocked in a collective on us may fail now
        deadline = min(deadline, time.monotonic() + CHILDREN_S)
    _reap(trainer, deadline)


def exit_now() -> None:
    """End the process with 143 now (``collab.fit`` as a command, after :func:`stop`, every file written): the
    interpreter's teardown would add a garbage collection over torch's modules, seconds long."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(SIGTERM_EXIT_CODE)


def _fire(s: _State, name: str) -> None:
    """The test hook: SIGTERM to the launching process the first time a check runs in the n-th ``name``."""
    want, n = s.hook  # type: ignore[misc]
    if name != want or s.entered.get(name, 0) != n or not _rank_zero(s.run()):
        return
    s.fired = True
    if s.hook_file:
        with open(s.hook_file, "w") as f:
            f.write(repr(time.time()))
    os.kill(os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") else os.getpid(), signal.SIGTERM)
