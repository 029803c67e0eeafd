"""What a run leaves in its log folder besides checkpoints: every agent's LoRA adapters
(:class:`AdapterCheckpoint`) and ``reward_summary.json`` (:class:`RewardSummary`, :func:`update_summary`)."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

from collab import preemption
from collab.runtime import lockstep
from collab.runtime.files import atomic_write_text, replace_folder


class AdapterCheckpoint(L.Callback):
    """Write every agent's LoRA adapter (peft format) under ``<log_dir>/adapters/``.

    ``step_<global_step>/agentI`` every ``every_n_steps`` optimizer updates (0: never) and ``last/agentI``
    when training ends or stops on SIGTERM; each folder loads with ``AgentTeam.load_adapters`` or peft's
    ``PeftModel``. ``last`` is replaced whole (:func:`collab.runtime.files.replace_folder`).
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
            export(trainer, pl_module.team, self._folder(trainer) / f"step_{step}")  # every rank: log_dir broadcasts
            self._saved_at = step

    def _save_last(self, trainer, pl_module) -> None:
        if pl_module.team is not None:
            export(trainer, pl_module.team, self._folder(trainer) / "last")  # every rank: log_dir broadcasts

    def on_train_end(self, trainer, pl_module) -> None:
        self._save_last(trainer, pl_module)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # stopped between rollouts: whole adapters (not inside a step: collab.preemption)
        if isinstance(exception, SIGTERMException) and not preemption.mid_step(exception):
            self._save_last(trainer, pl_module)


def export(trainer: L.Trainer, team, folder: Path) -> None:
    """Rank 0 writes ``team``'s adapters to ``folder``; when the models are sharded (FSDP2) every process takes part
    in gathering them whole (collectives), after serving the others' forwards."""
    sharded = lockstep.active() is not None
    if sharded:
        lockstep.settle()
    if trainer.is_global_zero:
        replace_folder(folder, team.save_adapters)
    elif sharded:
        team.save_adapters(folder, write=False)


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
        summary = {
            "rollouts": len(self.rewards),
            "window": w,
            "first_mean": sum(first) / len(first),
            "last_mean": sum(last) / len(last),
            "rewards": self.rewards,
        }
        if announce and trainer.is_global_zero:
            print(
                f"reward: mean of first {w} rollouts {summary['first_mean']:.4f}, "
                f"mean of last {w} rollouts {summary['last_mean']:.4f} ({len(self.rewards)} rollouts)",
                flush=True,
            )
        update_summary(trainer, summary)
