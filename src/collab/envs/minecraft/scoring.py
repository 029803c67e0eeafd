"""How close a built world is to the target (CoLLM, Section 5.1 IoU, Appendix F.3 reward).

With ``T`` the target's non-air positions and ``B`` the built world's non-air positions:

- ``coverage = |{p in T: built[p] == target[p]}| / |T|`` (F.3 coverage rate; 1.0 for an all-air target);
- ``redundancy = |{p in B: built[p] != target[p]}| / |B|`` — placed blocks where the target is air
  or another block, over all placed blocks (F.3 redundancy rate; 0.0 when nothing is placed);
- ``iou = |{p in B and T: built[p] == target[p]}| / |B or T|`` (Section 5.1's IoU over non-air
  blocks; the block type must match; :func:`collab.evaluation.metrics.voxel_iou`);
- ``score = |{p in bbox: built[p] == target[p]}| / |bbox|`` (air counts, as the CoLLM reference code scores).

The paper names the two rates of F.3 without their weights. collab's turn reward is
``coverage - redundancy_weight * redundancy - spider penalty`` with ``redundancy_weight = 0.5``:
at most 1.0 (an exact build, no damage), 0.0 for building nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from collab.envs.minecraft.world import House
from collab.evaluation.metrics import voxel_iou

REDUNDANCY_WEIGHT = 0.5


@dataclass(frozen=True)
class Measures:
    iou: float
    coverage: float
    redundancy: float
    score: float
    correct: int
    """Target blocks built right."""
    target_blocks: int
    placed: int
    wrong: int
    """Placed blocks that the target does not have there."""


def as_tensor(house: House, voxels: bytes) -> torch.Tensor:
    """``voxels`` as a ``uint8`` tensor of shape ``house.size`` (a copy: the bytes stay immutable)."""
    return torch.frombuffer(bytearray(voxels), dtype=torch.uint8).view(*house.size)


def measure(house: House, built: bytes) -> Measures:
    """Coverage, redundancy, IoU and score of ``built`` against ``house.target`` (module docstring)."""
    target = house.target
    correct = sum(1 for b, t in zip(built, target) if t and b == t)
    target_blocks = sum(1 for t in target if t)
    placed = sum(1 for b in built if b)
    wrong = sum(1 for b, t in zip(built, target) if b and b != t)
    same = sum(1 for b, t in zip(built, target) if b == t)
    return Measures(
        iou=float(voxel_iou(as_tensor(house, built), as_tensor(house, target))),
        coverage=correct / target_blocks if target_blocks else 1.0,
        redundancy=wrong / placed if placed else 0.0,
        score=same / house.volume,
        correct=correct, target_blocks=target_blocks, placed=placed, wrong=wrong,
    )


def build_reward(m: Measures, redundancy_weight: float = REDUNDANCY_WEIGHT) -> float:
    """F.3 construction term: ``coverage - redundancy_weight * redundancy``."""
    return m.coverage - redundancy_weight * m.redundancy
