"""Minecraft HouseBuild (paper 002, Section 5.1; prompt Appendix E.3; reward Appendix F.3).

``n_agents`` players (default 2, roles ``player1``, ``player2``) build a house from its y-layers
while spiders attack, over ``horizon`` turns (H = 4). At each turn every player answers with
commands (:mod:`~collab.envs.minecraft.commands`); the fills are applied in agent order (player 1's,
then player 2's: a later write overwrites an earlier one) to a world that persists across turns
(``EnvState.memory["world"]``, immutable bytes), and the attacks of both players are resolved
against the turn's spiders (:mod:`~collab.envs.minecraft.threats`). The joint reward of a turn is
``coverage - 0.5 * redundancy - min(1, damage / hp) * 0.2`` of the world after it
(:mod:`~collab.envs.minecraft.scoring`). A simulated player's feedback lists what is missing or
wrong, the player's rejected lines and the coming threat (:mod:`~collab.envs.minecraft.prompts`).
A player's history keeps the E.3 prompt and its last ``history_window`` turns (default 1: its last
commands and the feedback on them; ``None``: the whole dialog).

Logged info (``env/<key>``): ``iou``, ``coverage``, ``redundancy``, ``score`` (correct positions /
bbox positions), ``hp`` (remaining health as a fraction of ``player_hp``; Table 1 prints it in %,
and :mod:`collab.comparison` scales ``eval/env/hp`` by 100 like ``iou``), ``damage``,
``penalty``, ``spiders``, ``killed``, ``commands`` (accepted, all players) and ``rejected`` (lines).
:meth:`MinecraftEnv.voxels` gives an episode's built and target voxels to the evaluation's IoU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from collab.envs.base import AgentRole, Env, EnvState, Score
from collab.envs.minecraft.commands import Parsed, parse_commands
from collab.envs.minecraft.prompts import feedback_text, first_prompt
from collab.envs.minecraft.scoring import REDUNDANCY_WEIGHT, Measures, as_tensor, build_reward, measure
from collab.envs.minecraft.tasks import (SHIPPED_SPLITS, default_splits, house_from_record, load_houses,
                                         shipped_path, split_houses)
from collab.envs.minecraft.threats import PENALTY, Fight, Spiders, fight, penalty, spawn
from collab.envs.minecraft.world import House, empty_world, fill
from collab.errors import UserError, require


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


class MinecraftEnv(Env):
    """HouseBuild: build the target house as a team and fend off spiders (joint reward, at most 1.0)."""

    name = "minecraft"
    joint_reward = True
    reward_max = 1.0
    num_generations = 2
    """MAGRPO's K for this env when the config leaves it unset (paper 002 C.3: K = 2 for Minecraft, since the
    4-turn rollout tree has K^4 leaves)."""

    def __init__(self, dataset: str | None = None, train_split: str | None = None, eval_split: str | None = None,
                 horizon: int = 4, n_agents: int = 2, max_commands: int = 32, min_spiders: int = 0, max_spiders: int = 3,
                 spider_atk: int = 3, spider_hp: float = 16.0, player_hp: int = 20, player_atk: float = 16.0,
                 seed: int = 0, redundancy_weight: float = REDUNDANCY_WEIGHT, spider_penalty: float = PENALTY,
                 max_new_tokens: int = 256, history_window: int | None = 1) -> None:
        """
        Args:
            dataset: A HouseBuild ``.json`` / ``.jsonl`` file (the paper's format); ``None``: the 12 shipped houses.
            train_split, eval_split: Slices such as ``"[0:8]"`` / ``"[8:10]"`` (paper 002, C.1); ``None``:
                ``[0:8]`` / ``[8:12]`` of the shipped houses, the last fifth of a file for eval.
            horizon: Turns per episode (H = 4 in the paper).
            n_agents: Players (2 in the paper).
            max_commands: Accepted commands per player and turn; later lines are rejected.
            min_spiders, max_spiders, spider_atk, spider_hp: Spiders per turn are uniform in
                ``min_spiders..max_spiders``, each with an attack uniform in ``1..spider_atk`` and
                ``spider_hp`` health (``max_spiders=0``: no threat).
            player_hp, player_atk: The player's starting health and the most damage of one attack.
            seed: Seed of the spiders (with the task id and the turn).
            redundancy_weight: Weight of the redundancy rate in the reward.
            spider_penalty: Weight of the spider penalty (0.2 in F.3; the authors' code uses 0.1).
            max_new_tokens: Suggested response length per player.
            history_window: Turns of dialog a player keeps after the E.3 prompt (paper 002, 4.1's C;
                :func:`collab.envs.base.window`). The default, 1, keeps the player's last commands and
                the feedback on them: the feedback restates everything still missing or wrong, the
                player's HP and the coming threat, so older turns add no information about the
                build, only prompt length (the 4th turn's prompt is ~1,900 tokens instead of ~3,000
                for SmolLM2's tokenizer). ``None`` keeps the whole dialog.
        """
        super().__init__(horizon)
        require(n_agents >= 1, f"n_agents must be >= 1, got {n_agents}")
        require(max_commands >= 1, f"max_commands must be >= 1, got {max_commands}")
        require(history_window is None or history_window >= 1, f"history_window must be >= 1 or null, got {history_window}")
        require(0 <= min_spiders <= max_spiders and spider_atk >= 1,
                f"need 0 <= min_spiders <= max_spiders and spider_atk >= 1, got {min_spiders}, {max_spiders}, {spider_atk}")
        require(spider_hp > 0 and player_hp > 0 and player_atk > 0,
                f"spider_hp, player_hp and player_atk must be > 0, got {spider_hp}, {player_hp}, {player_atk}")
        require(redundancy_weight >= 0 and spider_penalty >= 0,
                f"redundancy_weight and spider_penalty must be >= 0, got {redundancy_weight}, {spider_penalty}")
        self.roles = tuple(AgentRole(f"player{i + 1}", max_new_tokens=max_new_tokens) for i in range(n_agents))
        self.max_commands, self.seed, self.redundancy_weight = max_commands, seed, redundancy_weight
        self.history_window = history_window
        self.spider_penalty = spider_penalty
        self.spider_range, self.spider_atk, self.spider_hp = (min_spiders, max_spiders), spider_atk, spider_hp
        self.player_hp, self.player_atk = player_hp, player_atk
        if dataset is None:
            records, defaults = load_houses(shipped_path()), SHIPPED_SPLITS
        else:
            records = load_houses(dataset)
            defaults = default_splits(len(records))
        self.splits = split_houses(records, train_split, eval_split, defaults)

    # -- tasks and prompts ---------------------------------------------------------------------------
    def tasks(self, split: str) -> Sequence[Mapping[str, Any]]:
        if split not in self.splits:
            raise UserError(f"unknown split {split!r}; valid: eval, train")
        return self.splits[split]

    def spiders(self, task_id: str, turn: int) -> Spiders:
        """The spiders attacking at ``turn`` of task ``task_id`` (seeded, reproducible)."""
        return spawn(self.seed, task_id, turn, *self.spider_range, self.spider_atk, self.spider_hp)

    def observe(self, task: Mapping[str, Any]) -> list[str]:
        house = house_from_record(task)
        spiders = self.spiders(house.task_id, 0)
        return [first_prompt(house, i, self.n_agents, spiders, self.player_hp, self.player_atk, self.max_commands)
                for i in range(self.n_agents)]

    # -- a turn --------------------------------------------------------------------------------------
    def outcome(self, state: EnvState, actions: Sequence[str]) -> Outcome:
        """The effect of the joint action ``actions`` in ``state`` (a pure function of both)."""
        house = house_from_record(state.task)
        parsed = tuple(parse_commands(a, house, self.max_commands, self.player_atk) for a in actions)
        world = apply(house, state.memory.get("world") or empty_world(house), parsed)
        spiders = self.spiders(house.task_id, state.turn)
        result = fight(spiders, [a for p in parsed for a in p.attacks])
        hp_before = state.memory.get("hp", self.player_hp)
        m = measure(house, world)
        pen = penalty(result.damage, hp_before, self.spider_penalty)
        return Outcome(world=world, parsed=parsed, spiders=spiders, fight=result, hp_before=hp_before,
                       hp=max(0, hp_before - result.damage), measures=m, penalty=pen,
                       reward=build_reward(m, self.redundancy_weight) - pen)

    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        o = self.outcome(state, actions)
        m = o.measures
        info = {"iou": m.iou, "coverage": m.coverage, "redundancy": m.redundancy, "score": m.score,
                "hp": o.hp / self.player_hp, "damage": float(o.fight.damage), "penalty": o.penalty,
                "spiders": float(o.spiders.num), "killed": float(o.fight.killed),
                "commands": float(sum(len(p.commands) for p in o.parsed)),
                "rejected": float(sum(len(p.rejected) for p in o.parsed))}
        return Score(rewards=(o.reward,) * self.n_agents, info=info, memory={"world": o.world, "hp": o.hp})

    def feedback(self, state: EnvState, actions: Sequence[str], score: Score) -> list[str]:
        """Each player's next message: the simulated player's notes on the build and its own rejected lines."""
        o = self.outcome(state, actions)
        house = house_from_record(state.task)
        coming = self.spiders(house.task_id, state.turn + 1)
        return [feedback_text(house, o.world, o.measures, p.rejected, state.turn, o.spiders, o.fight, o.hp,
                              self.player_hp, coming, self.player_atk) for p in o.parsed]

    # -- evaluation ----------------------------------------------------------------------------------
    def voxels(self, state: EnvState) -> tuple[torch.Tensor, torch.Tensor]:
        """``(built, target)``: ``uint8`` block-id tensors of shape ``(X, Y, Z)`` (0 = air, the same
        palette for both) of ``state``'s world, for :class:`collab.metrics.IoU`."""
        house = house_from_record(state.task)
        return as_tensor(house, state.memory.get("world") or empty_world(house)), as_tensor(house, house.target)
