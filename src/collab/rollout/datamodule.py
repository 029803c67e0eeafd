"""RolloutDataModule: the environment and the stream of tasks the module plays, on-policy.

The dataloader yields tasks only: each training step's ``batch_size`` tasks, this process's share of
them (:func:`shard`). The module plays them itself in ``training_step`` (``rollout`` then ``prepare``,
:mod:`collab.algos.base`) with its current weights, and Lightning's ``training_step(dataloader_iter)``
fetches nothing ahead, so every rollout is on-policy. Tasks are drawn without replacement in a seeded
shuffled order (a new order every pass over the split). The stream's position (the shuffle's random
state and the rest of the pass) is part of every checkpoint (``state_dict``, one per process), so a
resumed run plays the tasks the uninterrupted run would have, with any number of processes: the
stream is the same on every process (the global batch, sharded by rank after it is drawn), so a
process the checkpoint did not have takes rank 0's position.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import lightning as L
from torch.utils.data import DataLoader, IterableDataset

from collab.envs import Env, make_env
from collab.errors import require
from collab.runtime.rank_state import gather_per_rank, tuples


class TaskStream:
    """An endless seeded stream of task batches from one split."""

    def __init__(self, tasks, batch_size: int, shuffle: bool, seed: int) -> None:
        require(len(tasks) > 0, "the task split is empty; check the dataset and split options")
        self.tasks, self.batch_size, self.shuffle = list(tasks), batch_size, shuffle
        self.rng = random.Random(seed)
        self.order: list[int] = []

    def next(self) -> list[Mapping[str, Any]]:
        batch = []
        while len(batch) < self.batch_size:
            if not self.order:
                self.order = list(range(len(self.tasks)))
                if self.shuffle:
                    self.rng.shuffle(self.order)
            batch.append(self.tasks[self.order.pop(0)])
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "order": list(self.order), "tasks": len(self.tasks)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rng.setstate(tuples(state["rng"]))
        n = state.get("tasks", len(self.tasks))
        if n != len(self.tasks):  # another split or dataset: the saved order does not index it
            warnings.warn(
                f"the checkpoint's task stream had {n} tasks, this split has {len(self.tasks)}; "
                "starting a new pass over it",
                stacklevel=2,
            )
            self.order = []
        else:
            self.order = list(state["order"])


class _Tasks(IterableDataset):
    """Endless: each step's tasks, this process's share of them."""

    def __init__(self, datamodule: RolloutDataModule) -> None:
        self.dm = datamodule

    def __iter__(self) -> Iterator[list[Mapping[str, Any]]]:
        trainer = self.dm.trainer
        require(
            self.dm.batch_size >= trainer.world_size,
            f"data.batch_size ({self.dm.batch_size}) is the global number of tasks per step and must be >= the "
            f"number of processes ({trainer.world_size}): each process plays its own share of the tasks",
        )
        while True:
            yield shard(self.dm.stream.next(), trainer.global_rank, trainer.world_size)


def shard(tasks: list, rank: int, world: int) -> list:
    """Process ``rank``'s share of a step's tasks: every ``world``-th task from its rank on (disjoint shares
    whose union is the step's batch; the stream itself is the same on every process, so a checkpoint's
    stream state resumes with any number of processes)."""
    return tasks[rank::world]


EnvOption = str | int | float | bool | list | dict | None
"""The type of a value of ``data.env_options``: the value as the YAML that gave it, a string staying that
string. Not ``Any``: jsonargparse reads a string under ``Any`` as YAML once more, which turned the quoted
splits ``"[0:8]"`` and ``"[8:10]"`` into the lists ``['0:8']`` and ``[490]`` (YAML 1.1's sexagesimal 8:10).
With ``str`` first in the union a string is kept as written; the env's own annotations then say which strings
are numbers, bools or None (:func:`collab.envs.typed_options`: ``--data.env_options.num_eval 8``)."""


class RolloutDataModule(L.LightningDataModule):
    """Environment, task stream and the on-policy dataloader."""

    def __init__(
        self,
        *,
        env: str,
        env_options: dict[str, EnvOption] | None,
        num_turns: int | None,
        batch_size: int,
        shuffle: bool,
        seed: int,
    ) -> None:
        """Every option is keyword-only and has no default here: ``conf/algo/NAME.yaml`` and ``conf/env/ENV.yaml``
        hold each value once (:func:`collab.algos.data_from_config` builds a datamodule from them in Python).

        Args:
            env: Environment name (see ``collab.envs.env_names()``): coding, competitive_coding, debate, math, matrix,
                minecraft, plan_path, search_qa, sokoban, str_build, sudoku, writing.
            env_options: Keyword options of the environment (dataset path, preset, splits...), each value as
                its YAML gave it (:data:`EnvOption`).
            num_turns: Turns per episode (the horizon H); ``None`` keeps the environment's default.
            batch_size: Tasks per training step (the rollout buffer size of CoLLM, Appendix C).
            shuffle: Draw tasks in a shuffled order.
            seed: Seed of the task order.
        """
        super().__init__()
        require(batch_size >= 1, f"data.batch_size must be >= 1, got {batch_size}")
        options = dict(env_options or {})
        if num_turns is not None:
            options["horizon"] = num_turns
        if "verifier" in options or "verifier_device" in options:  # the debate env takes a verifier object
            from collab.envs.debate.learned_verifier import with_verifier

            options = with_verifier(options)
        self.env: Env = make_env(env, **options)
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.stream = TaskStream(self.env.tasks("train"), batch_size, shuffle, seed)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Tasks(self), batch_size=None, num_workers=0, collate_fn=lambda tasks: tasks)

    def state_dict(self) -> dict[str, Any]:
        """Every process's task stream (a collective under DDP: Lightning calls it on every rank)."""
        return {"streams": gather_per_rank(self.stream.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "streams" not in state:  # a checkpoint of an earlier collab: one stream
            self.stream.load_state_dict(state)
            return
        # the stream is global (the same on every process, sharded after it): a rank the checkpoint had no
        # process for (a run moved to more processes) takes rank 0's, the same position
        rank = self.trainer.global_rank if self.trainer is not None else 0
        streams = state["streams"]
        self.stream.load_state_dict(streams[rank] if rank < len(streams) else streams[0])
