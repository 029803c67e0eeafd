"""Spiders and the player's health in HouseBuild (CoLLM, Appendix E.3 simulator, F.3 penalty).

E.3: a simulator spawns ``spider_num`` spiders, each with attack ``spider_atk``; the player has
``player_hp`` health and attack ``player_atk``. F.3: the team is penalized
``min(1, spider_total_dmg / player_hp) * 0.2``. The paper does not say how spiders spawn, how an
attack resolves nor when the threat counts as repelled; collab's choices: docs/environments.md, *Spiders*.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from collab.envs.minecraft.commands import Attack

PENALTY = 0.2
"""F.3: the weight of the spider penalty."""


@dataclass(frozen=True)
class Spiders:
    """The spiders attacking at one turn."""

    attacks: tuple[int, ...]
    """Each spider's attack (E.3's spider attack list)."""
    hp: float
    """Each spider's health."""

    @property
    def num(self) -> int:
        return len(self.attacks)

    @property
    def total_damage(self) -> int:
        """E.3's ``spider_dmg``: the damage of all of them."""
        return sum(self.attacks)


@dataclass(frozen=True)
class Fight:
    """The outcome of a turn's attacks."""

    killed: int
    damage: int
    """Damage dealt to the player by the surviving spiders."""
    wasted: int
    """Attack commands with no living spider left to hit."""


def spawn(
    seed: int, task_id: str, turn: int, min_spiders: int, max_spiders: int, spider_atk: int, spider_hp: float
) -> Spiders:
    """The spiders of ``task_id`` at ``turn`` (uniform counts and attacks, seeded; module docstring)."""
    if max_spiders <= 0:
        return Spiders((), spider_hp)
    rng = random.Random(f"collab.housebuild/{seed}/{task_id}/{turn}")
    num = rng.randint(min_spiders, max_spiders)
    return Spiders(tuple(rng.randint(1, spider_atk) for _ in range(num)), spider_hp)


def fight(spiders: Spiders, attacks: Sequence[Attack]) -> Fight:
    """Resolve ``attacks`` in order against the first living spider (module docstring)."""
    health = [spiders.hp] * spiders.num
    alive, wasted = 0, 0  # alive: index of the first living spider
    for attack in attacks:
        if alive >= spiders.num:
            wasted += 1
            continue
        health[alive] = 0 if attack.amount is None else health[alive] - attack.amount
        if health[alive] <= 0:
            alive += 1
    return Fight(killed=alive, damage=sum(spiders.attacks[alive:]), wasted=wasted)


def penalty(damage: float, hp: float, weight: float = PENALTY) -> float:
    """F.3: ``min(1, damage / hp) * weight``; 0 without damage, ``weight`` once ``hp`` is 0."""
    if damage <= 0:
        return 0.0
    return weight if hp <= 0 else min(1.0, damage / hp) * weight
