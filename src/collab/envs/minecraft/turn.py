"""One HouseBuild turn, a pure function of the world before it and the players' texts: the fills applied,
the spiders fought, the build measured and the turn's reward, in paper mode (:func:`paper_turn`) and in
reference mode (:func:`reference_turn`, the authors' code's rules: :mod:`collab.envs.minecraft.reference`).
:class:`collab.envs.minecraft.env.MinecraftEnv` keeps the state between turns and picks the mode."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from collab.envs.minecraft import reference as ref
from collab.envs.minecraft.commands import Parsed, parse_commands
from collab.envs.minecraft.scoring import Measures, build_reward, measure
from collab.envs.minecraft.threats import Fight, Spiders, fight, penalty
from collab.envs.minecraft.world import House, fill


@dataclass(frozen=True)
class Outcome:
    """Everything a turn does: the world after it, each player's parse, the fight, the health and the reward."""

    world: bytes
    parsed: tuple[Parsed, ...]
    spiders: Spiders
    fight: Fight
    hp_before: float
    hp: float
    measures: Measures
    penalty: float
    reward: float


def apply(house: House, world: bytes, parsed: Sequence[Parsed]) -> bytes:
    """``world`` after every player's fills, player 0's first, each in its own order."""
    for p in parsed:
        for f in p.fills:
            world = fill(world, house, f.lo, f.hi, f.block_id)
    return world


def paper_turn(
    house: House,
    world: bytes,
    hp_before: float,
    spiders: Spiders,
    actions: Sequence[str],
    max_commands: int,
    player_atk: float,
    spider_penalty: float,
    redundancy_weight: float,
) -> Outcome:
    """Paper mode's turn: every player's fills on ``world`` (the build so far), their attacks on ``spiders``,
    the health left of ``hp_before`` and ``coverage - redundancy_weight * redundancy`` minus the spider
    penalty."""
    parsed = tuple(parse_commands(a, house, max_commands, player_atk) for a in actions)
    world = apply(house, world, parsed)
    result = fight(spiders, [a for p in parsed for a in p.attacks])
    m = measure(house, world)
    pen = penalty(result.damage, hp_before, spider_penalty)
    return Outcome(
        world=world,
        parsed=parsed,
        spiders=spiders,
        fight=result,
        hp_before=hp_before,
        hp=max(0, hp_before - result.damage),
        measures=m,
        penalty=pen,
        reward=build_reward(m, redundancy_weight) - pen,
    )


def reference_turn(
    task: ref.RefTask,
    house: House,
    spiders: Spiders,
    actions: Sequence[str],
    max_commands: int,
    player_hp: float,
    spider_penalty: float,
    n_agents: int,
) -> Outcome:
    """Reference mode's turn: this turn's commands alone on an empty bbox, scored by the reference's
    score, minus the spider penalty unless some player's accepted commands hold a ``/kill``."""
    parsed = tuple(ref.parse_reference(a, task, max_commands) for a in actions)
    built = ref.build(task, parsed)
    kills = sum(len(p.attacks) for p in parsed)
    damage = 0 if kills else spiders.total_damage
    pen = ref.spider_penalty(spiders.total_damage, player_hp, spider_penalty, kills > 0)
    if n_agents == 1:
        pen = 0.0  # the reference's one-agent reward has no spider term
    world = ref.to_house_ids(task, built)
    m = replace(measure(house, world), score=ref.score(task, built))
    result = Fight(
        killed=spiders.num if kills else 0, damage=damage, wasted=max(0, kills - 1) if spiders.num else kills
    )
    return Outcome(
        world=world,
        parsed=parsed,
        spiders=spiders,
        fight=result,
        hp_before=player_hp,
        hp=max(0, player_hp - damage),
        measures=m,
        penalty=pen,
        reward=m.score - pen,
    )
