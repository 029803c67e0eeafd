"""The option groups several algorithms share, each a dataclass the algorithms take whole: ``model.ppo`` (every
algorithm) and ``model.value_head`` (the MLP value heads of MAPoRL and MARFT). The fields have no defaults: each
value is written once, with its meaning, in ``conf/algo/ALGO.yaml``; a partial override (``--model.ppo.clip 0.1``,
a preset that sets ``ppo.num_epochs`` only) keeps the other fields from there."""

from __future__ import annotations

from dataclasses import dataclass

from collab.errors import require_ranges


@dataclass
class PPOOptions:
    gamma: float
    clip: float
    num_epochs: int
    minibatch_size: int | None

    def check(self) -> None:
        require_ranges(
            vars(self), unit=("gamma",), positive=("clip",), counts=("num_epochs", "minibatch_size"), prefix="model.ppo"
        )


@dataclass
class ValueHeadOptions:
    lr: float
    hidden: list[int]
    coef: float

    def check(self) -> None:
        require_ranges(
            vars(self), positive=("lr",), non_negative=("coef",), widths=("hidden",), prefix="model.value_head"
        )
