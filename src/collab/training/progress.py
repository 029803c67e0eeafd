"""The progress display of a run: a rich bar on a terminal (:class:`RolloutBar`), one plain line per
rollout otherwise (:class:`RolloutLines`); :func:`progress_callback` picks one."""

from __future__ import annotations

import sys
import time

from lightning.pytorch.callbacks import ProgressBar, RichProgressBar


def _figure(metrics, key: str) -> float | None:
    value = metrics.get(key)
    return None if value is None else float(value)


class RolloutLines(ProgressBar):
    """One plain line per rollout, for logs (a cluster job, CI): where stdout is not a terminal a
    redrawn bar prints nothing readable for minutes.

    ``step 3/12  reward 0.2500  tokens/s 41.3  rollout 17.2 s  step 26.4 s  elapsed 1:19``: the
    optimizer step, the rollout's mean return, its decoding throughput and time, the wall time of the
    whole step (rollout and update) and since training started. ``every_n_steps`` thins the lines.
    """

    def __init__(self, every_n_steps: int = 1, stream=None) -> None:
        super().__init__()
        self.every_n_steps = max(1, every_n_steps)
        self.stream = stream
        self._enabled = True
        self._start = self._last = 0.0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _print(self, line: str) -> None:
        print(line, file=self.stream or sys.stdout, flush=True)

    def on_train_start(self, trainer, pl_module) -> None:
        self._start = self._last = time.perf_counter()
        if self._enabled and trainer.is_global_zero:
            total = f" of {trainer.max_steps}" if trainer.max_steps and trainer.max_steps > 0 else ""
            self._print(f"training from step {trainer.global_step}{total}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        step_s, self._last = now - self._last, now
        step = trainer.global_step
        if not self._enabled or not trainer.is_global_zero or step % self.every_n_steps:
            return
        metrics = trainer.callback_metrics
        total = f"/{trainer.max_steps}" if trainer.max_steps and trainer.max_steps > 0 else ""
        parts = [f"step {step}{total}"]
        for key, label, fmt in (
            ("reward/return", "reward", "{:.4f}"),
            ("rollout/tokens_per_s", "tokens/s", "{:.1f}"),
            ("rollout/seconds", "rollout", "{:.1f} s"),
        ):
            value = _figure(metrics, key)
            if value is not None:
                parts.append(f"{label} {fmt.format(value)}")
        elapsed = int(now - self._start)
        parts += [f"step {step_s:.1f} s", f"elapsed {elapsed // 60}:{elapsed % 60:02d}"]
        self._print("  ".join(parts))


class RolloutBar(RichProgressBar):
    """Lightning's rich bar without what means nothing for rollouts: no "Epoch 0/-2" (training is one
    endless epoch ended by ``max_steps``), no it/s column (a rollout takes seconds to minutes), no
    ``v_num``; the bar counts optimizer steps out of ``max_steps`` and shows the reward and tokens/s."""

    def _get_train_description(self, current_epoch: int) -> str:
        return "rollouts"

    @property
    def total_train_batches(self):
        trainer = self.trainer
        if trainer.max_steps and trainer.max_steps > 0:
            return trainer.max_steps
        return super().total_train_batches

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.is_disabled and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        self._update(self.train_progress_bar_id, trainer.global_step)
        self._update_metrics(trainer, pl_module)
        self.refresh()

    def get_metrics(self, trainer, pl_module):
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items

    def configure_columns(self, trainer) -> list:
        from lightning.pytorch.callbacks.progress.rich_progress import ProcessingSpeedColumn

        return [c for c in super().configure_columns(trainer) if not isinstance(c, ProcessingSpeedColumn)]


def progress_callback(stream=None) -> ProgressBar:
    """The progress display ``collab.fit`` adds: :class:`RolloutBar` on a terminal, :class:`RolloutLines`
    when stdout is not one (or rich is missing)."""
    from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

    stream = stream or sys.stdout
    isatty = getattr(stream, "isatty", None)
    if _RICH_AVAILABLE and callable(isatty) and isatty():
        return RolloutBar()
    return RolloutLines()
