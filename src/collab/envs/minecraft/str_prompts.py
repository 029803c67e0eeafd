"""StrBuild's prompts and its three feedback modes, in collab's words with the reference's content.

The reference (OpenMLRL/LLM_Collab_Minecraft) writes the first prompt from ``str_build/utils/prompting.py``'s
templates (a system message, then per agent: its place in the team, the target grid, the bbox, how x / y / z run,
its blocks and the constraints) and a next-turn prompt from ``str_build/external/``: ``position_feedback.py``
(every letter position and the advice to take about half of them, no two side by side: its MAGRPO config's
mode), ``perfect_feedback.py`` (the positions an agent owns that do not hold their target colour, and to the last
agent the extra blocks) or ``score_feedback.py`` (the last reward). Its config sets ``provide_graph: false``,
which deletes the target grid and every line about ``#`` / ``.`` cells from the first prompt: the first turn is
built without seeing the target (``show_target`` here; ``true`` shows it). Its next-turn prompt also repeats the
first prompt and the agent's last commands, which collab's history keeps (``history_window``).
"""

from __future__ import annotations

from collections.abc import Sequence

from collab.envs.minecraft.world import AIR, House

SYSTEM = (
    "You are a Minecraft building agent. Answer with Minecraft commands only: no markdown, no code fences, no "
    "other text. Anything that is not a command is invalid."
)
FORMAT = "Format: /setblock <x> <y> <z> <block>"

Cell = tuple[int, int, int]


def _blocks(blocks: Sequence[str]) -> str:
    return "Available blocks (use ONLY these):\n" + "\n".join(f"- {b}" for b in [*blocks, AIR])


def _cells(cells: Sequence[Cell]) -> str:
    """Positions top row first, left to right (the reference's order), one a line."""
    ordered = sorted(cells, key=lambda p: (-p[1], p[0], p[2]))
    return "\n".join(f"- ({x}, {y}, {z})" for x, y, z in ordered) if ordered else "- (none)"


def first_prompt(house: House, rows: Sequence[str], blocks: Sequence[str], i: int, n: int, show_target: bool) -> str:
    """Agent ``i``'s (0-based) first user message."""
    lo, hi = list(house.origin), list(house.corner)
    if n == 1:
        parts = ["Build the target with /setblock commands."]
    else:
        parts = [
            f"You are agent {i + 1} of a {n}-agent Minecraft building team; you place SOME of the final build's blocks."
        ]
        if i > 0:
            parts.append(f"You write after agent {i}: your /setblock commands overwrite theirs.")
    if show_target:
        parts.append(
            "The target is a grid of '#' (a block) and '.' (air) as large as the bbox; place /setblock commands on "
            "'#' cells.\nTarget grid (top row first):\n" + "\n".join(rows)
        )
    parts += [
        f"WORLD bbox (inclusive):\n- from: {lo}\n- to: {hi}",
        "Coordinates are absolute: x runs left to right from the bbox's min x, y bottom to top from its min y, "
        f"and z stays {lo[2]}.",
        _blocks(blocks),
    ]
    rules = [
        "Rules:",
        "- Output ONLY Minecraft commands, one per line; the only command is /setblock.",
        "- Absolute integer coordinates only (no ~), every one inside the bbox.",
    ]
    if show_target:
        rules.append("- Put blocks ONLY on '#' cells; '.' cells stay air.")
    if n > 1:
        rules.append("- Two blocks that share a side must not have the same texture.")
    parts.append("\n".join(rules) + "\n" + FORMAT)
    return "\n\n".join(parts)


def _head(mode: str, turn: int, horizon: int) -> str:
    return (
        f"{mode} feedback, turn {turn + 2} of {horizon}. Coordinates are absolute (x, y, z); "
        "answer with /setblock commands only."
    )


def position_feedback(cells: Sequence[Cell], blocks: Sequence[str], cap: int, turn: int, horizon: int) -> str:
    """Every letter position and the advice to take about half (``max(1, total // 2)``), none side by side."""
    k = max(1, len(cells) // 2) if cells else 0
    return "\n".join(
        [
            _head("Position", turn, horizon),
            f"- Choose about half of the positions (about {k}); avoid two chosen positions that share a side.",
            f"- At most {cap} commands.",
            "",
            "All letter positions:",
            _cells(cells),
            "",
            _blocks(blocks),
            "",
            FORMAT,
        ]
    )


def perfect_feedback(wrong: Sequence[Cell], extra: Sequence[Cell] | None, turn: int, horizon: int) -> str:
    """The agent's own target cells that do not hold their colour and, to the last agent (``extra`` given), the
    blocks outside the letters."""
    out = [
        _head("Perfect", turn, horizon),
        "- Fix ONLY the positions listed.",
        "",
        "Put your correct texture at:",
        _cells(wrong),
    ]
    if extra is not None:
        out += ["", "Remove the extra blocks (set air) at:", _cells(extra)]
    return "\n".join(out)


def score_feedback(reward: float, turn: int, horizon: int) -> str:
    return f"{_head('Score', turn, horizon)}\nPrevious reward: {reward:.4f}"
