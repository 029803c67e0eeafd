"""HouseBuild's reward as the authors' code computes it (``MinecraftEnv(reward_mode="reference")``).

Every rule here restates a rule of the reference implementation (OpenMLRL/LLM_Collab_Minecraft,
``house_build``, run with its MAGRPO config); docs/fidelity.md lists them all (:func:`command_lines`,
:func:`parse_reference`, :func:`build`, :func:`score`, :func:`spider_attacks`, :func:`spider_penalty`), with the points
where collab's default (``reward_mode="paper"``) differs and why.

Block ids in the :class:`~collab.envs.minecraft.commands.Fill` commands returned here index
:attr:`RefTask.palette` (the reference's own block names), not :attr:`House.palette`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collab.envs.minecraft.commands import Attack, Fill, Parsed, Rejected, Rejection
from collab.envs.minecraft.world import AIR, House, fill
from collab.errors import require

TOTAL_COMMANDS = 600
"""The reference config's command cap for the whole team (``task.max_commands``), split evenly: 300 per agent."""
PENALTY = 0.1
"""The weight of the reference's spider penalty (paper F.3 says 0.2)."""
PLAYER_HP = 5
SPIDERS = 3
SPIDER_ATK = 3
"""The reference config's ``player.hp``, ``spider.num`` and ``spider.atk_high`` (``atk_low`` is 1)."""
MAX_NEW_TOKENS = 512
"""The reference config's (and CoLLM C.3's) response length for HouseBuild."""
AIRS = (AIR, "cave_air", "void_air")
"""Block names the reference treats as air: never charged to a budget."""

_TAG = re.compile(r"\A\s*[A-Za-z0-9_-]+\s*\n")
_MARKER = re.compile(r"\A\s*(?:[-*]+|\d+[.)])\s*")


def block_name(token: str) -> str:
    """A block name as the reference compares it: trimmed, one leading ``minecraft:`` dropped; case and
    block states kept (``Stone`` and ``stone_stairs[facing=north]`` are not ``stone`` / ``stone_stairs``)."""
    name = token.strip()
    return name[len("minecraft:") :] if name.startswith("minecraft:") else name


def command_lines(text: str) -> list[str]:
    """The candidate command lines of one response (module docstring)."""
    body = (text or "").strip()
    pieces = body.split("```")
    if len(pieces) >= 3:  # an opening and a closing fence: only the first fenced block is read
        body = _TAG.sub("", pieces[1].strip(), count=1).strip()
    lines = []
    for raw in body.splitlines():
        line = _MARKER.sub("", raw.strip(), count=1).strip()
        if line:
            lines.append(line)
    return lines


@dataclass(frozen=True)
class RefTask:
    """One task as the reference sees it: the bbox (from the :class:`House`), its own block names and budgets."""

    house: House
    palette: tuple[str, ...]
    """``air`` first, then the legend's blocks (reference-normalized, :func:`block_name`) in legend order."""
    target: bytes
    """Target voxels as ids into :attr:`palette`, in the :class:`House` layout."""
    budgets: Mapping[str, int] | None
    """Per agent and turn: the most blocks of each kind one agent may place (``None``: unlimited)."""

    @property
    def allowed(self) -> frozenset[str]:
        """The legend's blocks and ``air``."""
        return frozenset(self.palette)


def budgets(target_counts: Mapping[str, int], n_agents: int) -> dict[str, int]:
    """Per agent: ``ceil(count / n) + floor(count / (2 n))`` of each non-air legend block (``count``:
    its target positions; 0 for a legend block the target does not use)."""
    n = max(1, n_agents)
    return {b: -(-c // n) + c // (2 * n) for b, c in target_counts.items() if b not in AIRS}


def ref_task(record: Mapping[str, Any], house: House, n_agents: int, limited_resource: bool) -> RefTask:
    """The :class:`RefTask` of a record already checked by :func:`~collab.envs.minecraft.tasks.house_from_record`.
    A layer's ``y`` is an offset from ``bbox.from`` as in collab (the reference reads it as a world y;
    its records start at y=0, where both agree); a layer the record leaves out is air."""
    inventory = {str(k): block_name(str(v)) for k, v in record["inventory"].items()}
    palette = (AIR,) + tuple(dict.fromkeys(b for b in inventory.values() if b != AIR))
    _, sy, sz = house.size
    target = bytearray(house.volume)
    for item in record["target_spec"]["layers"]:
        for z, row in enumerate(item["rows"]):
            for x, letter in enumerate(row):
                target[(x * sy + item["y"]) * sz + z] = palette.index(inventory[letter])
    counts = {b: target.count(i) for i, b in enumerate(palette)}
    return RefTask(house, palette, bytes(target), budgets(counts, n_agents) if limited_resource else None)


def absolute_integer(token: str) -> int | None:
    """A coordinate token as the authors read it: Python's integer syntax; a relative one (``~``, ``^``): None."""
    token = token.strip()
    if not token or token[0] in "~^":
        return None
    try:
        return int(token)  # Python's integer syntax: "+3", "-0", "1_0" (= 10) are integers
    except ValueError:
        return None


def command_tokens(line: str) -> list[str]:
    """A command line's words, one leading ``/`` dropped (the authors' readers take it with or without)."""
    body = line.strip()
    if body.startswith("/"):
        body = body[1:].lstrip()
    return body.split()


def _command(line: str, task: RefTask, used: dict[str, int]) -> Fill | Attack | None:
    """One line -> a command, ``None`` for a line with nothing after its ``/``, or :class:`Rejected`."""
    tokens = command_tokens(line)
    if not tokens:
        return None
    name = tokens[0].lower()
    if name == "kill":
        return Attack(None)
    if name != "fill":
        raise Rejected(f"unknown command {tokens[0]!r}; allowed: /fill, /kill")
    if len(tokens) < 8:
        raise Rejected("incomplete fill; format: /fill x1 y1 z1 x2 y2 z2 block")
    xyz = [absolute_integer(t) for t in tokens[1:7]]
    if None in xyz:
        raise Rejected("coordinates must be absolute integers (no ~ or ^)")
    block = block_name(tokens[7])
    if block not in task.allowed:
        raise Rejected(f"block {block!r} not allowed; use: {', '.join(task.palette[1:] + (AIR,))}")
    a, b = tuple(xyz[:3]), tuple(xyz[3:])
    house = task.house
    if not (house.contains(a) and house.contains(b)):  # type: ignore[arg-type]
        raise Rejected(f"corner outside bbox {house.origin}..{house.corner}")
    if len(tokens) > 8:
        raise Rejected("fill modes (replace, hollow, ...) are not allowed")
    limit = task.budgets.get(block) if task.budgets and block not in AIRS else None
    if limit is not None:
        volume = 1
        for p, q in zip(a, b):
            volume *= abs(q - p) + 1  # type: ignore[operator]
        if used.get(block, 0) + volume > limit:
            raise Rejected(f"over your {block} budget: {used.get(block, 0) + volume} > {limit}")
        used[block] = used.get(block, 0) + volume
    lo = tuple(min(p, q) for p, q in zip(a, b))
    hi = tuple(max(p, q) for p, q in zip(a, b))
    return Fill(lo, hi, block, task.palette.index(block))  # type: ignore[arg-type]


def capped_commands(text: str, cap: int, read) -> Parsed:
    """The response's command lines (:func:`command_lines`) each read by ``read(line)``: a command, None (skipped)
    or :class:`Rejected` (the line rejected with its reason); past ``cap`` accepted commands a line is rejected
    unread (the authors' HouseBuild and StrBuild readers check the cap first)."""
    commands: list = []
    rejected: list[Rejection] = []
    for line in command_lines(text):
        if len(commands) >= cap:
            rejected.append(Rejection(line, f"over the cap of {cap} commands"))
            continue
        try:
            command = read(line)
        except Rejected as e:
            rejected.append(Rejection(line, str(e)))
            continue
        if command is not None:
            commands.append(command)
    return Parsed(tuple(commands), tuple(rejected))


def parse_reference(text: str, task: RefTask, cap: int) -> Parsed:
    """One agent's response -> its accepted commands (at most ``cap``) and rejected lines (module docstring).
    Budgets are the agent's own: they restart for every agent and every turn."""
    used: dict[str, int] = {}
    return capped_commands(text, cap, lambda line: _command(line, task, used))


def build(task: RefTask, parsed: Sequence[Parsed]) -> bytes:
    """An empty bbox after every agent's accepted fills, agent 1's first (ids into :attr:`RefTask.palette`)."""
    world = bytes(task.house.volume)
    for p in parsed:
        for f in p.fills:
            world = fill(world, task.house, f.lo, f.hi, f.block_id)
    return world


def score(task: RefTask, world: bytes) -> float:
    """Positions holding their target block (air counts) / all bbox positions."""
    return sum(1 for b, t in zip(world, task.target) if b == t) / task.house.volume


def to_house_ids(task: RefTask, world: bytes) -> bytes:
    """``world`` with :attr:`House.palette` ids (for collab's measures and IoU)."""
    ids = [task.house.block_id(name) or 0 for name in task.palette]
    return bytes(ids[b] for b in world)


def defaults(
    n_agents: int,
    max_commands: int | None,
    min_spiders: int | None,
    max_spiders: int | None,
    player_hp: int | None,
    spider_penalty: float | None,
    max_new_tokens: int | None,
) -> tuple[int, int, int, int, float, int]:
    """The options left ``None`` as the reference config sets them; its spiders are a fixed number."""
    max_commands = TOTAL_COMMANDS // max(1, n_agents) if max_commands is None else max_commands
    max_spiders = SPIDERS if max_spiders is None else max_spiders
    min_spiders = max_spiders if min_spiders is None else min_spiders
    require(
        min_spiders == max_spiders,
        "reward_mode reference meets a fixed number of spiders: "
        f"set min_spiders == max_spiders, got {min_spiders}, {max_spiders}",
    )
    player_hp = PLAYER_HP if player_hp is None else player_hp
    spider_penalty = PENALTY if spider_penalty is None else spider_penalty
    max_new_tokens = MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens
    return max_commands, min_spiders, max_spiders, player_hp, spider_penalty, max_new_tokens


def spider_attacks(seed: int, num: int, atk: int) -> tuple[int, ...]:
    """The reference's spiders: ``num`` attacks uniform in ``1..atk`` from ``random.Random(seed)``, drawn
    once for the whole run (every task and turn meets the same spiders)."""
    rng = random.Random(int(seed))
    return tuple(rng.randint(1, atk) for _ in range(num))


def spider_penalty(damage: float, hp: float, weight: float, killed: bool) -> float:
    """``min(1, damage / hp) * weight`` when ``damage > 0`` and ``hp > 0``; 0 when any agent's accepted
    commands hold a ``/kill`` (``killed``). ``damage`` is all the spiders' attack: there is no fight."""
    if killed or damage <= 0 or hp <= 0:
        return 0.0
    return min(1.0, damage / hp) * weight
