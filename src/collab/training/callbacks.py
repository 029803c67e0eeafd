"""Lightning callbacks: adapter-only checkpoints, the end-of-run summary, held-out evaluation
(before/after training, with standard errors) and the progress display (a rich bar on a terminal, one
plain line per rollout otherwise)."""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar
from lightning.pytorch.utilities.exceptions import SIGTERMException

from collab import preemption
from collab.training.resume import ModelCheckpoint, atomic_write_text, replace_folder  # noqa: F401 (configs name ModelCheckpoint)
from collab.training.memory import release


class AdapterCheckpoint(L.Callback):
    """Write every agent's LoRA adapter (peft format) under ``<log_dir>/adapters/``.

    ``step_<global_step>/agentI`` every ``every_n_steps`` optimizer updates (0: never) and ``last/agentI``
    when training ends or stops on SIGTERM; each folder loads with ``AgentTeam.load_adapters`` or peft's
    ``PeftModel``. ``last`` is replaced whole (:func:`collab.training.resume.replace_folder`).
    """

    def __init__(self, every_n_steps: int = 0) -> None:
        self.every_n_steps = every_n_steps
        self._saved_at = -1

    def _folder(self, trainer: L.Trainer) -> Path:
        root = trainer.log_dir or trainer.default_root_dir
        return Path(root) / "adapters"

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every_n_steps and step and step % self.every_n_steps == 0 and step != self._saved_at:
            folder = self._folder(trainer) / f"step_{step}"  # on every rank: log_dir broadcasts
            if trainer.is_global_zero:
                replace_folder(folder, pl_module.team.save_adapters)
            self._saved_at = step

    def _save_last(self, trainer, pl_module) -> None:
        folder = self._folder(trainer) / "last"  # on every rank: log_dir broadcasts
        if trainer.is_global_zero and pl_module.team is not None:
            replace_folder(folder, pl_module.team.save_adapters)

    def on_train_end(self, trainer, pl_module) -> None:
        self._save_last(trainer, pl_module)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # stopped between rollouts: whole adapters (not inside a step: collab.preemption)
        if isinstance(exception, SIGTERMException) and not preemption.mid_step(exception):
            self._save_last(trainer, pl_module)


def update_summary(trainer: L.Trainer, entries: dict) -> None:
    """Merge ``entries`` into ``<log_dir>/reward_summary.json`` (several callbacks write parts of it)."""
    log_dir = trainer.log_dir  # on every rank: it broadcasts
    if not log_dir or not trainer.is_global_zero:
        return
    path = Path(log_dir) / "reward_summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    summary.update(entries)
    atomic_write_text(path, json.dumps(summary, indent=2))  # a run killed meanwhile leaves the old file whole


class RewardSummary(L.Callback):
    """Track the mean reward per rollout and print first/last averages when training ends.

    The figures also go to ``<log_dir>/reward_summary.json``, rewritten whole (write, then rename) after
    every rollout: a run stopped in any way (SIGTERM, an error, SIGKILL) leaves a valid file with the
    rollouts it completed. The rewards are part of the checkpoint (``state_dict``), so a resumed run
    (``--ckpt_path``) continues the list: its ``reward_summary.json`` (in the resumed run's new
    ``version_N``) covers every rollout from the first, as the uninterrupted run's would.
    """

    def __init__(self, window: int = 3) -> None:
        self.window = window
        self.rewards: list[float] = []

    def state_dict(self) -> dict:
        return {"rewards": list(self.rewards)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.rewards = [float(r) for r in state_dict.get("rewards", [])]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        value = trainer.callback_metrics.get("reward/return")
        if value is not None:
            self.rewards.append(float(value))
        self.write(trainer, announce=False)

    def on_train_end(self, trainer, pl_module) -> None:
        self.write(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not preemption.mid_step(exception):  # inside a step: the file already holds every completed rollout
            self.write(trainer)

    def write(self, trainer: L.Trainer, announce: bool = True) -> None:
        """Write ``reward_summary.json`` (on every rank's call: the log folder is broadcast); ``announce``:
        also print the first/last means."""
        if not self.rewards:
            return
        w = min(self.window, max(1, len(self.rewards) // 2))
        first, last = self.rewards[:w], self.rewards[-w:]
        summary = {"rollouts": len(self.rewards), "window": w, "first_mean": sum(first) / len(first),
                   "last_mean": sum(last) / len(last), "rewards": self.rewards}
        if announce and trainer.is_global_zero:
            print(f"reward: mean of first {w} rollouts {summary['first_mean']:.4f}, "
                  f"mean of last {w} rollouts {summary['last_mean']:.4f} ({len(self.rewards)} rollouts)", flush=True)
        update_summary(trainer, summary)


class EvaluationCallback(L.Callback):
    """Evaluate the team on the environment's eval split: before training (``at_start``), every
    ``every_n_steps`` optimizer updates and when training ends (``at_end``, unless it just ran).

    Plays ``num_samples`` episodes per eval task (:func:`collab.evaluation.heldout.evaluate`) and logs
    ``eval/pass@k`` and ``eval/acc@k`` for each k (coding), ``eval/return`` and the mean of every env
    info value at the episodes' last step (``eval/env/scheme/<name>``: the cooperation-scheme
    distribution) to the trainer's logger (TensorBoard) at the current ``global_step``, and
    ``eval/score`` / ``eval/score_se``: the mean per-problem score and its standard error. The score
    (``score``) is ``solved`` (accuracy) where the env reports it, else the return; a problem's score
    is the mean over its samples and the SE is the per-problem one, ``s / sqrt(n)`` over the n problems
    (``s``: the sample standard deviation; :class:`collab.evaluation.heldout.MeanSE`).

    With ``at_start``, the end of training prints the held-out comparison, e.g.
    ``held-out accuracy (128 eval problems, greedy): before 0.1250 ± 0.0292, after 0.3047 ± 0.0407,
    gain 0.1797 ± 0.0390 (4.6 SE)``: the gain's SE is that of the mean of the paired per-problem
    differences (after - before), and ``(z SE)`` is gain / SE. The figures also go to
    ``reward_summary.json`` under ``held_out``.

    ``greedy`` decodes every agent at temperature 0 for the evaluation; ``seed`` (sampled evaluation)
    draws each batch's samples from a generator seeded from (``seed``, the batch's index), the same draws
    at every evaluation and at any world size; with ``seed: null`` a sampled evaluation draws from the
    training's random stream and is not reproducible across world sizes. Either way (seed or greedy) the
    training's random stream is left as it was. ``max_tasks`` caps the eval tasks (None: all);
    ``tasks_per_batch`` consecutive tasks are decoded together (bounds memory) and form the unit of
    seeding. Under DDP process r plays the batches b with ``b % world_size == r``, every task's record is
    gathered to every process and each computes the figures over all tasks, each task scored once
    (:func:`collab.evaluation.heldout.play_records`): the same figures as on one process. With one eval
    task there is no standard error: the lines say so instead of ``± nan``.
    """

    def __init__(self, every_n_steps: int = 0, num_samples: int = 10, ks: list[int] | None = None,
                 split: str = "eval", max_tasks: int | None = None, at_end: bool = True,
                 tasks_per_batch: int | None = 4, at_start: bool = False, greedy: bool = False,
                 seed: int | None = None, score: str | None = None) -> None:
        from collab.errors import require

        require(every_n_steps >= 0, f"EvaluationCallback every_n_steps must be >= 0, got {every_n_steps}")
        require(num_samples >= 1, f"EvaluationCallback num_samples must be >= 1, got {num_samples}")
        require(max_tasks is None or max_tasks >= 1, f"EvaluationCallback max_tasks must be >= 1, got {max_tasks}")
        self.every_n_steps, self.num_samples, self.split = every_n_steps, num_samples, split
        self.ks = [k for k in (ks or [1, 3, 5, 10]) if k <= num_samples] or [1]
        self.max_tasks, self.at_end, self.tasks_per_batch = max_tasks, at_end, tasks_per_batch
        self.at_start, self.greedy, self.seed, self.score = at_start, greedy, seed, score
        self._ran_at = -1
        self.history: list[dict[str, float]] = []
        self.scores: list[list[float]] = []
        """Each evaluation's per-problem scores (every task's, in task order, on every process)."""
        self.held_out: dict | None = None

    @contextlib.contextmanager
    def _decoding(self, pl_module):
        """Greedy agents and/or a seeded random stream for the evaluation; restored afterwards."""
        import torch

        specs = getattr(pl_module.team, "specs", [])
        saved = [spec.sampling for spec in specs]
        devices = [pl_module.device] if pl_module.device.type == "cuda" else []
        with contextlib.ExitStack() as stack:
            if self.seed is not None or self.greedy:
                stack.enter_context(torch.random.fork_rng(devices=devices))
                if self.seed is not None:
                    torch.manual_seed(self.seed)
            if self.greedy:
                for spec in specs:
                    spec.sampling = replace(spec.sampling, temperature=0.0)
            try:
                yield
            finally:
                for spec, sampling in zip(specs, saved):
                    spec.sampling = sampling

    def _label(self) -> str:
        return "accuracy" if self.score == "solved" else ("return" if self.score == "return" else self.score)

    def run(self, trainer: L.Trainer, pl_module) -> dict[str, float]:
        import torch

        from collab.evaluation.heldout import evaluate_records, format_metrics, format_se, mean_se, record_score_key, record_scores

        tasks = list(pl_module.env.tasks(self.split))[: self.max_tasks]
        was_training = pl_module.training
        pl_module.eval()
        start = time.perf_counter()
        # the batches seed themselves from self.seed; a SIGTERM stops inside (collab.preemption)
        with torch.no_grad(), self._decoding(pl_module), preemption.phase("evaluation"):
            metrics, records, _ = evaluate_records(pl_module.team, pl_module.env, tasks, self.num_samples, self.ks,
                                                   pl_module.max_new_tokens, pl_module.device, self.tasks_per_batch,
                                                   pl_module.protocol, self.seed)
        pl_module.train(was_training)
        release()  # the evaluation's KV caches back to the OS before training goes on (collab.training.memory)
        seconds = time.perf_counter() - start
        self.score = self.score or record_score_key(records)
        scores = record_scores(records, self.score)  # every task's, in task order, on every process
        self.scores.append(scores)
        metrics["eval/score"], metrics["eval/score_se"] = mean_se(scores, pl_module.device)
        step = trainer.global_step
        self._ran_at = step
        self.history.append({"step": float(step), "seconds": seconds, **metrics})
        logged = {k: v for k, v in metrics.items() if k != "eval/score_se" or math.isfinite(v)}
        for logger in trainer.loggers:
            logger.log_metrics(logged, step=step)
        trainer.callback_metrics.update({k: torch.tensor(v) for k, v in logged.items()})
        if trainer.is_global_zero:
            how = "greedy" if self.greedy else f"{self.num_samples} samples" + (f", seed {self.seed}" if self.seed is not None else "")
            n = len(records)
            print(f"evaluation at step {step} ({n} {self.split} tasks x {self.num_samples} samples) ({how}; "
                  f"{seconds:.0f} s):\n" + format_metrics(metrics)
                  + f"\n{self._label()} {format_se(metrics['eval/score'], metrics['eval/score_se'], n)}"
                  + (f" (SE over {n} problems)" if n >= 2 else ""), flush=True)
        return metrics

    def compare(self, trainer: L.Trainer, pl_module) -> dict | None:
        """The first evaluation (before training) against the last: means, SEs and the paired gain.

        The scores are every task's on every process (:meth:`run`), so the figures need no collective.
        Below two problems there is no standard error: the SEs and ``gain_z`` are ``None`` (null in
        ``reward_summary.json``) and the line says why."""
        from collab.evaluation.heldout import format_se, mean_se

        if len(self.scores) < 2:
            return None
        before, after = self.scores[0], self.scores[-1]
        gain, gain_se = mean_se([a - b for a, b in zip(after, before)], pl_module.device)
        first, last = self.history[0], self.history[-1]

        def finite(x: float) -> float | None:
            return x if math.isfinite(x) else None

        gain_se = finite(gain_se)
        if gain_se is None:
            z = None
        else:
            z = gain / gain_se if gain_se > 0 else (math.inf if gain > 0 else (-math.inf if gain < 0 else 0.0))
        problems = int(first["eval/problems"])
        self.held_out = {
            "split": self.split, "problems": problems, "samples": self.num_samples,
            "greedy": self.greedy, "seed": self.seed, "score": self.score,
            "before": first["eval/score"], "before_se": finite(first["eval/score_se"]), "before_step": int(first["step"]),
            "after": last["eval/score"], "after_se": finite(last["eval/score_se"]), "after_step": int(last["step"]),
            "gain": gain, "gain_se": gain_se, "gain_z": z,
            "se": "per-problem: sample std (ddof 1) of the problems' scores / sqrt(problems); gain: the same "
                  "over the paired per-problem differences after - before; null below 2 problems",
            "eval_seconds": [h["seconds"] for h in self.history],
        }
        if trainer.is_global_zero:
            how = "greedy" if self.greedy else f"{self.num_samples} samples"
            if gain_se is None:
                figures = (f"before {self.held_out['before']:.4f}, after {self.held_out['after']:.4f}, gain {gain:+.4f} "
                           f"({problems} eval problem{'' if problems == 1 else 's'}: no standard error)")
            else:
                figures = (f"before {format_se(self.held_out['before'], self.held_out['before_se'], problems)}, "
                           f"after {format_se(self.held_out['after'], self.held_out['after_se'], problems)}, "
                           f"gain {gain:+.4f} ± {gain_se:.4f} ({z:.1f} SE)")
            print(f"held-out {self._label()} ({problems} {self.split} problem{'' if problems == 1 else 's'}, {how}): {figures}", flush=True)
        update_summary(trainer, {"held_out": self.held_out})
        return self.held_out

    def on_train_start(self, trainer, pl_module) -> None:
        if self.at_start and pl_module.team is not None:
            self.run(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every_n_steps and step and step % self.every_n_steps == 0 and step != self._ran_at:
            self.run(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if pl_module.team is None:
            return
        if self.at_end and trainer.global_step != self._ran_at:
            self.run(trainer, pl_module)
        if self.at_start:
            self.compare(trainer, pl_module)


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
        for key, label, fmt in (("reward/return", "reward", "{:.4f}"), ("rollout/tokens_per_s", "tokens/s", "{:.1f}"),
                                ("rollout/seconds", "rollout", "{:.1f} s")):
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
