"""Preemption: a SIGTERM (a scheduler's notice before SIGKILL) is honoured within 30 seconds wherever the run is (issue
31), in one line on stderr and exit status 143. Lightning looks at SIGTERM between batches, which for collab are
whole steps (a rollout of minutes, the first evaluation more); here the run also stops inside:

- **Check points.** :func:`check` runs at every decoding step (:func:`collab.policy.sampling.decode`), every eval
  batch (:func:`collab.evaluation.heldout.play_records`), before every micro-batch and optimizer step of an update
  (:func:`collab.training.distributed.optimizer_step`) and between vLLM engine calls; :func:`phase` names the part of
  the run around them (``evaluation``, ``rollout``, ``update``). A step does not start once a SIGTERM came
  (:func:`check_step`).
- **Grace.** For ``grace`` seconds after the signal (10; env ``COLLAB_SIGTERM_GRACE``) the checks let the current
  step go on: a step that ends in time stops at its end as before (:mod:`collab.training.resume`: ``last.ckpt`` of
  that step, "stopped by SIGTERM at step k; saved ..."). Past it the next check raises :class:`Preempted`. The
  evaluation before the first step has no step to reach: it stops at once.
- **Consistency.** :class:`Preempted` means a step (or an evaluation) did not complete: the callbacks save nothing
  (:func:`mid_step`): no checkpoint of half-updated weights or of a half-drawn random state, no adapters, and no
  collective. The resume point is the last checkpoint written at a step end, named in the line: ``stopped by SIGTERM
  inside the update of step 3; last checkpoint: step 2 PATH (resume with --ckpt_path PATH)`` (or ``no checkpoint
  yet``). ``reward_summary.json`` is already whole: it is rewritten after every rollout.
- **DDP.** Rank 0 (the launched process) forwards the signal to the ranks it started. Ranks meet the check points at
  different moments, so they agree only on the step end: one all-reduce of "a SIGTERM came" per step (:func:`agree`)
  makes every rank stop there together and save (collectives that match). A rank that stops inside a step runs no
  collective and destroys its process group (a peer inside a gloo all-reduce then fails in milliseconds; one entering
  a barrier afterwards does not notice); any error after a SIGTERM is read as the stop (exit 143, no traceback). Rank
  0 waits for its children (:data:`CHILDREN_S` after a stop inside a step, else until 2 s before the hard exit), then
  kills them: none is left orphaned.
- **Hard exit.** Python runs signal handlers only between bytecodes, not while the main thread waits in a gloo
  collective or a vLLM call: a thread reads the signal from ``signal.set_wakeup_fd`` (written by the C-level handler
  at once), forwards it and arms a watchdog that, ``hard_exit`` seconds after the signal (20; env
  ``COLLAB_SIGTERM_HARD_EXIT``), prints the line (rank 0, "forced"), kills the children and exits with 143
  (``os._exit``; files written before are whole: :mod:`collab.training.resume`).
- **Test hook.** ``COLLAB_SIGTERM_AT=<phase>[@<n>]`` (n: the n-th time the phase begins, 1 by default) makes the
  first :func:`check` inside it write the wall time to ``COLLAB_SIGTERM_FILE`` (when set) and send SIGTERM to the
  run's launching process (rank 0; torchrun's agent under torchrun), as a scheduler would.

Before Lightning registers its handlers (while the model loads) SIGTERM keeps its default action.
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
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from collab.errors import UserError, require

SIGTERM_EXIT_CODE = 143
"""Exit status of ``collab.fit`` after SIGTERM: 128 + 15, as a shell reports a process ended by SIGTERM."""

GRACE_S = 10.0
"""Seconds after a SIGTERM during which the current step may still reach its end (and its checkpoint)."""
HARD_EXIT_S = 20.0
"""Seconds after a SIGTERM at which a process that has not stopped exits with 143 (the watchdog)."""
CHILDREN_S = 2.0
"""Seconds rank 0 waits for the other ranks after a stop inside a step (they have nothing to save) before it kills them."""
PHASES = ("evaluation", "rollout", "update")


class Preempted(SIGTERMException):
    """A SIGTERM stopped the run inside ``phase`` (``step``: ``global_step`` then); the step did not complete."""

    def __init__(self, phase: str, step: int) -> None:
        super().__init__(SIGTERM_EXIT_CODE)
        self.phase, self.step = phase, step

    def __str__(self) -> str:
        return f"SIGTERM {describe(self.phase, self.step)}"


@dataclass
class _State:
    grace: float = GRACE_S
    hard_exit: float = HARD_EXIT_S
    hook: tuple[str, int] | None = None
    hook_file: str | None = None
    trainer: Any = None  # weakref.ref to the Trainer
    received_at: float | None = None  # time.monotonic() of the first SIGTERM
    phases: list[str] = field(default_factory=list)
    entered: dict[str, int] = field(default_factory=dict)
    stopped_in: tuple[str, int] | None = None
    steps: int = 0  # steps completed in this fit
    fired: bool = False
    announced: bool = False
    disarmed: bool = False
    noticed: threading.Lock = field(default_factory=threading.Lock)
    watchdog: threading.Timer | None = None
    wakeup: tuple[int, socket.socket, socket.socket] | None = None

    def run(self):  # the attached Trainer (None before attach() or once collected)
        return self.trainer() if self.trainer is not None else None


_state = _State()


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
        raise UserError(f"COLLAB_SIGTERM_AT must be <phase>[@<n>] with a phase of {', '.join(PHASES)} and n >= 1, "
                        f"got {value!r}")
    return name, int(n or 1)


# -- what the run calls ------------------------------------------------------------------------------
def attach(trainer) -> None:
    """Make ``trainer`` stop on SIGTERM at the check points (``CollabModule.setup``: before Lightning registers
    its signal handlers, which then are :class:`PreemptionConnector`'s). Disarms a previous run's watchdog."""
    global _state
    disarm()
    _state = _State(grace=_seconds("COLLAB_SIGTERM_GRACE", GRACE_S),
                    hard_exit=_seconds("COLLAB_SIGTERM_HARD_EXIT", HARD_EXIT_S), hook=_hook(os.environ.get("COLLAB_SIGTERM_AT")), hook_file=os.environ.get("COLLAB_SIGTERM_FILE"),
                    trainer=weakref.ref(trainer))
    if not isinstance(trainer._signal_connector, PreemptionConnector):
        trainer._signal_connector = PreemptionConnector(trainer)


def disarm() -> None:
    """Cancel the watchdog and the signal reader and forget the signal (a process that goes on after a stopped
    run: ``collab.fit.main(argv)`` in tests and notebooks; the next run attaches afresh)."""
    global _state
    s = _state
    s.disarmed = True
    if s.watchdog is not None:
        s.watchdog.cancel()
    _unwatch(s)
    _state = _State()


def current() -> str:
    return _state.phases[-1] if _state.phases else "run"


def received() -> bool:
    """Whether this process got a SIGTERM since the run started."""
    return _state.received_at is not None


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Name the part of the run inside (the innermost names a stop), counting its beginnings (the hook's ``@n``)."""
    s = _state
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
    s = _state
    if s.hook is not None and not s.fired:
        _fire(s, name or current())
    if s.received_at is not None:
        name = name or current()
        grace = s.grace if s.steps or name != "evaluation" else 0.0  # before the first step: nothing to reach
        if time.monotonic() - s.received_at >= grace:
            raise Preempted(name, _step())


def check_step() -> None:
    """At a step's start: no new step once a SIGTERM came."""
    if _state.received_at is not None:
        raise Preempted("step", _step())


def agree(module) -> None:
    """At a step's end, every rank: whether any rank got a SIGTERM (one all-reduce under DDP). If so, every
    rank sets Lightning's flag, and its loop stops after this step on every rank at once (the save's
    collectives match). One process: the signal handler set the flag already. With a sharded base the caller
    settles the gathers first (:func:`collab.policy.sharded.settle`)."""
    _state.steps += 1
    trainer = module.trainer
    if trainer.world_size > 1:  # collab.training.distributed.global_max, written out: this module imports no training/
        import torch

        flag = torch.tensor([float(received())], dtype=torch.float64)
        if float(trainer.strategy.reduce(flag, reduce_op="max")):
            trainer._signal_connector.received_sigterm = True


def mid_step(exception: BaseException) -> bool:
    """Whether ``exception`` stops the run inside a step (a :class:`Preempted`, or any error after a SIGTERM,
    e.g. a collective whose peer has left): nothing may be saved then, and no collective run."""
    return isinstance(exception, Preempted) or (received() and not isinstance(exception, SIGTERMException))


def stopped_by(exception: BaseException) -> bool:
    """Whether ``collab.fit`` should read ``exception`` as a SIGTERM stop (exit 143, the one line)."""
    return isinstance(exception, SIGTERMException) or (received() and isinstance(exception, Exception))


def stop(trainer, exception: BaseException) -> None:
    """The stop's end in ``collab.fit``: the one line (rank 0), the process group released after a stop inside a
    step, rank 0's children awaited (:data:`CHILDREN_S` then, else until 2 s before the hard exit), then killed."""
    s = _state
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
    interpreter's teardown, a garbage collection over torch's modules, took 7 s on a loaded 2-core machine."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(SIGTERM_EXIT_CODE)


# -- the line ----------------------------------------------------------------------------------------
def describe(phase: str | None, step: int) -> str:
    if phase == "evaluation":
        return f"inside the evaluation at step {step}"
    if phase in ("rollout", "update"):
        return f"inside the {phase} of step {step + 1}"
    if phase == "step":
        return f"before step {step + 1}"
    return f"at step {step}"


def last_checkpoint(trainer) -> str:
    cb = getattr(trainer, "checkpoint_callback", None)
    path = (getattr(cb, "last_model_path", "") or getattr(cb, "best_model_path", "")) if cb is not None else ""
    if path and os.path.exists(path):
        return f"last checkpoint: step {getattr(cb, '_last_global_step_saved', '?')} {path} (resume with --ckpt_path {path})"
    resumed = getattr(trainer, "ckpt_path", None)
    if resumed:
        return f"last checkpoint: the one this run resumed from, {resumed} (resume with --ckpt_path {resumed})"
    return "no checkpoint yet"


def stop_line(trainer, exception: BaseException | None = None, forced: bool = False) -> str:
    step = int(getattr(trainer, "global_step", 0) or 0)
    if exception is not None and not mid_step(exception):  # the step-end stop (collab.training.resume)
        cb = getattr(trainer, "checkpoint_callback", None)
        last = getattr(cb, "last_model_path", "") if cb is not None else ""
        saved = f"saved {last} (resume with --ckpt_path {last})" if last else "no checkpoint (no save_last)"
        return f"stopped by SIGTERM at step {step}; {saved}"
    if isinstance(exception, Preempted):
        where = describe(exception.phase, exception.step)
    else:
        where = describe(*(_state.stopped_in or (current(), step)))
    how = f" (forced: no orderly stop {_state.hard_exit:.0f} s after the signal)" if forced else ""
    return f"stopped by SIGTERM {where}{how}; {last_checkpoint(trainer) if trainer is not None else 'no checkpoint yet'}"


# -- the signal --------------------------------------------------------------------------------------
class PreemptionConnector(_SignalConnector):
    """Lightning's signal connector without its broadcast inside the handler (a collective that can meet
    another one, or block): the handler notes the signal (:func:`notice`), and with one process sets
    Lightning's flag as Lightning does; under DDP :func:`agree` sets it on every rank at a step's end."""

    def register_signal_handlers(self) -> None:
        super().register_signal_handlers()
        _watch(_state)

    def _sigterm_notifier_fn(self, signum, frame) -> None:
        notice()
        if self.trainer.world_size == 1:
            self.received_sigterm = True

    def teardown(self) -> None:
        _unwatch(_state)
        super().teardown()


def notice() -> None:
    """A SIGTERM came (the handler, or the reader thread while the main thread waits in C): note the time;
    once, forward it to the ranks this process started and arm the watchdog."""
    s = _state
    if s.received_at is None:
        s.received_at = time.monotonic()
    if s.disarmed or not s.noticed.acquire(blocking=False):
        return
    trainer = s.run()
    launcher = getattr(getattr(trainer, "strategy", None), "launcher", None)
    if getattr(launcher, "procs", None):
        with contextlib.suppress(Exception):
            launcher.kill(signal.SIGTERM)
    s.watchdog = threading.Timer(max(0.0, s.hard_exit - (time.monotonic() - s.received_at)), _hard_exit, args=(s,))
    s.watchdog.daemon = True
    s.watchdog.start()


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
                if signal.SIGTERM in data and s is _state:
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
    if s.disarmed or s is not _state:
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


def _rank_zero(trainer) -> bool:
    if trainer is not None:
        return bool(trainer.is_global_zero)
    return int(getattr(rank_zero_only, "rank", 0) or 0) == 0  # the launcher's: RANK, LOCAL_RANK, SLURM_PROCID


def _step() -> int:
    trainer = _state.run()
    return int(getattr(trainer, "global_step", 0) or 0) if trainer is not None else 0


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
