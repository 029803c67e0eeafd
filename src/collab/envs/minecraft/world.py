"""The voxel world of HouseBuild (CoLLM, Section 5.1 and Appendix E.3).

A :class:`House` is one task: a legend (letter -> block name), a size ``(X, Y, Z)``, the world
position of its bounding box's ``from`` corner and the target voxels. The bbox is inclusive:
``from`` to ``from + size - 1``. Voxels are stored as immutable ``bytes``, one byte per position
holding an index into :attr:`House.palette` (``palette[0]`` is always ``air``), in C order over
``(x, y, z)`` local offsets, so ``torch.frombuffer(...).view(X, Y, Z)`` gives the grid. Keeping the
world a ``bytes`` value keeps :class:`~collab.envs.base.EnvState` a value: a rollout tree can branch
one state without copying or sharing a mutable array.

Layout of the data format (``target_spec.type == "y_layers"``): each layer ``{"y", "rows"}`` holds
``Z`` rows (``rows[z]``) of ``X`` characters (``rows[z][x]``); ``y`` is the layer's offset from the
bbox ``from`` corner. The prompt (E.3) shows layers as rectangles in WORLD ``(x, z)`` coordinates:
:func:`rectangles` compresses a layer greedily (grow along x, then along z).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

AIR = "air"
Vec = tuple[int, int, int]


def normalize_block(name: str) -> str:
    """``"minecraft:Stone_Stairs[facing=north]"`` -> ``"stone_stairs"`` (prefix and block states dropped,
    lower case). The simulator keeps block types only, not their states (orientation, waterlogging)."""
    name = name.strip().lower()
    name = name.split("[", 1)[0]
    return name.removeprefix("minecraft:").strip()


@dataclass(frozen=True)
class House:
    """One HouseBuild task: the target structure and its bbox (build it with
    :func:`collab.envs.minecraft.tasks.house_from_record`)."""

    task_id: str
    legend: tuple[tuple[str, str], ...]
    """(letter, block name) pairs, in the file's order; air is a block like any other."""
    size: Vec
    origin: Vec
    """WORLD coordinates of the bbox ``from`` corner."""
    palette: tuple[str, ...]
    """Block names by id; ``palette[0] == "air"``, then the legend's other blocks in legend order."""
    target: bytes

    @property
    def corner(self) -> Vec:
        """WORLD coordinates of the bbox ``to`` corner (inclusive)."""
        return tuple(o + s - 1 for o, s in zip(self.origin, self.size))  # type: ignore[return-value]

    @property
    def volume(self) -> int:
        x, y, z = self.size
        return x * y * z

    @property
    def blocks(self) -> tuple[str, ...]:
        """The non-air blocks an agent may place."""
        return self.palette[1:]

    def block_id(self, name: str) -> int | None:
        """The palette id of block ``name`` (normalized), ``None`` when it is not in the legend."""
        name = normalize_block(name)
        return self.palette.index(name) if name in self.palette else None

    def contains(self, point: Vec) -> bool:
        return all(lo <= p <= hi for p, lo, hi in zip(point, self.origin, self.corner))

    def index(self, point: Vec) -> int:
        """Flat index of a WORLD position (C order over local ``(x, y, z)``)."""
        x, y, z = (p - o for p, o in zip(point, self.origin))
        _, sy, sz = self.size
        return (x * sy + y) * sz + z


def empty_world(house: House) -> bytes:
    """The bbox filled with air (id 0)."""
    return bytes(house.volume)


def grid_from_layers(size: Vec, layers: dict[int, Sequence[str]], ids: dict[str, int]) -> bytes:
    """Voxels from ``y -> rows`` (``rows[z][x]`` letters, mapped by ``ids``); missing layers are air."""
    sx, sy, sz = size
    out = bytearray(sx * sy * sz)
    for y, rows in layers.items():
        for z, row in enumerate(rows):
            for x, letter in enumerate(row):
                out[(x * sy + y) * sz + z] = ids[letter]
    return bytes(out)


def fill(world: bytes, house: House, lo: Vec, hi: Vec, block: int) -> bytes:
    """``world`` with the WORLD box ``lo``..``hi`` (inclusive, ``lo <= hi`` per axis, inside the bbox) set to
    ``block``."""
    out = bytearray(world)
    _, sy, sz = house.size
    (x0, y0, z0), (x1, y1, z1) = (tuple(v - o for v, o in zip(c, house.origin)) for c in (lo, hi))
    for x in range(x0, x1 + 1):
        for y in range(y0, y1 + 1):
            start = (x * sy + y) * sz
            out[start + z0 : start + z1 + 1] = bytes([block]) * (z1 - z0 + 1)
    return bytes(out)


def layer(voxels: bytes, house: House, y: int) -> list[list[int]]:
    """Local layer ``y`` as ``grid[z][x]`` of block ids."""
    sx, sy, sz = house.size
    return [[voxels[(x * sy + y) * sz + z] for x in range(sx)] for z in range(sz)]


Rect = tuple[int, int, int, int, Hashable]
"""``(x1, z1, x2, z2, key)``: an inclusive rectangle of a layer, in local coordinates."""


def rectangles(grid: Sequence[Sequence[Hashable | None]]) -> list[Rect]:
    """Cover the non-``None`` cells of ``grid[z][x]`` with rectangles of equal keys, greedily.

    Cells are visited in row order; an uncovered cell starts a rectangle that grows along x while
    the key repeats, then along z while the whole x-span repeats. Every cell is covered exactly once.
    """
    covered: set[tuple[int, int]] = set()
    out: list[Rect] = []
    for z, row in enumerate(grid):
        for x, key in enumerate(row):
            if key is None or (x, z) in covered:
                continue
            x2 = x
            while x2 + 1 < len(row) and row[x2 + 1] == key and (x2 + 1, z) not in covered:
                x2 += 1
            z2 = z
            while z2 + 1 < len(grid) and all(
                xx < len(grid[z2 + 1]) and grid[z2 + 1][xx] == key and (xx, z2 + 1) not in covered
                for xx in range(x, x2 + 1)
            ):
                z2 += 1
            covered.update((xx, zz) for xx in range(x, x2 + 1) for zz in range(z, z2 + 1))
            out.append((x, z, x2, z2, key))
    return out


def layer_boxes(voxels: bytes, house: House) -> list[tuple[int, list[tuple[Vec, Vec, str]]]]:
    """Per local layer: the non-air blocks of ``voxels`` as WORLD boxes ``(lo, hi, block)``."""
    ox, oy, oz = house.origin
    out = []
    for y in range(house.size[1]):
        grid = [[b or None for b in row] for row in layer(voxels, house, y)]
        boxes = [
            ((ox + x1, oy + y, oz + z1), (ox + x2, oy + y, oz + z2), house.palette[int(key)])  # type: ignore[arg-type]
            for x1, z1, x2, z2, key in rectangles(grid)
        ]
        out.append((oy + y, boxes))
    return out


def box_text(lo: Vec, hi: Vec, block: str) -> str:
    """E.3's rectangle format: ``(x1, y1, z1, x2, y2, z2 block_id)``."""
    return f"({lo[0]}, {lo[1]}, {lo[2]}, {hi[0]}, {hi[1]}, {hi[2]} {block})"


def fill_command(lo: Vec, hi: Vec, block: str) -> str:
    return f"/fill {lo[0]} {lo[1]} {lo[2]} {hi[0]} {hi[1]} {hi[2]} {block}"
