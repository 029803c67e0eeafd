"""Multi-process runs (Lightning's DDP on gloo or NCCL) that end in one line, never a hang: the process group's
timeout (``--distributed_timeout``) and a collective's failure as one line on stderr with exit code 1.

What makes every rank's update the same is :mod:`collab.runtime.collectives`; the processes the machine can
hold are checked before they start (:func:`collab.cli.resources.prepare_processes`).
"""

from __future__ import annotations

DEFAULT_TIMEOUT_S = 1800.0
"""Seconds a process waits in a collective for the others (``--distributed_timeout``): long enough for one
rank's long rollout (or evaluation) while the others wait at the step's first collective."""

_FAILURES = (
    "timed out",
    "connection closed by peer",
    "connection reset by peer",
    "collective mismatch",
    "op.preamble",
    "gloo/",
    "nccl",
)  # the backends' messages (gloo's name its source file)


START_TIMEOUT_S = 600.0
"""Seconds the processes wait for each other to start (the rendezvous) at least: importing torch and
building the run on a busy node is no collective hang, so a short ``--distributed_timeout`` does not apply to it."""


def set_timeout(strategy, seconds: float) -> None:
    """The process group's timeout (Lightning's ``DDPStrategy(timeout=...)``, also FSDP's) before the group is
    created: ``seconds``, at least :data:`START_TIMEOUT_S` for the start; :func:`timeout_callback` sets the
    collectives' own to ``seconds`` once the group exists. A strategy without a process group is left as it is."""
    from datetime import timedelta

    if seconds is None or not 0 < seconds < float("inf"):
        from collab.errors import UserError

        raise UserError(f"--distributed_timeout must be a number of seconds > 0, got {seconds}")
    if hasattr(strategy, "_timeout"):
        strategy._timeout = timedelta(seconds=max(float(seconds), START_TIMEOUT_S))


def collective_failure(error: BaseException) -> bool:
    """Whether ``error`` is a backend's report of a collective that did not complete (gloo: "Timed out
    waiting ... ms", "Connection closed by peer"; torch's ``DistError``s)."""
    import torch.distributed as dist

    kinds = tuple(k for k in (getattr(dist, "DistError", None),) if k is not None)
    text = str(error).lower()
    return isinstance(error, kinds) or (isinstance(error, RuntimeError) and any(f in text for f in _FAILURES))


def failure_line(rank: int, step: int, timeout_s: float, error: BaseException) -> str:
    """``rank 1 at step 3: a collective did not complete within 60 s (...)``: one line."""
    text = " ".join(str(error).split())
    peer_gone = any(f in text.lower() for f in ("closed by peer", "reset by peer"))
    what = (
        "a collective failed: another process ended (see its error above)"
        if peer_gone
        else f"a collective did not complete within {timeout_s:g} s (another process stopped or diverged)"
    )
    return (
        f"rank {rank} at step {step}: {what}; a rank that legitimately takes longer (a long rollout) needs "
        f"a larger --distributed_timeout SECONDS (docs/distributed.md). Backend: {text[:200]}"
    )


def timeout_callback(timeout_s: float):
    """A Lightning callback that turns a collective's failure on this rank into :func:`failure_line` on stderr
    and exit code 1, after stopping the processes this one launched (a rank stalled in a collective
    ignores SIGTERM): the run ends at the timeout instead of hanging in the teardown's collectives."""
    from lightning.pytorch import Callback

    class CollectiveTimeout(Callback):
        def setup(self, trainer, pl_module, stage) -> None:  # the group exists: its collectives' timeout
            from datetime import timedelta

            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and hasattr(dist.distributed_c10d, "_set_pg_timeout"):
                dist.distributed_c10d._set_pg_timeout(timedelta(seconds=float(timeout_s)))

        def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
            import signal
            import sys

            from collab.preemption.watchdog import stand_down_observer

            if trainer.world_size < 2 or not collective_failure(exception):
                return
            print(
                f"error: {failure_line(trainer.global_rank, trainer.global_step, timeout_s, exception)}",
                file=sys.stderr,
                flush=True,
            )
            for logger in trainer.loggers:
                logger.finalize("failed")
            launcher = getattr(trainer.strategy, "launcher", None)
            if getattr(launcher, "procs", None):
                stand_down_observer()  # else it may SIGKILL this process on seeing their -9: exit -9, not 1
                launcher.kill(signal.SIGKILL)
            raise SystemExit(1)

    return CollectiveTimeout()
