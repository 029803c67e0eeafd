"""Lightning's start-up messages held until the run starts, and the libraries' own output set for a command.

:func:`command_output` / :func:`hold_logs` / :func:`release_logs`: Lightning's start-up messages and the warnings
shown meanwhile are kept back until the run really starts (``on_fit_start``, after the team is built and a
checkpoint restored); a bad input found before then discards them (the one ``error:`` line of :mod:`collab.cli`).
When stdout is not a terminal, Lightning's information lines ("GPU available: ...", "LOCAL_RANK: ...") and
transformers' progress bars are not shown at all: a log holds collab's own lines.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

_LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric")


class _Hold(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


_held: tuple[_Hold, list[tuple[logging.Logger, list[logging.Handler], bool]], Any] | None = None
_requested = False
_notes: list[str] = []
_undo: list[Callable[[], None]] = []
"""What :func:`hold_logs` changed for the whole command (logger levels, progress bars), put back by
:func:`command_output`."""


def note(line: str) -> None:
    """A line for stderr (which config files the run reads), shown with the held messages when the run
    starts (or ``--print_config`` prints), dropped with them when a bad input ends the run; printed at
    once when nothing is held (a notebook)."""
    import sys

    if _requested or _held is not None:
        _notes.append(line)
    else:
        print(line, file=sys.stderr, flush=True)


def show_notes() -> None:
    """Print the lines :func:`note` held so far now, on rank 0 (Lightning's messages stay held): a team whose
    adapters take minutes to build says its start lines before (:mod:`collab.cli.resources`)."""
    notes = list(_notes)
    _notes.clear()
    if notes and launched_rank() == 0:
        print("\n".join(notes), file=sys.stderr, flush=True)


def restore_on_exit(undo: Callable[[], None]) -> None:
    """Run ``undo`` when the command-line entry returns (:func:`command_output`): a setting the command made for
    itself (its threads) is put back for the test or notebook that called it."""
    if _requested:
        _undo.append(undo)


def launched_rank() -> int:
    """This process's global rank as its launcher set it (torchrun's ``RANK``, SLURM's ``SLURM_PROCID``,
    Lightning's ``LOCAL_RANK`` for the processes it starts); 0 when none did."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    return int(getattr(rank_zero_only, "rank", 0) or 0)


def request_hold() -> None:
    """Ask :func:`hold_logs` to hold (the command-line entries do; ``collab.fit.build_cli`` called from a notebook
    does not)."""
    global _requested
    _requested = True


@contextmanager
def command_output():
    """Around a command-line entry (``collab.fit``, ``collab.evaluate``): Lightning's start-up messages held
    (:func:`hold_logs`, from ``build_cli`` on), and on exit everything put back as it was, so that a notebook or
    a test that calls ``main`` goes on with Lightning's and transformers' own settings."""
    request_hold()
    try:
        yield
    finally:
        release_logs()
        while _undo:
            _undo.pop()()


class _NoTip(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:  # Lightning advertises its cloud logger at every start
        return "litlogger" not in record.getMessage()


def _plain_output() -> None:
    """A command's settings of the libraries' own output, each undone by :func:`command_output`: no
    advertisement of Lightning's cloud logger (collab logs to TensorBoard) nor bitsandbytes' notices; and when
    stdout is not a terminal (a cluster job, a CI log, a pipe), no information lines from Lightning ("GPU
    available: False, used: False", "TPU available", "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES", "Seed set to 0",
    "`Trainer.fit` stopped") and no progress bars from transformers ("Loading weights"): the log holds collab's
    own lines (the configs read, each rollout's line, the results) and the libraries' warnings."""
    rank_zero, bnb = logging.getLogger("lightning.pytorch.utilities.rank_zero"), logging.getLogger("bitsandbytes")
    tip, level = _NoTip(), bnb.level
    rank_zero.addFilter(tip)
    bnb.setLevel(logging.ERROR)
    _undo.extend([lambda: rank_zero.removeFilter(tip), lambda: bnb.setLevel(level)])
    if sys.stdout.isatty():
        return
    for name in _LIGHTNING_LOGGERS:  # Lightning's import set them to INFO: after it, their warnings only
        logger = logging.getLogger(name)
        _undo.append(lambda logger=logger, level=logger.level: logger.setLevel(level))
        logger.setLevel(logging.WARNING)
    from transformers.utils import logging as transformers_logging  # imported already: build_cli loaded the algos

    if transformers_logging.is_progress_bar_enabled():
        transformers_logging.disable_progress_bar()
        _undo.append(transformers_logging.enable_progress_bar)


def hold_logs() -> None:
    """When :func:`request_hold` was called: keep Lightning's log messages and the warnings shown
    meanwhile (``No seed found``...) back, in order, until :func:`release_logs`, and set the libraries'
    output for the command (:func:`_plain_output`). Call it after Lightning is imported (its import gives
    its loggers their handlers and levels)."""
    global _held
    if _held is not None or not _requested:
        return
    _plain_output()
    hold, saved = _Hold(), []
    show_warning = warnings.showwarning

    def held_warning(message, category, filename, lineno, file=None, line=None):
        record = logging.LogRecord("py.warnings", logging.WARNING, filename, lineno, "", (), None)
        record.held_warning = (message, category, filename, lineno, file, line)
        hold.records.append(record)

    warnings.showwarning = held_warning
    for name in _LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, list(logger.handlers), logger.propagate))
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.addHandler(hold)
        logger.propagate = False
    _held = (hold, saved, show_warning)


def release_logs(show: bool = True) -> None:
    """Put Lightning's handlers back; ``show``: print the messages held so far, else drop them."""
    global _held, _requested
    _requested = False
    notes = list(_notes)
    _notes.clear()
    if show and notes and launched_rank() == 0:  # once per run, not once per process (torchrun, srun, DDP)
        import sys

        print("\n".join(notes), file=sys.stderr, flush=True)
    if _held is None:
        return
    (hold, saved, show_warning), _held = _held, None
    for logger, handlers, propagate in saved:
        logger.removeHandler(hold)
        for handler in handlers:
            logger.addHandler(handler)
        logger.propagate = propagate
    warnings.showwarning = show_warning
    if show:
        for record in hold.records:
            if hasattr(record, "held_warning"):
                show_warning(*record.held_warning)
            else:
                logging.getLogger(record.name).handle(record)


def release_callback():
    """A callback that shows the held messages when the run starts (after the team is built and a
    checkpoint restored: the last point where a bad input can still be found)."""
    from lightning.pytorch.callbacks import Callback

    class ReleaseLogs(Callback):
        def on_fit_start(self, trainer, pl_module) -> None:
            release_logs()

    return ReleaseLogs()
