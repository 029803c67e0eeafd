"""What a SIGTERM leaves in this process: its time, the phase the run was in, the steps it completed.

One :class:`_State` per run (``_state``, replaced whole by :func:`collab.preemption.attach` and
:func:`collab.preemption.disarm`, so a reader thread or watchdog of a previous run sees that it is no longer
the current one), the exception that stops a run inside a step (:class:`Preempted`) and how any other
exception is read once a SIGTERM came (:func:`mid_step`).
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

SIGTERM_EXIT_CODE = 143
"""Exit status of ``collab.fit`` after SIGTERM: 128 + 15, as a shell reports a process ended by SIGTERM."""

GRACE_S = 10.0
"""Seconds after a SIGTERM during which the current step may still reach its end (and its checkpoint)."""
HARD_EXIT_S = 20.0
"""Seconds after a SIGTERM at which a process that has not stopped exits with 143 (the watchdog)."""
CHILDREN_S = 2.0
"""Seconds rank 0 waits for the other ranks after a stop inside a step (they have nothing to save) before it kills
them."""
PHASES = ("evaluation", "rollout", "update")


class Preempted(SIGTERMException):
    """A SIGTERM stopped the run inside ``phase`` (``step``: ``global_step`` then); the step did not complete."""

    def __init__(self, phase: str, step: int) -> None:
        super().__init__(SIGTERM_EXIT_CODE)
        self.phase, self.step = phase, step

    def __str__(self) -> str:
        return f"SIGTERM {describe(self.phase, self.step)}"


def describe(phase: str | None, step: int) -> str:
    """Where in the run a stop came: ``inside the update of step 3``."""
    if phase == "evaluation":
        return f"inside the evaluation at step {step}"
    if phase in ("rollout", "update"):
        return f"inside the {phase} of step {step + 1}"
    if phase == "step":
        return f"before step {step + 1}"
    return f"at step {step}"


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


def current() -> str:
    return _state.phases[-1] if _state.phases else "run"


def received() -> bool:
    """Whether this process got a SIGTERM since the run started."""
    return _state.received_at is not None


def mid_step(exception: BaseException) -> bool:
    """Whether ``exception`` stops the run inside a step (a :class:`Preempted`, or any error after a SIGTERM,
    e.g. a collective whose peer has left): nothing may be saved then, and no collective run."""
    return isinstance(exception, Preempted) or (received() and not isinstance(exception, SIGTERMException))


def _step() -> int:
    trainer = _state.run()
    return int(getattr(trainer, "global_step", 0) or 0) if trainer is not None else 0


def _rank_zero(trainer) -> bool:
    if trainer is not None:
        return bool(trainer.is_global_zero)
    return int(getattr(rank_zero_only, "rank", 0) or 0) == 0  # the launcher's: RANK, LOCAL_RANK, SLURM_PROCID
