"""Resumable runs: a resumed run repeats the uninterrupted one bitwise (docs/resume.md: what a checkpoint
holds, SIGTERM and SIGKILL, other world sizes).

Besides Lightning's weights, optimizer and loop state, a checkpoint holds under ``collab`` the module's
counters and every process's random state (:func:`collab.runtime.rank_state.rng_state`). The random state is
taken when the checkpoint is written and put back just before the first rollout of the resumed run
(``CollabModule.training_step``), not when the checkpoint loads: between the two, Lightning starts the
dataloader's iterator, which draws from torch's generator (an uninterrupted run drew it once, at its start).

:class:`ModelCheckpoint` makes ``last.ckpt`` hold the step a run ends at (max_steps, a stop, or SIGTERM); a
stop inside a step writes it from the last completed step's :class:`Snapshot`, so that a stop inside step
k + 1 resumes from step k whatever ``every_n_train_steps`` is. Files a run writes at its end are replaced whole
(:mod:`collab.runtime.files`), as Lightning writes checkpoints: a SIGKILL leaves the previous version.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint as _LightningModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from collab.runtime import lockstep


@dataclass
class Snapshot:
    """The checkpoint a step's end would have written (``checkpoint``, for ``path``), kept until the next step's
    end: what a stop inside the next step saves.

    Taking it costs what a save costs but the write: Lightning's ``dump_checkpoint`` (under DDP its two small
    gathers, the random states and the task streams, on every rank at the same step end). The weights and the
    optimizer's moments are only referenced, not copied, since nothing but an optimizer step changes them: the
    snapshot stays valid while ``trainer.global_step`` is ``step`` (:meth:`ModelCheckpoint.on_exception`).
    Everything else in it (random states, the task stream, counters, the callbacks' state) is copied."""

    step: int
    path: str
    checkpoint: dict


def frozen(obj: Any, shared: set[int]) -> Any:
    """``obj`` (a checkpoint) with its containers, tensors and arrays copied, except the tensors whose storage is in
    ``shared``, which stay references. Other values are kept as they are: numbers, strings and the configs of the
    hyper-parameters, which nothing changes during a step."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.untyped_storage().data_ptr() in shared else obj.detach().clone()
    if isinstance(obj, dict):
        out = copy.copy(obj)  # its own type (OrderedDict, defaultdict), its values replaced
        for key, value in obj.items():
            out[key] = frozen(value, shared)
        return out
    if isinstance(obj, list):
        return [frozen(v, shared) for v in obj]
    if isinstance(obj, tuple):
        values = (frozen(v, shared) for v in obj)
        return type(obj)(*values) if hasattr(obj, "_fields") else type(obj)(values)
    if isinstance(obj, np.ndarray):
        return obj.copy()
    return obj


def step_only_storages(trainer, pl_module) -> set[int]:
    """Storages only an optimizer step changes (or nothing): the module's parameters and the optimizers'
    state."""
    tensors = list(pl_module.parameters())
    for opt in trainer.optimizers:
        tensors += [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    tensors = [lockstep.local(t) for t in tensors]  # FSDP2's DTensors: the local shard
    return {t.untyped_storage().data_ptr() for t in tensors}


class ModelCheckpoint(_LightningModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` (same arguments) for collab's rollout loop.

    - ``every_n_train_steps`` counts optimizer updates, of which a rollout may take several: a save
      happens at the end of the rollout that reaches or passes each multiple (Lightning's test
      ``global_step % n == 0`` misses the multiples a rollout steps over);
    - ``save_last``: ``last.ckpt`` also at the step training ends (``max_steps``, a stop), so that
      resuming from it repeats nothing (Lightning writes "last" at the end only when it wrote no
      checkpoint before, leaving an earlier step in ``last.ckpt``);
    - SIGTERM: ``last.ckpt`` at the step the loop stopped at (the end of a rollout; see
      :mod:`collab.training.resume`), or a step-named checkpoint without ``save_last``; inside a step (past the
      grace), with ``save_last``, ``last.ckpt`` of the last completed step from its :class:`Snapshot`.
    """

    _start_step = 0
    _snapshot: Snapshot | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self._start_step = trainer.global_step  # a resumed run counts its multiples from here

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if pl_module.automatic_optimization:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        elif not self._should_skip_saving_checkpoint(trainer):
            step, n = trainer.global_step, self._every_n_train_steps
            if n >= 1 and step // n > max(self._last_global_step_saved, self._start_step) // n:
                candidates = self._monitor_candidates(trainer)
                if self.monitor is None or self.monitor in candidates:
                    self._save_topk_checkpoint(trainer, candidates)
                self._save_last_checkpoint(trainer, candidates)
        if self._training_ends(trainer) and not self._should_skip_saving_checkpoint(trainer):
            self._save_final(trainer)
        self._take_snapshot(trainer, pl_module)

    def _take_snapshot(self, trainer, pl_module) -> None:
        """The step's :class:`Snapshot`, when it wrote no checkpoint (``save_last`` runs only: the snapshot is
        written as ``last.ckpt``)."""
        self._snapshot = None
        step = trainer.global_step
        if not self.save_last or self._should_skip_saving_checkpoint(trainer) or self._last_global_step_saved == step:
            return
        path = self.format_checkpoint_name(self._monitor_candidates(trainer), self.CHECKPOINT_NAME_LAST)
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        self._snapshot = Snapshot(step, path, frozen(checkpoint, step_only_storages(trainer, pl_module)))

    def _save_snapshot(self, trainer) -> None:
        """Write the last completed step's snapshot (rank 0; no collective) if no optimizer step came since."""
        snap, self._snapshot = self._snapshot, None
        if snap is None or snap.step != trainer.global_step or snap.step <= self._last_global_step_saved:
            return
        trainer.strategy.save_checkpoint(snap.checkpoint, snap.path)
        self.last_model_path, self._last_global_step_saved = snap.path, snap.step

    def _save_final(self, trainer) -> None:
        candidates = self._monitor_candidates(trainer)
        if self.save_last == "link" and self.save_top_k != 0:  # the link would point at an earlier step
            self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

    @staticmethod
    def _training_ends(trainer) -> bool:
        max_steps = trainer.max_steps
        reached = max_steps is not None and max_steps >= 0 and trainer.global_step >= max_steps
        return bool(trainer.should_stop) or reached

    def on_train_end(self, trainer, pl_module) -> None:
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_final(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        from collab.preemption import mid_step

        if mid_step(exception):  # stopped inside a step: its weights and random state are not a step's
            self._save_snapshot(trainer)  # but those of the step before are
            return
        if not isinstance(exception, SIGTERMException):
            return super().on_exception(trainer, pl_module, exception)
        if trainer.sanity_checking or self._last_global_step_saved == trainer.global_step:
            return
        if self.save_last:
            self._save_final(trainer)
        else:
            self._save_checkpoint(trainer, self.format_checkpoint_name(self._monitor_candidates(trainer)))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("dirpath", self.dirpath) != self.dirpath:
            # a resumed run writes to its own version folder (Lightning would warn that the paths of the
            # previous folder are not taken over): keep only the best model's path, as Lightning does
            self.best_model_path = state_dict.get("best_model_path", self.best_model_path)
            return
        super().load_state_dict(state_dict)
