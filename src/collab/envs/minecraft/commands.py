"""Agents' text -> HouseBuild commands (CoLLM, Appendix E.3 constraints).

Accepted, one per line: ``/fill x1 y1 z1 x2 y2 z2 block``, ``/kill`` and ``/damage @e[type=spider,limit=1] N``;
every other non-blank line is rejected with its reason. The exact forms and reasons: docs/environments.md,
*Minecraft commands*.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from collab.envs.minecraft.world import AIR, House, Vec

ALLOWED = "/fill, /kill, /damage"
DAMAGE_HINT = "/damage @e[type=spider,limit=1] {atk} minecraft:player"
_SELECTOR = re.compile(r"^@e\[(?P<args>[^\]]*)\]$")
_INTEGER = re.compile(r"^[+-]?\d+$")


@dataclass(frozen=True)
class Fill:
    """Set every block of the inclusive WORLD box ``lo``..``hi`` (``lo <= hi``) to ``block``."""

    lo: Vec
    hi: Vec
    block: str
    block_id: int


@dataclass(frozen=True)
class Attack:
    """One attack on one spider: ``amount`` damage, or ``None`` for a /kill."""

    amount: float | None = None


@dataclass(frozen=True)
class Rejection:
    line: str
    reason: str


@dataclass(frozen=True)
class Parsed:
    """One agent's accepted commands (in order) and rejected lines."""

    commands: tuple[Fill | Attack, ...]
    rejected: tuple[Rejection, ...]

    @property
    def fills(self) -> tuple[Fill, ...]:
        return tuple(c for c in self.commands if isinstance(c, Fill))

    @property
    def attacks(self) -> tuple[Attack, ...]:
        return tuple(c for c in self.commands if isinstance(c, Attack))


class Rejected(Exception):
    """A line that is not a valid command; the message is its reason."""


def _spider_selector(token: str) -> bool:
    """``@e[...]`` whose arguments include ``type=spider`` (or ``minecraft:spider``)."""
    m = _SELECTOR.match(token)
    if not m:
        return False
    args = dict(a.split("=", 1) for a in m.group("args").split(",") if "=" in a)
    return args.get("type", "").removeprefix("minecraft:") == "spider"


def _coordinate(token: str) -> int:
    if token.startswith(("~", "^")):
        raise Rejected("relative coordinates (~ or ^) not allowed; use absolute integers")
    if not _INTEGER.match(token):
        raise Rejected(f"coordinate {token!r} is not an integer")
    return int(token)


def parse_fill(tokens: list[str], house: House) -> Fill:
    if len(tokens) < 8:
        raise Rejected("incomplete /fill; format: /fill x1 y1 z1 x2 y2 z2 block")
    if len(tokens) > 8:
        raise Rejected(
            "extra arguments after the block (fill modes are not supported); format: /fill x1 y1 z1 x2 y2 z2 block"
        )
    xyz = [_coordinate(t) for t in tokens[1:7]]
    a, b = tuple(xyz[:3]), tuple(xyz[3:])
    block_id = house.block_id(tokens[7])
    if block_id is None:
        letters = dict(house.legend)
        if tokens[7] in letters:
            raise Rejected(f"{tokens[7]!r} is a legend letter; write the block name {letters[tokens[7]]}")
        raise Rejected(f"unknown block {tokens[7]!r}; legend: {', '.join(house.palette[1:] + (AIR,))}")
    for corner in (a, b):
        if not house.contains(corner):  # type: ignore[arg-type]
            raise Rejected(f"corner {corner} outside bbox {house.origin}..{house.corner}")
    lo = tuple(min(p, q) for p, q in zip(a, b))
    hi = tuple(max(p, q) for p, q in zip(a, b))
    return Fill(lo, hi, house.palette[block_id], block_id)  # type: ignore[arg-type]


def parse_kill(tokens: list[str]) -> Attack:
    if len(tokens) > 2 or (len(tokens) == 2 and not _spider_selector(tokens[1])):
        raise Rejected("/kill targets spiders only: /kill or /kill @e[type=spider,limit=1]")
    return Attack(None)


def parse_damage(tokens: list[str], player_atk: float) -> Attack:
    hint = DAMAGE_HINT.format(atk=_number_text(player_atk))
    if len(tokens) < 3 or not _spider_selector(tokens[1]):
        raise Rejected(f"/damage needs a spider and an amount: {hint}")
    try:
        amount = float(tokens[2])
    except ValueError:
        raise Rejected(f"damage amount {tokens[2]!r} is not a number; {hint}") from None
    if not 0 < amount <= player_atk:
        raise Rejected(f"damage {tokens[2]} outside 0 < amount <= your attack {_number_text(player_atk)}")
    return Attack(amount)


def _number_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _tokens(line: str) -> list[str]:
    """Whitespace-split ``line``, keeping a selector whose brackets contain spaces in one token."""
    line = re.sub(r"\[[^\]]*\]", lambda m: m.group(0).replace(" ", ""), line)
    return line.split()


def parse_line(line: str, house: House, player_atk: float) -> Fill | Attack:
    """One stripped, non-blank line -> a command, or :class:`Rejected` with the reason."""
    if line.startswith("```"):
        raise Rejected("markdown code fence; output commands only")
    tokens = _tokens(line)
    head = tokens[0].lower()
    if not head.startswith("/"):
        raise Rejected(f"not a command; allowed: {ALLOWED}")
    if head == "/fill":
        return parse_fill(tokens, house)
    if head == "/kill":
        return parse_kill(tokens)
    if head == "/damage":
        return parse_damage(tokens, player_atk)
    raise Rejected(f"unknown command {tokens[0]!r}; allowed: {ALLOWED}")


def _lines(text: str) -> Iterator[str]:
    for raw in text.splitlines():
        line = raw.strip()
        if line:
            yield line


def parse_commands(text: str, house: House, max_commands: int, player_atk: float) -> Parsed:
    """One agent's response -> its accepted commands (at most ``max_commands``) and rejected lines."""
    commands: list[Fill | Attack] = []
    rejected: list[Rejection] = []
    for line in _lines(text or ""):
        try:
            command = parse_line(line, house, player_atk)
        except Rejected as e:
            rejected.append(Rejection(line, str(e)))
            continue
        if len(commands) >= max_commands:
            rejected.append(Rejection(line, f"over the cap of {max_commands} commands"))
        else:
            commands.append(command)
    return Parsed(tuple(commands), tuple(rejected))
