"""StrBuild's rules as the reference computes them: the agents' ``/setblock`` lines, the build and the reward.

Every rule restates one of OpenMLRL/LLM_Collab_Minecraft, ``str_build/utils/str_builder.py``
(``extract_command_lines``, ``validate_and_normalize_mc_commands``, ``simulate_commands_to_scan_blocks``,
``build_target_color_map``, ``score_str_builder``) as ``str_build/rewards/str_builder_reward.py`` calls them:

- Lines: those of :func:`collab.envs.minecraft.reference.command_lines` (the first fenced block when the text has
  two fences, a one-word language tag dropped, one list marker stripped from each line).
- Commands: at most the agent's cap of accepted commands (the cap is checked first: a line past it is rejected
  unread); one leading ``/`` dropped; a line with nothing after it is skipped; the name, case-insensitive, must be
  ``setblock``; ``setblock x y z block`` with Python integers (``+3``, ``1_0``; ``~`` / ``^`` refused); tokens
  after the block are ignored; the block, only a leading ``minecraft:`` dropped (case kept), must be one of the
  agent's blocks or ``air``; the position must be inside the bbox.
- Build: an EMPTY bbox each turn, agent 1's accepted commands in order, then agent 2's (a later write wins).
- Reward: ``2 coverage - 1.5 extra_ratio - adjacent_ratio - 0.25 missing_palettes`` (at most 2.0), where
  coverage is the target cells holding ANY non-air block over the target cells, extra_ratio the non-target cells
  holding a block over the non-target cells of the bbox, adjacent_ratio the pairs of side-by-side blocks
  (horizontal or vertical) of the same texture over all such pairs (:func:`texture`), and missing_palettes the
  agents whose blocks are not all somewhere in the build. Its logged IoU is ``covered / (target + extra)``.
- Target colours (perfect feedback only): cells bottom row first, left to right; cell ``(x, y)`` belongs to agent
  ``(x + y) % n`` and takes the first of that agent's blocks, from index ``(x + y) % len`` on, that no
  already-coloured side neighbour has (by block name); else the block at that index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from collab.envs.minecraft.commands import Fill, Parsed, Rejected
from collab.envs.minecraft.reference import absolute_integer, block_name, capped_commands, command_tokens
from collab.envs.minecraft.world import AIR, House

AIRS = (AIR, "cave_air", "void_air")
ALIASES = {
    "oak_planks": "wood",
    "oak_wood": "wood",
    "cobblestone": "stone",
    "smooth_stone": "stone",
    "stone_bricks": "stone",
    "white_concrete": "concrete",
}
COVERAGE_WEIGHT, EXTRA_WEIGHT, ADJACENT_WEIGHT, PALETTE_WEIGHT = 2.0, 1.5, 1.0, 0.25


def texture(block: str) -> str:
    """A block's texture for the adjacency rule: the reference's aliases, then ``*_planks`` / ``*_wood`` -> wood,
    ``stone`` / ``*_stone`` / ``*_stone_bricks`` -> stone, ``*_concrete`` -> concrete, else the name itself."""
    b = block.lower()
    if b in ALIASES:
        return ALIASES[b]
    if b.endswith(("_planks", "_wood")):
        return "wood"
    if b == "stone" or b.endswith(("_stone", "_stone_bricks")):
        return "stone"
    return "concrete" if b.endswith("_concrete") else b


def caps(total: int, n: int) -> list[int]:
    """Each agent's command cap: ``max(1, total // n)``, agent 1 also taking ``total % n``."""
    per = max(1, total // n)
    return [per + (total % n if i == 0 else 0) for i in range(n)]


def _setblock(line: str, house: House, allowed: frozenset[str]) -> Fill | None:
    tokens = command_tokens(line)
    if not tokens:
        return None
    if tokens[0].lower() != "setblock":
        raise Rejected(f"unsupported command {tokens[0].lower()!r}; use /setblock x y z block")
    if len(tokens) < 5:
        raise Rejected("incomplete setblock; format: /setblock x y z block")
    xyz = tuple(absolute_integer(t) for t in tokens[1:4])
    if None in xyz:
        raise Rejected("coordinates must be absolute integers (no ~ or ^)")
    block = block_name(tokens[4])
    if block not in allowed:
        raise Rejected(f"block {block!r} not allowed; use: {', '.join(sorted(allowed))}")
    if not house.contains(xyz):  # type: ignore[arg-type]
        raise Rejected(f"position {xyz} outside bbox {house.origin}..{house.corner}")
    return Fill(xyz, xyz, block, house.palette.index(block))  # type: ignore[arg-type]


def parse_setblocks(text: str, house: House, blocks: Sequence[str], cap: int) -> Parsed:
    """One agent's response -> its accepted ``/setblock`` commands (at most ``cap``) and rejected lines."""
    allowed = frozenset(blocks) | {AIR}
    return capped_commands(text, cap, lambda line: _setblock(line, house, allowed))


def target_colors(cells: Sequence[tuple[int, int, int]], palettes: Sequence[Sequence[str]]) -> dict:
    """``{cell: (block, owner)}``: the reference's colouring of the target cells (module docstring)."""
    n = len(palettes)
    out: dict[tuple[int, int, int], tuple[str, int]] = {}
    for x, y, z in sorted(cells, key=lambda p: (p[1], p[0], p[2])):
        owner = (x + y) % n
        palette = palettes[owner]
        start = (x + y) % len(palette)
        near = {out[p][0] for p in ((x - 1, y, z), (x + 1, y, z), (x, y - 1, z), (x, y + 1, z)) if p in out}
        order = [palette[(start + k) % len(palette)] for k in range(len(palette))]
        out[(x, y, z)] = (next((b for b in order if b not in near), palette[start]), owner)
    return out


@dataclass(frozen=True)
class StrMeasures:
    """The reference's measures of one build (``score_str_builder``) and its reward."""

    target: int
    covered: int
    extra: int
    coverage: float
    extra_ratio: float
    same_pairs: int
    pairs: int
    adjacent_ratio: float
    missing_palettes: int
    iou: float
    reward: float


def measure_build(
    built: Mapping[tuple[int, int, int], str], cells: Sequence, area: int, palettes: Sequence
) -> StrMeasures:
    """``built``: the non-air blocks by WORLD position; ``cells``: the target positions; ``area``: the bbox's
    cells; ``palettes``: each agent's non-air blocks."""
    target = set(cells)
    solid = {p: b for p, b in built.items() if b not in AIRS}
    covered = sum(1 for p in target if p in solid)
    extra = sum(1 for p in solid if p not in target)
    background = area - len(target)
    colour = {p: texture(b) for p, b in solid.items()}
    same = pairs = 0
    for (x, y, z), c in colour.items():
        for q in ((x + 1, y, z), (x, y + 1, z)):
            if q in colour:
                pairs += 1
                same += colour[q] == c
    missing = sum(1 for palette in palettes if not set(palette) <= set(solid.values()))
    coverage = covered / len(target) if target else 0.0
    extra_ratio = extra / background if background > 0 else 0.0
    adjacent = same / pairs if pairs else 0.0
    reward = (
        COVERAGE_WEIGHT * coverage - EXTRA_WEIGHT * extra_ratio - ADJACENT_WEIGHT * adjacent - PALETTE_WEIGHT * missing
    )
    union = len(target) + extra
    return StrMeasures(
        target=len(target),
        covered=covered,
        extra=extra,
        coverage=coverage,
        extra_ratio=extra_ratio,
        same_pairs=same,
        pairs=pairs,
        adjacent_ratio=adjacent,
        missing_palettes=missing,
        iou=covered / union if union else 0.0,
        reward=reward,
    )
