"""The one line on stderr that ends a run stopped by SIGTERM: where it stopped and what to resume from.

``stopped by SIGTERM inside the update of step 3; last checkpoint: step 2 PATH (resume with --ckpt_path PATH)``,
or after a stop at a step's end, ``stopped by SIGTERM at step 3; saved PATH (resume with --ckpt_path PATH)``.
"""

from __future__ import annotations

import os

from collab.preemption import state
from collab.preemption.state import Preempted, current, describe, mid_step


def last_checkpoint(trainer) -> str:
    cb = getattr(trainer, "checkpoint_callback", None)
    path = (getattr(cb, "last_model_path", "") or getattr(cb, "best_model_path", "")) if cb is not None else ""
    if path and os.path.exists(path):
        step = getattr(cb, "_last_global_step_saved", "?")
        return f"last checkpoint: step {step} {path} (resume with --ckpt_path {path})"
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
        where = describe(*(state._state.stopped_in or (current(), step)))
    how = f" (forced: no orderly stop {state._state.hard_exit:.0f} s after the signal)" if forced else ""
    return (
        f"stopped by SIGTERM {where}{how}; {last_checkpoint(trainer) if trainer is not None else 'no checkpoint yet'}"
    )
