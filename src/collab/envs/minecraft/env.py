"""Minecraft HouseBuild (CoLLM, Section 5.1; prompt Appendix E.3; reward Appendix F.3).

``n_agents`` players (default 2, roles ``player1``, ``player2``) build a house from its y-layers
while spiders attack, over ``horizon`` turns (H = 4). At each turn every player answers with
commands (:mod:`~collab.envs.minecraft.commands`); the fills are applied in agent order (player 1's,
then player 2's: a later write overwrites an earlier one) to a world that persists across turns
(``EnvState.memory["world"]``, immutable bytes), and the attacks of both players are resolved
against the turn's spiders (:mod:`~collab.envs.minecraft.threats`). The joint reward of a turn is
``coverage - 0.5 * redundancy - min(1, damage / hp) * 0.2`` of the world after it
(:mod:`~collab.envs.minecraft.scoring`; the whole turn: :mod:`~collab.envs.minecraft.turn`). A simulated
player's feedback lists what is missing or wrong, the player's rejected lines and the coming threat
(:mod:`~collab.envs.minecraft.prompts`).
A player's history keeps the E.3 prompt and its last ``history_window`` turns (default 1: its last
commands and the feedback on them; ``None``: the whole dialog).

Logged info (``env/<key>``): ``iou``, ``coverage``, ``redundancy``, ``score`` (correct positions /
bbox positions), ``hp`` (remaining health as a fraction of ``player_hp``; Table 1 prints it in %,
and :mod:`collab.evaluation.comparison` scales ``eval/env/hp`` by 100 like ``iou``), ``damage``,
``penalty``, ``spiders``, ``killed``, ``commands`` (accepted, all players) and ``rejected`` (lines).
:meth:`MinecraftEnv.voxels` gives an episode's built and target voxels to the evaluation's IoU.

Reward modes (``reward_mode``): ``paper`` (the default, described above) is collab's reading of CoLLM (E.3
prompt, F.3 reward); ``reference`` reproduces the reward of the authors' code (OpenMLRL/LLM_Collab_Minecraft,
``house_build`` with its MAGRPO config), quirks included (:mod:`~collab.envs.minecraft.reference`). Every
difference, and why collab's default differs: docs/fidelity.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from collab.envs.base import AgentRole, Env, EnvState, Score
from collab.envs.minecraft import reference as ref
from collab.envs.minecraft.prompts import feedback_text, first_prompt, reference_feedback, reference_prompt
from collab.envs.minecraft.scoring import REDUNDANCY_WEIGHT, as_tensor
from collab.envs.minecraft.tasks import house_from_record, split_houses
from collab.envs.minecraft.threats import PENALTY, Spiders, spawn
from collab.envs.minecraft.turn import Outcome, paper_turn, reference_turn
from collab.envs.minecraft.world import House, empty_world
from collab.errors import UserError, require, unknown

REWARD_MODES = ("paper", "reference")


class MinecraftEnv(Env):
    """HouseBuild: build the target house as a team and fend off spiders (joint reward, at most 1.0)."""

    name = "minecraft"
    joint_reward = True
    reward_max = 1.0
    num_generations = 2
    """MAGRPO's K for this env when the config leaves it unset (CoLLM C.3: K = 2 for Minecraft, since the
    4-turn rollout tree has K^4 leaves)."""

    def __init__(
        self,
        dataset: str | None = None,
        train_split: str | None = None,
        eval_split: str | None = None,
        horizon: int = 4,
        n_agents: int = 2,
        max_commands: int | None = None,
        min_spiders: int | None = None,
        max_spiders: int | None = None,
        spider_atk: int = 3,
        spider_hp: float = 16.0,
        player_hp: int | None = None,
        player_atk: float = 16.0,
        seed: int = 0,
        redundancy_weight: float = REDUNDANCY_WEIGHT,
        spider_penalty: float | None = None,
        max_new_tokens: int | None = None,
        history_window: int | None = 1,
        reward_mode: str = "paper",
        limited_resource: bool | None = None,
    ) -> None:
        """
        Args:
            dataset: A HouseBuild ``.json`` / ``.jsonl`` file (the paper's format), ``housebuild:PATH`` (the
                authors' ``house_build/dataset/data.json``); ``None``: the 12 shipped houses.
            train_split, eval_split: Slices such as ``"[0:8]"`` / ``"[8:10]"`` (CoLLM, C.1); ``None``:
                ``[0:8]`` / ``[8:12]`` of the shipped houses, the last fifth of a file for eval.
            horizon: Turns per episode (H = 4 in the paper).
            n_agents: Players (2 in the paper).
            max_commands: Accepted commands per player and turn; later lines are rejected (``None``: 32;
                reference: 600 // n_agents, i.e. 300 each for two players).
            min_spiders, max_spiders, spider_atk, spider_hp: Spiders per turn, uniform in
                ``min_spiders..max_spiders`` (``None``: 0..3), each attacking with ``1..spider_atk`` and of
                ``spider_hp`` health. Reference: ``max_spiders`` (``None``: 3) spiders drawn once per run.
            player_hp, player_atk: A player's starting health (``None``: 20; reference: 5), its most damage.
            seed: Seed of the spiders (with the task id and the turn; reference: the seed alone).
            redundancy_weight, spider_penalty: Weights in the reward (``spider_penalty`` ``None``: 0.2 as
                in F.3; reference: 0.1).
            max_new_tokens: Suggested response length per player (``None``: 256; reference: 512).
            reward_mode: ``paper`` or ``reference`` (every difference: docs/fidelity.md).
            limited_resource: Reference mode's per-turn block budgets (``None``: on, as its config).
            history_window: Turns of dialog a player keeps after the E.3 prompt (CoLLM's C; ``None``: all).
                1 suffices: the feedback restates all that is missing, the HP and the threat, and the 4th
                turn's prompt is ~1,900 tokens instead of ~3,000.
        """
        super().__init__(horizon)
        if reward_mode not in REWARD_MODES:
            raise unknown("reward_mode", reward_mode, REWARD_MODES)
        self.reward_mode = reward_mode
        reference = reward_mode == "reference"
        require(
            limited_resource is None or isinstance(limited_resource, bool),
            f"limited_resource must be true, false or null, got {limited_resource!r}",
        )
        require(reference or not limited_resource, "limited_resource applies to reward_mode reference only")
        require(not reference or n_agents in (1, 2), f"reward_mode reference takes 1 or 2 agents, got {n_agents}")
        if reference:
            max_commands, min_spiders, max_spiders, player_hp, spider_penalty, max_new_tokens = ref.defaults(
                n_agents, max_commands, min_spiders, max_spiders, player_hp, spider_penalty, max_new_tokens
            )
        max_commands = 32 if max_commands is None else max_commands
        min_spiders = 0 if min_spiders is None else min_spiders
        max_spiders = 3 if max_spiders is None else max_spiders
        player_hp = 20 if player_hp is None else player_hp
        spider_penalty = PENALTY if spider_penalty is None else spider_penalty
        max_new_tokens = 256 if max_new_tokens is None else max_new_tokens
        self.limited_resource = reference and limited_resource is not False
        self.roles = tuple(AgentRole(f"player{i + 1}", max_new_tokens=max_new_tokens) for i in range(n_agents))
        self.max_commands, self.seed, self.redundancy_weight = max_commands, seed, redundancy_weight
        self.history_window, self.spider_penalty = history_window, spider_penalty
        self.spider_range, self.spider_atk, self.spider_hp = (min_spiders, max_spiders), spider_atk, spider_hp
        self.player_hp, self.player_atk = player_hp, player_atk
        self._check(n_agents)
        self.reference_spiders = (
            Spiders(ref.spider_attacks(seed, max_spiders, spider_atk), spider_hp) if reference else None
        )
        self.splits = split_houses(dataset, train_split, eval_split)

    def _check(self, n_agents: int) -> None:
        """Refuse options out of range, one line each."""
        (lo, hi), atk = self.spider_range, self.spider_atk
        require(n_agents >= 1, f"n_agents must be >= 1, got {n_agents}")
        require(self.max_commands >= 1, f"max_commands must be >= 1, got {self.max_commands}")
        window = self.history_window
        require(window is None or window >= 1, f"history_window must be >= 1 or null, got {window}")
        require(
            0 <= lo <= hi and atk >= 1,
            f"need 0 <= min_spiders <= max_spiders and spider_atk >= 1, got {lo}, {hi}, {atk}",
        )
        require(
            self.spider_hp > 0 and self.player_hp > 0 and self.player_atk > 0,
            "spider_hp, player_hp and player_atk must be > 0, "
            f"got {self.spider_hp}, {self.player_hp}, {self.player_atk}",
        )
        require(
            self.redundancy_weight >= 0 and self.spider_penalty >= 0,
            f"redundancy_weight and spider_penalty must be >= 0, got {self.redundancy_weight}, {self.spider_penalty}",
        )

    # -- tasks and prompts ---------------------------------------------------------------------------
    def tasks(self, split: str) -> Sequence[Mapping[str, Any]]:
        if split not in self.splits:
            raise UserError(f"unknown split {split!r}; valid: eval, train")
        return self.splits[split]

    def spiders(self, task_id: str, turn: int) -> Spiders:
        """The spiders attacking at ``turn`` of task ``task_id`` (seeded, reproducible; reference: the same
        spiders for every task and turn)."""
        if self.reference_spiders is not None:
            return self.reference_spiders
        return spawn(self.seed, task_id, turn, *self.spider_range, self.spider_atk, self.spider_hp)

    def observe(self, task: Mapping[str, Any]) -> list[str]:
        house = house_from_record(task)
        spiders = self.spiders(house.task_id, 0)
        if self.reward_mode == "reference":
            rt = self.reference_task(task, house)
            return [
                reference_prompt(
                    house, rt.palette, rt.budgets, i, self.n_agents, spiders, self.player_hp, self.max_commands
                )
                for i in range(self.n_agents)
            ]
        return [
            first_prompt(house, i, self.n_agents, spiders, self.player_hp, self.player_atk, self.max_commands)
            for i in range(self.n_agents)
        ]

    # -- a turn --------------------------------------------------------------------------------------
    def outcome(self, state: EnvState, actions: Sequence[str]) -> Outcome:
        """The effect of the joint action ``actions`` in ``state`` (a pure function of both)."""
        if self.reward_mode == "reference":
            return self.reference_outcome(state, actions)
        house = house_from_record(state.task)
        return paper_turn(
            house,
            state.memory.get("world") or empty_world(house),
            state.memory.get("hp", self.player_hp),
            self.spiders(house.task_id, state.turn),
            actions,
            self.max_commands,
            self.player_atk,
            self.spider_penalty,
            self.redundancy_weight,
        )

    def reference_task(self, task: Mapping[str, Any], house: House | None = None) -> ref.RefTask:
        """``task`` as the reference reads it (its block names and, with ``limited_resource``, the budgets)."""
        return ref.ref_task(task, house or house_from_record(task), self.n_agents, self.limited_resource)

    def reference_outcome(self, state: EnvState, actions: Sequence[str]) -> Outcome:
        """Reference mode's turn (:func:`~collab.envs.minecraft.turn.reference_turn`): this turn's commands
        alone on an empty bbox, minus the spider penalty unless some player's accepted commands hold a ``/kill``."""
        house = house_from_record(state.task)
        task = self.reference_task(state.task, house)
        spiders = self.spiders(house.task_id, state.turn)
        return reference_turn(
            task, house, spiders, actions, self.max_commands, self.player_hp, self.spider_penalty, self.n_agents
        )

    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        o = self.outcome(state, actions)
        m = o.measures
        info = {
            "iou": m.iou,
            "coverage": m.coverage,
            "redundancy": m.redundancy,
            "score": m.score,
            "hp": o.hp / self.player_hp,
            "damage": float(o.fight.damage),
            "penalty": o.penalty,
            "spiders": float(o.spiders.num),
            "killed": float(o.fight.killed),
            "commands": float(sum(len(p.commands) for p in o.parsed)),
            "rejected": float(sum(len(p.rejected) for p in o.parsed)),
        }
        memory = {"world": o.world} if self.reward_mode == "reference" else {"world": o.world, "hp": o.hp}
        return Score(rewards=(o.reward,) * self.n_agents, info=info, memory=memory)

    def feedback(self, state: EnvState, actions: Sequence[str], score: Score) -> list[str]:
        """Each player's next message: the simulated player's notes on the build and its own rejected lines
        (reference: the coming turn and the last reward only)."""
        o = self.outcome(state, actions)
        if self.reward_mode == "reference":
            # The reference's feedback recomputes the reward with the spider term even for one agent.
            shown = o.measures.score - ref.spider_penalty(
                o.spiders.total_damage, self.player_hp, self.spider_penalty, any(p.attacks for p in o.parsed)
            )
            return [reference_feedback(state.turn, self.horizon, shown)] * self.n_agents
        house = house_from_record(state.task)
        coming = self.spiders(house.task_id, state.turn + 1)
        return [
            feedback_text(
                house,
                o.world,
                o.measures,
                p.rejected,
                state.turn,
                o.spiders,
                o.fight,
                o.hp,
                self.player_hp,
                coming,
                self.player_atk,
            )
            for p in o.parsed
        ]

    # -- evaluation ----------------------------------------------------------------------------------
    def voxels(self, state: EnvState) -> tuple[torch.Tensor, torch.Tensor]:
        """``(built, target)``: ``uint8`` block-id tensors of shape ``(X, Y, Z)`` (0 = air, the same
        palette for both) of ``state``'s world, for :class:`collab.evaluation.metrics.IoU`."""
        house = house_from_record(state.task)
        return as_tensor(house, state.memory.get("world") or empty_world(house)), as_tensor(house, house.target)
