"""How close a built world is to the target (CoLLM, Section 5.1 IoU, Appendix F.3 reward).

With ``T`` the target's non-air positions and ``B`` the built world's non-air positions:

- ``coverage = |{p in T: built[p] == target[p]}| / |T|`` (F.3 coverage rate; 1.0 for an all-air target);
- ``redundancy = |{p in B: built[p] != target[p]}| / |B|`` — placed blocks where the target is air
  or another block, over all placed blocks (F.3 redundancy rate; 0.0 when nothing is placed);
- ``iou = |{p in B and T: built[p] == target[p]}| / |B or T|`` (Section 5.1's IoU over non-air
  blocks; the block type must match; :func:`voxel_iou`, also the evaluation's ``IoU`` metric);
- ``score = |{p in bbox: built[p] == target[p]}| / |bbox|`` (air counts, as the CoLLM reference code scores).

The paper names the two rates of F.3 without their weights. collab's turn reward is
``coverage - redundancy_weight * redundancy - spider penalty`` with ``redundancy_weight = 0.5``:
at most 1.0 (an exact build, no damage), 0.0 for building nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from collab.envs.minecraft.world import House

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


def voxel_iou(built: Tensor, target: Tensor, air: int = 0) -> Tensor:
    """Intersection over union of two voxel grids of block ids over their non-air blocks (CoLLM,
    Section 5.1, HouseBuild), as a float64 scalar.

    A position is in the intersection when both grids hold the same non-air block there (the block
    type must match) and in the union when either holds a non-air block. Two all-air grids give 1.0.
    Raises ValueError when the shapes differ.
    """
    built = torch.as_tensor(built)
    target = torch.as_tensor(target, device=built.device)
    if built.shape != target.shape:
        raise ValueError(f"built {tuple(built.shape)} and target {tuple(target.shape)} voxels differ in shape")
    solid_b, solid_t = built != air, target != air
    inter = (solid_b & solid_t & (built == target)).sum(dtype=torch.int64)
    union = (solid_b | solid_t).sum(dtype=torch.int64)
    if union == 0:
        return torch.tensor(1.0, dtype=torch.float64, device=built.device)
    return inter.to(torch.float64) / union.to(torch.float64)


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
        correct=correct,
        target_blocks=target_blocks,
        placed=placed,
        wrong=wrong,
    )


def build_reward(m: Measures, redundancy_weight: float = REDUNDANCY_WEIGHT) -> float:
    """F.3 construction term: ``coverage - redundancy_weight * redundancy``."""
    return m.coverage - redundancy_weight * m.redundancy
