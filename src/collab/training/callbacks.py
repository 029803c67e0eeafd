"""The Lightning callbacks that configs name by class path, ``collab.training.callbacks.<Name>``
(``conf/base.yaml``, the presets, ``collab.compare``): one place for those names, whichever module of
``training/`` defines the class.

- :class:`ModelCheckpoint` (:mod:`collab.training.resume`): ``last.ckpt``, the save on SIGTERM, exact resume;
- :class:`AdapterCheckpoint` and :class:`RewardSummary` (:mod:`collab.training.artifacts`): the adapters and
  ``reward_summary.json`` in the log folder (:func:`update_summary` merges into the latter);
- :class:`EvaluationCallback` (:mod:`collab.training.eval_callback`): held-out evaluation, before/after.

The progress display that ``collab.fit`` adds is in :mod:`collab.training.progress`.
"""

from __future__ import annotations

from collab.training.artifacts import AdapterCheckpoint, RewardSummary, update_summary
from collab.training.eval_callback import EvaluationCallback
from collab.training.resume import ModelCheckpoint

__all__ = ["AdapterCheckpoint", "EvaluationCallback", "ModelCheckpoint", "RewardSummary", "update_summary"]
