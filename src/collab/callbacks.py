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
