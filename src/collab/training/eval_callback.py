"""The held-out evaluation during training (:class:`EvaluationCallback`): the team on the env's eval split
before, during and after training, and the before/after comparison with standard errors."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import replace

import lightning as L

from collab import preemption
from collab.runtime.memory import release
from collab.training.artifacts import update_summary


class EvaluationCallback(L.Callback):
    """Evaluate the team on the environment's eval split: before training (``at_start``), every
    ``every_n_steps`` optimizer updates and when training ends (``at_end``, unless it just ran).

    Plays ``num_samples`` episodes per eval task (:func:`collab.evaluation.heldout.evaluate`, whose batches of
    ``tasks_per_batch`` tasks are the unit of seeding and of the processes' shares) and logs the ``eval/...``
    metrics at the current ``global_step`` with ``eval/score`` / ``eval/score_se``; with ``at_start`` the end of
    training prints the before/after comparison, also written to ``reward_summary.json`` under ``held_out``.
    ``greedy``, ``seed`` and what is logged and printed: docs/evaluation.md#held-out-evaluation-during-training.
    """

    def __init__(
        self,
        every_n_steps: int = 0,
        num_samples: int = 10,
        ks: list[int] | None = None,
        split: str = "eval",
        max_tasks: int | None = None,
        at_end: bool = True,
        tasks_per_batch: int | None = 4,
        at_start: bool = False,
        greedy: bool = False,
        seed: int | None = None,
        score: str | None = None,
    ) -> None:
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

        from collab.evaluation.heldout import (
            evaluate_records,
            format_metrics,
            format_se,
            mean_se,
            record_score_key,
            record_scores,
        )

        tasks = list(pl_module.env.tasks(self.split))[: self.max_tasks]
        was_training = pl_module.training
        pl_module.eval()
        start = time.perf_counter()
        # the batches seed themselves from self.seed; a SIGTERM stops inside (collab.preemption)
        with torch.no_grad(), self._decoding(pl_module), preemption.phase("evaluation"):
            metrics, records, _ = evaluate_records(
                pl_module.team,
                pl_module.env,
                tasks,
                self.num_samples,
                self.ks,
                pl_module.max_new_tokens,
                pl_module.device,
                self.tasks_per_batch,
                pl_module.protocol,
                self.seed,
            )
        pl_module.train(was_training)
        release()  # the evaluation's KV caches back to the OS before training goes on (collab.runtime.memory)
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
            how = (
                "greedy"
                if self.greedy
                else f"{self.num_samples} samples" + (f", seed {self.seed}" if self.seed is not None else "")
            )
            n = len(records)
            print(
                f"evaluation at step {step} ({n} {self.split} tasks x {self.num_samples} samples) ({how}; "
                f"{seconds:.0f} s):\n"
                + format_metrics(metrics)
                + f"\n{self._label()} {format_se(metrics['eval/score'], metrics['eval/score_se'], n)}"
                + (f" (SE over {n} problems)" if n >= 2 else ""),
                flush=True,
            )
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
            "split": self.split,
            "problems": problems,
            "samples": self.num_samples,
            "greedy": self.greedy,
            "seed": self.seed,
            "score": self.score,
            "before": first["eval/score"],
            "before_se": finite(first["eval/score_se"]),
            "before_step": int(first["step"]),
            "after": last["eval/score"],
            "after_se": finite(last["eval/score_se"]),
            "after_step": int(last["step"]),
            "gain": gain,
            "gain_se": gain_se,
            "gain_z": z,
            "se": "per-problem: sample std (ddof 1) of the problems' scores / sqrt(problems); gain: the same "
            "over the paired per-problem differences after - before; null below 2 problems",
            "eval_seconds": [h["seconds"] for h in self.history],
        }
        if trainer.is_global_zero:
            how = "greedy" if self.greedy else f"{self.num_samples} samples"
            if gain_se is None:
                figures = (
                    f"before {self.held_out['before']:.4f}, after {self.held_out['after']:.4f}, gain {gain:+.4f} "
                    f"({problems} eval problem{'' if problems == 1 else 's'}: no standard error)"
                )
            else:
                figures = (
                    f"before {format_se(self.held_out['before'], self.held_out['before_se'], problems)}, "
                    f"after {format_se(self.held_out['after'], self.held_out['after_se'], problems)}, "
                    f"gain {gain:+.4f} ± {gain_se:.4f} ({z:.1f} SE)"
                )
            print(
                f"held-out {self._label()} ({problems} {self.split} problem{'' if problems == 1 else 's'}, {how}): "
                f"{figures}",
                flush=True,
            )
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
