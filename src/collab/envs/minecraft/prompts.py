"""HouseBuild prompts (CoLLM, Appendix E.3) and the simulated player's feedback (Section 5.1).

The first user message follows E.3: the player's place in the team, the blocks, the target as
rectangles per layer in WORLD coordinates, the bbox, the threat check and the constraints. The
feedback after a turn ("a simulated player gives instructions for incomplete building", Section 5.1)
is the paper's; its wording is collab's: the turn's IoU / coverage / redundancy, the missing blocks
and the wrong blocks as rectangles (at most ``MAX_RECTS`` of each), the agent's own rejected lines
(at most ``MAX_REJECTED``), the fight, the player's HP and the coming turn's threat.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from collab.envs.minecraft.commands import DAMAGE_HINT, Rejection
from collab.envs.minecraft.scoring import Measures
from collab.envs.minecraft.threats import Fight, Spiders
from collab.envs.minecraft.world import House, box_text, layer, layer_boxes, rectangles

MAX_RECTS = 12
MAX_REJECTED = 5

INTRO = (
    "You are Player {i} in a {n}-person Minecraft building team. You will place SOME of the blocks for the final "
    "build. Output must be Minecraft commands only (no markdown, no code fences, no extra text)."
)
CONSTRAINTS = """Constraints:
- Output ONLY Minecraft commands, one per line.
- Allowed commands: /fill and /kill (and /damage to attack a spider)
- Fill format: /fill x1 y1 z1 x2 y2 z2 block
- Use absolute integer coordinates only (no ~).
- Use ONLY blocks from the legend (air clears blocks).
- Every coordinate must be within the bbox.
- At most {cap} commands."""


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def threat_text(spiders: Spiders, hp: float, player_atk: float) -> str:
    """E.3's threat check for the coming turn (a short all-clear without spiders)."""
    if not spiders.num:
        return f"Threat check: There are no spiders nearby; you have {_num(hp)} HP. No attack is needed."
    attack = DAMAGE_HINT.format(atk=_num(player_atk))
    per = (
        "one attack command per spider"
        if player_atk >= spiders.hp
        else f"each spider has {_num(spiders.hp)} HP, one attack deals {_num(player_atk)}"
    )
    return (
        f"Threat check: There are {spiders.num} spiders nearby; you have {_num(hp)} HP. Spider attack list: "
        f"{list(spiders.attacks)}, total damage dmg={spiders.total_damage}. If you want to kill them, output the "
        f"attack command: {attack} ({per}; /kill @e[type=spider,limit=1] kills one). All other commands should be "
        "normal building commands."
    )


def layers_text(house: House) -> str:
    lines = [
        "Layers (ascending WORLD y). Each layer is a set of rectangles in WORLD (x, z) coords:",
        "- Format: {(x1, y1, z1, x2, y2, z2 block_id), (x1, y1, z1, x2, y2, z2 block_id)}",
    ]
    for y, boxes in layer_boxes(house.target, house):
        body = ", ".join(box_text(lo, hi, b) for lo, hi, b in boxes)
        lines.append(f"- y={y}: {{{body}}}" if boxes else f"- y={y}: {{}} (all air)")
    return "\n".join(lines)


def first_prompt(house: House, i: int, n: int, spiders: Spiders, hp: float, player_atk: float, cap: int) -> str:
    """Agent ``i``'s (0-based) first user message (E.3)."""
    return "\n\n".join(
        [
            INTRO.format(i=i + 1, n=n),
            "Task: Build the 3D structure from the provided y-axis slices.",
            f"Available blocks (use ONLY these): {', '.join(house.blocks)}",
            layers_text(house),
            f"WORLD bbox (inclusive):\n- from: {list(house.origin)}\n- to: {list(house.corner)}",
            threat_text(spiders, hp, player_atk),
            CONSTRAINTS.format(cap=cap),
        ]
    )


def _cell(built: int, target: int, missing: bool) -> int | tuple[int, int] | None:
    """A missing cell's target block (nothing built there), or a wrong cell's (built, target) pair."""
    if built == target:
        return None
    if missing:
        return target if not built else None
    return (built, target) if built else None


def _diff_lines(house: House, built: bytes, missing: bool) -> list[str]:
    """Missing (target block, nothing built) or wrong (a block other than the target's) cells as
    WORLD rectangles, one line per layer, at most ``MAX_RECTS`` rectangles."""
    ox, oy, oz = house.origin
    lines, shown, total = [], 0, 0
    for y in range(house.size[1]):
        have, want = layer(built, house, y), layer(house.target, house, y)
        grid = [[_cell(b, t, missing) for b, t in zip(hb, wt)] for hb, wt in zip(have, want)]
        rects = rectangles(grid)
        total += len(rects)
        parts = []
        for x1, z1, x2, z2, key in rects[: max(0, MAX_RECTS - shown)]:
            lo, hi = (ox + x1, oy + y, oz + z1), (ox + x2, oy + y, oz + z2)
            if missing:
                parts.append(box_text(lo, hi, house.palette[key]))
            else:
                parts.append(f"{box_text(lo, hi, house.palette[key[0]])} should be {house.palette[key[1]]}")
        shown += len(parts)
        if parts:
            lines.append(f"- y={oy + y}: " + ", ".join(parts))
    if total > shown:
        lines.append(f"- ... and {total - shown} more")
    return lines


def feedback_text(
    house: House,
    built: bytes,
    m: Measures,
    rejected: Sequence[Rejection],
    turn: int,
    spiders: Spiders,
    fight: Fight,
    hp: float,
    hp_max: float,
    coming: Spiders,
    player_atk: float,
) -> str:
    """One agent's feedback after ``turn`` (0-based): see the module docstring."""
    out = [
        f"Turn {turn + 1} result: IoU {m.iou:.0%}, coverage {m.coverage:.0%} ({m.correct}/{m.target_blocks} "
        f"target blocks), redundancy {m.redundancy:.0%} ({m.wrong} of {m.placed} placed blocks wrong)."
    ]
    missing, wrong = _diff_lines(house, built, True), _diff_lines(house, built, False)
    if missing:
        out += ["Still missing (place them):"] + missing
    if wrong:
        out += ["Wrong blocks (replace them, air clears):"] + wrong
    if not missing and not wrong:
        out.append("The build matches the target; do not change it.")
    if rejected:
        out.append(f"Your rejected lines ({len(rejected)}):")
        out += [f"- {r.line[:60]!r}: {r.reason}" for r in rejected[:MAX_REJECTED]]
        if len(rejected) > MAX_REJECTED:
            out.append(f"- ... and {len(rejected) - MAX_REJECTED} more")
    if spiders.num:
        out.append(
            f"Spiders: {spiders.num} attacked, your team killed {fight.killed}; you took {fight.damage} damage. "
            f"HP {_num(hp)}/{_num(hp_max)}."
        )
    else:
        out.append(f"No spiders attacked. HP {_num(hp)}/{_num(hp_max)}.")
    out.append(threat_text(coming, hp, player_atk))
    out.append("Output only the commands still needed, one per line.")
    return "\n".join(out)


# -- reward_mode="reference" (collab.envs.minecraft.reference) ---------------------------------------
REF_CONSTRAINTS = CONSTRAINTS.replace(" (and /damage to attack a spider)", "")  # the reference offers no /damage


def reference_threat_text(spiders: Spiders, hp: float) -> str:
    """The reference's threat check: the same spiders at every turn; one ``/kill`` repels them all."""
    if not spiders.num:
        return f"Threat check: There are no spiders nearby; you have {_num(hp)} HP. No attack is needed."
    return (
        f"Threat check: There are {spiders.num} spiders nearby; you have {_num(hp)} HP. Spider attack list: "
        f"{list(spiders.attacks)}, total damage dmg={spiders.total_damage}. If you want to kill them, output "
        "one line: /kill (it repels them all). All other commands should be normal building commands."
    )


def reference_prompt(
    house: House,
    palette: Sequence[str],
    budgets: Mapping[str, int] | None,
    i: int,
    n: int,
    spiders: Spiders,
    hp: float,
    cap: int,
) -> str:
    """Agent ``i``'s (0-based) first user message in reference mode: E.3's sections, the reference's threat
    check and, with budgets, each block's budget per player and turn (``palette``: the reference's names)."""
    parts = [
        INTRO.format(i=i + 1, n=n),
        "Task: Build the 3D structure from the provided y-axis slices.",
        f"Available blocks (use ONLY these): {', '.join([*palette[1:], palette[0]])}",
        layers_text(house),
        f"WORLD bbox (inclusive):\n- from: {list(house.origin)}\n- to: {list(house.corner)}",
        reference_threat_text(spiders, hp),
        REF_CONSTRAINTS.format(cap=cap),
    ]
    if budgets:
        lines = [f"- {b}: {budgets[b]}" for b in palette if b in budgets]
        parts.append(
            "Block budget per player and turn (a fill uses its whole volume; air is free):\n" + "\n".join(lines)
        )
    return "\n\n".join(parts)


def reference_feedback(turn: int, horizon: int, reward: float) -> str:
    """The reference's score feedback after ``turn`` (0-based): the coming turn and the last reward, nothing
    else (not even that the world restarts empty). The player's history holds its first message and its
    last commands, which the reference repeats in its next prompt."""
    return (
        f"Score feedback: turn {turn + 2} of {horizon}. Previous reward: {reward:.4f}. "
        "Output only commands, one per line."
    )
