"""Lightning callbacks: adapter-only checkpoints and the end-of-run summary."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L


class AdapterCheckpoint(L.Callback):
    """Write every agent's LoRA adapter (peft format) under ``<log_dir>/adapters/``.

    ``step_<global_step>/agentI`` every ``every_n_steps`` optimizer updates (0: never) and ``last/agentI``
    when training ends; each folder loads with ``AgentTeam.load_adapters`` or peft's ``PeftModel``.
    """

    def __init__(self, every_n_steps: int = 0) -> None:
        self.every_n_steps = every_n_steps
        self._saved_at = -1

    def _folder(self, trainer: L.Trainer) -> Path:
        root = trainer.log_dir or trainer.default_root_dir
        return Path(root) / "adapters"

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every_n_steps and step and step % self.every_n_steps == 0 and step != self._saved_at and trainer.is_global_zero:
            pl_module.team.save_adapters(self._folder(trainer) / f"step_{step}")
            self._saved_at = step

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero and pl_module.team is not None:
            pl_module.team.save_adapters(self._folder(trainer) / "last")


class RewardSummary(L.Callback):
    """Track the mean reward per rollout and print first/last averages when training ends.

    The figures also go to ``<log_dir>/reward_summary.json``.
    """

    def __init__(self, window: int = 3) -> None:
        self.window = window
        self.rewards: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        value = trainer.callback_metrics.get("reward/return")
        if value is not None:
            self.rewards.append(float(value))

    def on_train_end(self, trainer, pl_module) -> None:
        if not self.rewards or not trainer.is_global_zero:
            return
        w = min(self.window, max(1, len(self.rewards) // 2))
        first, last = self.rewards[:w], self.rewards[-w:]
        summary = {"rollouts": len(self.rewards), "window": w, "first_mean": sum(first) / len(first),
                   "last_mean": sum(last) / len(last), "rewards": self.rewards}
        print(f"reward: mean of first {w} rollouts {summary['first_mean']:.4f}, "
              f"mean of last {w} rollouts {summary['last_mean']:.4f} ({len(self.rewards)} rollouts)")
        if trainer.log_dir:
            Path(trainer.log_dir).mkdir(parents=True, exist_ok=True)
            (Path(trainer.log_dir) / "reward_summary.json").write_text(json.dumps(summary, indent=2))


class EvaluationCallback(L.Callback):
    """Evaluate the team on the environment's eval split every ``every_n_steps`` optimizer updates.

    Plays ``num_samples`` episodes per eval task (:func:`collab.evaluation.evaluate`) and logs
    ``eval/pass@k`` and ``eval/acc@k`` for each k (coding), ``eval/return`` and the mean of every env
    info value at the episodes' last step (``eval/env/scheme/<name>``: the cooperation-scheme
    distribution) to the trainer's logger (TensorBoard) at the current ``global_step``. Also runs once
    when training ends (``at_end``) unless it just ran. ``max_tasks`` caps the eval tasks (None: all);
    ``tasks_per_batch`` tasks are decoded together (bounds memory).
    """

    def __init__(self, every_n_steps: int = 0, num_samples: int = 10, ks: list[int] | None = None,
                 split: str = "eval", max_tasks: int | None = None, at_end: bool = True,
                 tasks_per_batch: int | None = 4) -> None:
        from collab.errors import require

        require(every_n_steps >= 0, f"EvaluationCallback every_n_steps must be >= 0, got {every_n_steps}")
        require(num_samples >= 1, f"EvaluationCallback num_samples must be >= 1, got {num_samples}")
        self.every_n_steps, self.num_samples, self.split = every_n_steps, num_samples, split
        self.ks = list(ks or [1, 3, 5, 10])
        self.max_tasks, self.at_end, self.tasks_per_batch = max_tasks, at_end, tasks_per_batch
        self._ran_at = -1
        self.history: list[dict[str, float]] = []

    def run(self, trainer: L.Trainer, pl_module) -> dict[str, float]:
        import torch

        from collab.evaluation import evaluate, format_metrics

        tasks = list(pl_module.env.tasks(self.split))[: self.max_tasks]
        was_training = pl_module.training
        pl_module.eval()
        with torch.no_grad():
            metrics, _ = evaluate(pl_module.team, pl_module.env, tasks, self.num_samples, self.ks,
                                  pl_module.max_new_tokens, pl_module.device, self.tasks_per_batch, pl_module.protocol)
        pl_module.train(was_training)
        step = trainer.global_step
        self._ran_at = step
        self.history.append({"step": float(step), **metrics})
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
        trainer.callback_metrics.update({k: torch.tensor(v) for k, v in metrics.items()})
        if trainer.is_global_zero:
            print(f"evaluation at step {step} ({len(tasks)} {self.split} tasks x {self.num_samples} samples):\n"
                  + format_metrics(metrics))
        return metrics

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every_n_steps and step and step % self.every_n_steps == 0 and step != self._ran_at:
            self.run(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.at_end and trainer.global_step != self._ran_at and pl_module.team is not None:
            self.run(trainer, pl_module)
