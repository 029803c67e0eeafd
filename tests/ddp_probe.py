"""A callback for the multi-process tests (tests/test_ddp.py): each rank records the tasks it played and a
digest of its trainable weights after every optimizer step, in ``$COLLAB_DDP_PROBE/rank<r>.json``."""

import hashlib
import json
import os
from pathlib import Path

import lightning as L


class Probe(L.Callback):
    def __init__(self) -> None:
        self.tasks: list[list[str]] = []
        self.digests: list[str] = []

    def setup(self, trainer, pl_module, stage) -> None:
        rollout = pl_module.rollout

        def recording(env, tasks):
            self.tasks.append([json.dumps(t, sort_keys=True, default=str) for t in tasks])
            return rollout(env, tasks)
        pl_module.rollout = recording

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        h = hashlib.sha256()
        for name, p in sorted(pl_module.named_parameters()):
            if p.requires_grad:
                h.update(name.encode())
                h.update(p.detach().cpu().numpy().tobytes())
        self.digests.append(h.hexdigest())

    def on_train_end(self, trainer, pl_module) -> None:
        out = Path(os.environ["COLLAB_DDP_PROBE"]) / f"rank{trainer.global_rank}.json"
        out.write_text(json.dumps({"tasks": self.tasks, "digests": self.digests, "step": trainer.global_step}))
