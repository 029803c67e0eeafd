"""Pictures of a HouseBuild build against its target, layer by layer (CoLLM, Section 5.1).

HouseBuild's target is given as y-layers (Appendix E.3), so a build is read best the same way: one
column per layer ``y``, the target on top and each build below it, every layer seen from above
(``x`` to the right, ``z`` downwards, like the rows of the data format). On a build's panel every
position that differs from the target carries a mark:

- **missing**: the target has a block, the build has air (the target's block is shown faded, with a small ``o``);
- **wrong block**: both have a block, of different types (``x``, on the built block's colour);
- **extra**: the build has a block where the target has air (``+``).

A summary line gives Table 1's two HouseBuild scores (IoU over non-air blocks, remaining HP, in percent) with the
reward's coverage and redundancy (F.3; :mod:`~collab.envs.minecraft.scoring`) and the counts.

Voxels are ``(X, Y, Z)`` grids of palette ids, 0 = air, as :meth:`MinecraftEnv.voxels
<collab.envs.minecraft.env.MinecraftEnv.voxels>` returns them. The figures are built without pyplot, so they
work under any backend; :func:`partial_build` and :func:`play_commands` make a hand-written example build.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from collab.envs.base import EnvState
from collab.envs.minecraft.tasks import house_from_record
from collab.envs.minecraft.world import House, empty_world, fill_command, layer_boxes
from collab.errors import require

AIR_ID = 0
# Codes of :func:`classify`.
SAME_AIR, CORRECT, MISSING, WRONG, EXTRA = 0, 1, 2, 3, 4
MARKS = {MISSING: ("o", "missing"), WRONG: ("x", "wrong block"), EXTRA: ("+", "extra")}
"""Marker and legend name of each kind of mismatch."""
GLASS = "#a9d8ea"
AIR_FACE = "#f3f3f3"


@dataclass(frozen=True)
class Counts:
    """How a build compares with its target, position by position (non-air positions only)."""

    correct: int
    """The target's block, built right."""
    missing: int
    """Target block, built air."""
    wrong: int
    """Target block, another block built."""
    extra: int
    """Target air, a block built."""

    @property
    def target_blocks(self) -> int:
        return self.correct + self.missing + self.wrong

    @property
    def placed(self) -> int:
        return self.correct + self.wrong + self.extra

    @property
    def iou(self) -> float:
        """Section 5.1's IoU: right blocks over positions non-air in either grid (1.0 when both are empty)."""
        union = self.correct + self.missing + self.wrong + self.extra
        return self.correct / union if union else 1.0

    @property
    def coverage(self) -> float:
        """F.3's coverage rate: right blocks over target blocks (1.0 for an empty target)."""
        return self.correct / self.target_blocks if self.target_blocks else 1.0

    @property
    def redundancy(self) -> float:
        """F.3's redundancy rate: placed blocks that differ from the target over placed blocks."""
        return (self.wrong + self.extra) / self.placed if self.placed else 0.0


def _grids(built: Any, target: Any) -> tuple[np.ndarray, np.ndarray]:
    b, t = np.asarray(built), np.asarray(target)
    require(
        b.ndim == 3 and b.shape == t.shape,
        f"built and target must be (X, Y, Z) grids of the same shape, got {b.shape} and {t.shape}",
    )
    return b.astype(np.int64), t.astype(np.int64)


def classify(built: Any, target: Any) -> np.ndarray:
    """Per position of the ``(X, Y, Z)`` grids: ``SAME_AIR``, ``CORRECT``, ``MISSING``, ``WRONG`` or ``EXTRA``."""
    b, t = _grids(built, target)
    codes = np.full(b.shape, SAME_AIR, dtype=np.int8)
    codes[(t != AIR_ID) & (b == t)] = CORRECT
    codes[(t != AIR_ID) & (b == AIR_ID)] = MISSING
    codes[(t != AIR_ID) & (b != AIR_ID) & (b != t)] = WRONG
    codes[(t == AIR_ID) & (b != AIR_ID)] = EXTRA
    return codes


def count(built: Any, target: Any, y: int | None = None) -> Counts:
    """:class:`Counts` of the whole grids, or of local layer ``y`` only."""
    codes = classify(built, target)
    if y is not None:
        codes = codes[:, y, :]
    return Counts(*(int((codes == c).sum()) for c in (CORRECT, MISSING, WRONG, EXTRA)))


def summary_line(built: Any, target: Any, hp: float | None = None) -> str:
    """``IoU 40.0%  HP 85%  coverage ...  redundancy ...  | 12/30 right, ...``: Table 1's scores
    (IoU and HP, in percent as the table prints them), F.3's rates and the mismatch counts.
    ``hp``: the remaining health as a fraction of the starting health (``None``: not shown)."""
    c = count(built, target)
    health = f"  HP {100 * hp:.0f}%" if hp is not None else ""
    return (
        f"IoU {100 * c.iou:.1f}%{health}  coverage {c.coverage:.2f}  redundancy {c.redundancy:.2f}  |  "
        f"{c.correct}/{c.target_blocks} blocks right, {c.missing} missing, {c.wrong} wrong, {c.extra} extra"
    )


# -- colours -------------------------------------------------------------------------------------


def block_colours(palette: Sequence[str]) -> np.ndarray:
    """RGBA colour of each palette id (``palette[0]`` is air: transparent). Glass-like blocks are pale
    blue; the others take distinct qualitative colours in palette order (tab10, then tab20's light
    shades), since a house's blocks often share one real-world colour (six kinds of grey stone)."""
    from matplotlib import colormaps
    from matplotlib.colors import to_rgba

    tab10, tab20 = colormaps["tab10"], colormaps["tab20"]
    cycle = [tab10(i) for i in range(10) if i not in (7, 9)]  # grey is too close to air, cyan to glass
    cycle += [tab20(2 * i + 1) for i in range(10) if i not in (7, 9)]
    out = np.zeros((len(palette), 4))
    k = 0
    for i, name in enumerate(palette):
        if i == AIR_ID:
            continue
        if "glass" in name:
            out[i] = to_rgba(GLASS)
        else:
            out[i] = cycle[k % len(cycle)]
            k += 1
    return out


# -- figures -------------------------------------------------------------------------------------


def draw_layers(
    target: Any,
    builds: Any,
    palette: Sequence[str],
    *,
    origin: Sequence[int] = (0, 0, 0),
    summaries: Mapping[str, str] | None = None,
    title: str | None = None,
    columns: int = 8,
    cell: float | None = None,
):
    """The target and every build, layer by layer, with the mismatches marked (module docstring).

    Args:
        target: The target's ``(X, Y, Z)`` palette ids.
        builds: One build's grid (named ``built``), or ``{name: grid}`` for several builds of the
            same target (one row each, in order).
        palette: Block names by id (``House.palette``: ``palette[0] == "air"``).
        origin: WORLD coordinates of the bbox corner: panels are titled with world ``y`` and
            their axes span world ``x`` and ``z``.
        summaries: ``{name: text}``, printed under the title (e.g. :func:`summary_line`).
        title: The figure's title.
        columns: Layers per row of the figure; more layers wrap into further rows.
        cell: Inches per voxel; ``None``: 0.26, less for a layer wider than 8 blocks (panels of 2 inches at most).

    Returns:
        A :class:`~matplotlib.figure.Figure`, one axes per (grid, layer) labelled ``"target:y=N"`` /
        ``"NAME:y=N"`` (local ``y``) and titled ``"target  y=WORLD_Y"`` / ``"NAME  −missing ×wrong +extra"``
        (``"NAME  exact"``), blank axes filling the last row, a legend of the blocks and marks at the bottom.
    """
    from matplotlib.figure import Figure

    named = dict(builds) if isinstance(builds, Mapping) else {"built": builds}
    require(len(named) > 0, "draw_layers needs at least one build")
    t = _grids(target, target)[1]
    grids = {name: _grids(grid, t)[0] for name, grid in named.items()}
    top = int(max([t.max()] + [g.max() for g in grids.values()]))
    require(top < len(palette), f"block id {top} is not in the palette of {len(palette)} blocks")
    sx, sy, sz = t.shape
    cell = min(0.26, 2.0 / max(sx, sz)) if cell is None else cell
    require(columns >= 1 and cell > 0, f"columns must be >= 1 and cell > 0, got {columns}, {cell}")
    oy = origin[1]
    colours = block_colours(palette)
    codes = {name: classify(grid, t) for name, grid in grids.items()}

    per_row = min(columns, sy)
    bands = -(-sy // per_row)
    rows = bands * (1 + len(grids))
    legend_rows = 2 + len(palette) // 6
    head = 0.35 * (1 + (title is not None) + len(summaries or {}))
    fig = Figure(
        figsize=(max(6.0, per_row * (sx * cell + 0.35) + 0.8), rows * (sz * cell + 0.45) + head + 0.3 * legend_rows),
        layout="constrained",
    )
    axes = fig.subplots(rows, per_row, squeeze=False)
    for y in range(sy):
        band, col = divmod(y, per_row)
        first = band * (1 + len(grids))
        layer_t = t[:, y, :].T  # [z][x], as the rows of the data format
        _panel(axes[first][col], colours[layer_t], origin, t.shape, f"target:y={y}", f"target  y={oy + y}")
        for k, (name, grid) in enumerate(grids.items(), start=1):
            _build_panel(axes[first + k][col], name, y, grid, t, codes[name], colours, origin, cell)
        if col == 0:
            for k, name in enumerate(["target", *grids]):
                axes[first + k][0].set_ylabel(name, fontsize=8)
    for col in range(sy - (bands - 1) * per_row, per_row):  # the empty cells of the last band
        for k in range(1 + len(grids)):
            axes[(bands - 1) * (1 + len(grids)) + k][col].set_axis_off()
    _legend(fig, palette, colours, [t, *grids.values()])
    lines = ([title] if title else []) + [f"{name}: {text}" for name, text in (summaries or {}).items()]
    if lines:
        fig.suptitle("\n".join(lines), fontsize=9)
    return fig


def _panel(ax, image: np.ndarray, origin: Sequence[int], shape: Sequence[int], label: str, heading: str) -> None:
    """One layer seen from above, its axes spanning world ``x`` and ``z``."""
    (ox, _, oz), (sx, _, sz) = origin, shape
    ax.set_facecolor(AIR_FACE)
    ax.imshow(image, extent=(ox - 0.5, ox + sx - 0.5, oz + sz - 0.5, oz - 0.5), interpolation="nearest", origin="upper")
    ax.set_xticks(np.arange(ox - 0.5, ox + sx, 1), minor=True)
    ax.set_yticks(np.arange(oz - 0.5, oz + sz, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.6)
    ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
    ax.set_label(label)
    ax.set_title(heading, fontsize=8, pad=2)


def _build_panel(
    ax,
    name: str,
    y: int,
    grid: np.ndarray,
    t: np.ndarray,
    codes: np.ndarray,
    colours: np.ndarray,
    origin: Sequence[int],
    cell: float,
) -> None:
    """Layer ``y`` of one build, a missing block shown faded and every mismatch marked."""
    layer_t, layer_b, layer_c = t[:, y, :].T, grid[:, y, :].T, codes[:, y, :].T
    image = colours[layer_b].copy()
    ghost = layer_c == MISSING
    image[ghost] = colours[layer_t[ghost]] * [1, 1, 1, 0.3]
    c = count(grid, t, y)
    marks = f"\u2212{c.missing} \u00d7{c.wrong} +{c.extra}" if c.missing + c.wrong + c.extra else "exact"
    _panel(ax, image, origin, t.shape, f"{name}:y={y}", f"{name}  {marks}")
    for code, (marker, _) in MARKS.items():
        zs, xs = np.nonzero(layer_c == code)
        if len(xs):
            _mark(ax, origin[0] + xs, origin[2] + zs, marker, cell)


def _legend(fig, palette: Sequence[str], colours: np.ndarray, grids: Sequence[np.ndarray]) -> None:
    """The blocks present in any grid and the marks, under the panels."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    used = sorted(set(np.unique(grids[0]).tolist()).union(*(np.unique(g).tolist() for g in grids[1:])) - {AIR_ID})
    handles: list[Any] = [Patch(facecolor=colours[i], edgecolor="0.4", label=palette[i]) for i in used]
    for code, (marker, what) in MARKS.items():
        size = 4 if code == MISSING else 7
        handles.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker=marker,
                color="black",
                markerfacecolor="none",
                markersize=size,
                label=what,
            )
        )
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 6), fontsize=8, frameon=False)


def _mark(ax, xs: np.ndarray, zs: np.ndarray, marker: str, cell: float) -> None:
    """Black markers with a white halo, readable on any block colour."""
    from matplotlib import patheffects

    size = max(12.0, (cell * 72 * 0.55) ** 2) * (0.25 if marker == "o" else 1.0)
    colour = {"facecolors": "none", "edgecolors": "black"} if marker == "o" else {"c": "black"}
    ax.scatter(
        xs,
        zs,
        marker=marker,
        s=size,
        linewidths=1.2,
        **colour,
        path_effects=[patheffects.withStroke(linewidth=2.5, foreground="white")],
    )


def draw_house(
    house: House,
    builds: Mapping[str, bytes],
    hp: Mapping[str, float] | None = None,
    title: str | None = None,
    **options: Any,
):
    """:func:`draw_layers` for a :class:`~collab.envs.minecraft.world.House` and worlds as the env keeps
    them (``bytes`` in the house's voxel order), each build's :func:`summary_line` printed with its
    ``hp`` (a fraction of the starting health) when given."""
    from collab.envs.minecraft.scoring import as_tensor

    target = as_tensor(house, house.target)
    grids = {name: as_tensor(house, world) for name, world in builds.items()}
    summaries = {name: summary_line(grid, target, (hp or {}).get(name)) for name, grid in grids.items()}
    return draw_layers(
        target,
        grids,
        house.palette,
        origin=house.origin,
        summaries=summaries,
        title=title if title is not None else house.task_id,
        **options,
    )


def draw_states(env, states: Mapping[str, EnvState], title: str | None = None, **options: Any):
    """:func:`draw_house` of episode states of one task of a :class:`~collab.envs.minecraft.env.MinecraftEnv`
    (``{name: state}``, e.g. the last state of a played episode), with each state's health."""
    require(len(states) > 0, "draw_states needs at least one state")
    houses = {name: house_from_record(state.task) for name, state in states.items()}
    ids = {h.task_id for h in houses.values()}
    require(len(ids) == 1, f"the states must be of one task, got {sorted(ids)}")
    house = next(iter(houses.values()))
    worlds = {name: state.memory.get("world") or empty_world(house) for name, state in states.items()}
    hp = {name: state.memory.get("hp", env.player_hp) / env.player_hp for name, state in states.items()}
    return draw_house(house, worlds, hp, title, **options)


# -- a hand-written example build ----------------------------------------------------------------


def target_commands(house: House, layers: Iterable[int] | None = None) -> list[str]:
    """``/fill`` commands that build the target's local ``layers`` (all by default) exactly, one per
    rectangle of :func:`~collab.envs.minecraft.world.layer_boxes` (E.3's rectangle compression)."""
    boxes = layer_boxes(house.target, house)
    chosen = range(house.size[1]) if layers is None else layers
    return [fill_command(lo, hi, block) for y in chosen for lo, hi, block in boxes[y][1]]


def partial_build(house: House, fraction: float = 0.5, mistakes: bool = True) -> list[str]:
    """A hand-written build: the lowest ``ceil(fraction * Y)`` layers of the target, then (``mistakes``)
    one wrong block on the first target block and one extra block on the first air position of the
    built layers (or of the layer above), so that every mark of :func:`draw_layers` shows up."""
    require(0 <= fraction <= 1, f"fraction must be in [0, 1], got {fraction}")
    sx, sy, sz = house.size
    built = math.ceil(fraction * sy - 1e-9)
    commands = target_commands(house, range(built))
    if not mistakes or not built:
        return commands
    ox, oy, oz = house.origin
    target = np.frombuffer(house.target, dtype=np.uint8).reshape(house.size)

    def world(x: int, y: int, z: int) -> tuple[int, int, int]:
        return ox + x, oy + y, oz + z

    solid = [(x, y, z) for y in range(built) for z in range(sz) for x in range(sx) if target[x, y, z]]
    if solid and len(house.blocks) > 1:
        x, y, z = solid[0]
        other = next(b for b in house.blocks if b != house.palette[target[x, y, z]])
        commands.append(fill_command(world(x, y, z), world(x, y, z), other))
    air = [(x, y, z) for y in range(min(built + 1, sy)) for z in range(sz) for x in range(sx) if not target[x, y, z]]
    if air:
        x, y, z = air[0]
        commands.append(fill_command(world(x, y, z), world(x, y, z), house.blocks[0]))
    return commands


def play_commands(env, task: Mapping[str, Any], commands: Sequence[str]) -> EnvState:
    """The state after playing ``commands`` in order through ``env.step`` from ``env.reset(task)``:
    each turn, player 1 takes the next ``env.max_commands`` lines, then player 2 the next, and so on
    (fills of a turn are applied in player order, so the order of the lines is kept). The spiders
    attack as in any episode; nobody fights back. Stops when the lines run out (at least one turn)."""
    per_turn = env.max_commands * env.n_agents
    turns = max(1, -(-len(commands) // per_turn))
    require(
        turns <= env.horizon,
        f"{len(commands)} commands need {turns} turns of {env.n_agents} players x "
        f"{env.max_commands} commands, more than the horizon ({env.horizon})",
    )
    state = env.reset(task)
    for turn in range(turns):
        chunk = commands[turn * per_turn : (turn + 1) * per_turn]
        actions = ["\n".join(chunk[i * env.max_commands : (i + 1) * env.max_commands]) for i in range(env.n_agents)]
        state = env.step(state, actions).state
    return state
