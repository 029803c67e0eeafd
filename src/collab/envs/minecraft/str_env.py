"""Minecraft StrBuild (``make_env("str_build")``): agents spell a string in blocks with ``/setblock`` commands.

The reference is OpenMLRL/LLM_Collab_Minecraft, ``str_build/`` (its README: "agents build structures from string
blueprints"), run with ``str_build/configs/str_build_magrpo_config.yaml``; no paper describes it, so collab's
defaults are that config's: 2 agents (``agent1`` with oak_planks and stone, ``agent2`` with white_concrete and
obsidian, both with air), 4 turns, K = 2, 300 commands for the team (150 each), 512 new tokens, letters 2 columns
apart at z = 0, position feedback, the target not shown in the first prompt. The tasks
(:mod:`~collab.envs.minecraft.strings`): a string drawn in a 5 x 5 font, upright in the plane ``z = local_z``.

Each turn every agent answers with ``/setblock`` lines; the accepted ones (:mod:`~collab.envs.minecraft.str_rules`)
are applied, agent 1's first, to an EMPTY bbox (the reference scores each turn's commands alone), and the team's
reward is ``2 coverage - 1.5 extra_ratio - adjacent_ratio - 0.25 missing_palettes`` (at most 2.0). Feedback
(:mod:`~collab.envs.minecraft.str_prompts`): ``position`` (every letter position), ``perfect`` (the cells to fix)
or ``score`` (the last reward). The reference's trainer shifts rewards by -2 and stops a rollout-tree node whose
mean shifted reward exceeds -0.1: ``reward_shift: -2.0`` here and MAGRPO's ``termination_threshold: -0.1`` with
``termination: node``.

Logged info (``env/<key>``): ``iou`` (the reference's: covered / (target + extra), block types ignored),
``coverage``, ``extra_ratio``, ``adjacent_ratio``, ``missing_palettes``, ``commands`` (accepted, all agents) and
``rejected`` (lines). :meth:`StrBuildEnv.voxels` gives the evaluation's IoU the same shape-only grids. Every
difference from the reference: docs/fidelity.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from collab.envs.base import AgentRole, Env, EnvState, Score
from collab.envs.minecraft import str_prompts as prompts
from collab.envs.minecraft.commands import Parsed
from collab.envs.minecraft.reference import block_name
from collab.envs.minecraft.scoring import as_tensor
from collab.envs.minecraft.str_rules import AIRS, StrMeasures, caps, measure_build, parse_setblocks, target_colors
from collab.envs.minecraft.strings import positions, render, split_strings, string_of
from collab.envs.minecraft.turn import apply
from collab.envs.minecraft.world import AIR, House, empty_world
from collab.errors import UserError, require, unknown

FEEDBACK = ("position", "perfect", "score")
BLOCKS = (("oak_planks", "stone"), ("white_concrete", "obsidian"))
"""The reference config's ``task.block_agent1`` and ``task.block_agent2`` (each with ``air``, always allowed)."""
TEAM_COMMANDS = 300
"""The reference config's ``task.max_commands``: the team's cap, split over the agents (:func:`caps`)."""


@dataclass(frozen=True)
class Layout:
    """One task's bbox (a :class:`House` whose target holds the reference's colours), rows and letter cells."""

    house: House
    rows: tuple[str, ...]
    cells: tuple[tuple[int, int, int], ...]
    owners: Mapping[tuple[int, int, int], int]


@dataclass(frozen=True)
class StrOutcome:
    world: bytes
    parsed: tuple[Parsed, ...]
    measures: StrMeasures
    built: Mapping[tuple[int, int, int], str]


class StrBuildEnv(Env):
    """StrBuild: spell the task's string in blocks as a team (joint reward, at most 2.0)."""

    name = "str_build"
    joint_reward = True
    reward_max = 2.0
    num_generations = 2
    """MAGRPO's K when the config leaves it unset: the reference config's ``num_generations``."""

    def __init__(
        self,
        dataset: str | None = None,
        train_split: str | None = None,
        eval_split: str | None = None,
        horizon: int = 4,
        n_agents: int = 2,
        blocks: list[list[str]] | None = None,
        spacing: int = 2,
        local_z: int = 0,
        max_commands: int = TEAM_COMMANDS,
        feedback: str = "position",
        show_target: bool = False,
        max_new_tokens: int = 512,
        history_window: int | None = 1,
    ) -> None:
        """
        Args:
            dataset: A csv in the publisher's format (``str_build/dataset/data.csv``: columns ``string``,
                ``difficulty``); ``None``: the 10 strings shipped with collab.
            train_split, eval_split: Slices such as ``"[:8]"`` / ``"[8:]"`` (``None``: the last fifth for eval,
                which is the reference's ``[:8]`` / ``[8:]`` of its 10 strings).
            horizon: Turns per episode (the reference's ``num_turns``: 4).
            n_agents: Agents (the reference takes 1 or 2); each needs its own block list.
            blocks: Each agent's blocks (``air`` is always allowed); ``None``: the reference's (``BLOCKS``).
            spacing: Air columns between two letters; local_z: the plane's z.
            max_commands: The team's cap of accepted commands, split evenly (agent 1 takes the remainder).
            feedback: ``position`` (the reference config's), ``perfect`` or ``score``.
            show_target: Show the target grid in the first prompt (the reference config's ``provide_graph``:
                false, so the first turn is built blind).
            max_new_tokens: Response length per agent.
            history_window: Turns of dialog an agent keeps after its first prompt (``None``: all).
        """
        super().__init__(horizon)
        if feedback not in FEEDBACK:
            raise unknown("feedback", feedback, FEEDBACK)
        require(isinstance(n_agents, int) and n_agents >= 1, f"n_agents must be an integer >= 1, got {n_agents!r}")
        if blocks is None:
            require(n_agents <= len(BLOCKS), f"n_agents {n_agents} > 2 needs blocks: one list of blocks per agent")
            blocks = [list(b) for b in BLOCKS[:n_agents]]
        self.palettes = _palettes(blocks, n_agents)
        require(isinstance(spacing, int) and spacing >= 0, f"spacing must be an integer >= 0, got {spacing!r}")
        require(isinstance(local_z, int), f"local_z must be an integer, got {local_z!r}")
        require(isinstance(max_commands, int) and max_commands >= 1, f"max_commands must be >= 1, got {max_commands!r}")
        require(
            history_window is None or history_window >= 1, f"history_window must be >= 1 or null, got {history_window}"
        )
        self.spacing, self.local_z, self.caps = spacing, local_z, caps(max_commands, n_agents)
        self.feedback_mode, self.show_target, self.history_window = feedback, bool(show_target), history_window
        self.roles = tuple(AgentRole(f"agent{i + 1}", prompts.SYSTEM, max_new_tokens) for i in range(n_agents))
        self.splits = split_strings(dataset, train_split, eval_split)
        self._layouts: dict[str, Layout] = {}

    def tasks(self, split: str) -> Sequence[Mapping[str, Any]]:
        if split not in self.splits:
            raise UserError(f"unknown split {split!r}; valid: eval, train")
        return self.splits[split]

    def layout(self, task: Mapping[str, Any]) -> Layout:
        """The task's bbox, rows and cells, the target coloured as the reference colours it (cached by string)."""
        text = string_of(task)
        if text not in self._layouts:
            rows = tuple(render(text, self.spacing))
            cells = tuple(positions(rows, self.local_z))
            colours = target_colors(cells, self.palettes)
            palette = (AIR, *dict.fromkeys(b for p in self.palettes for b in p))
            house = House(
                str(task.get("task_id", text)), (), (len(rows[0]), len(rows), 1), (0, 0, self.local_z), palette, b""
            )
            target = bytearray(house.volume)
            for cell, (block, _) in colours.items():
                target[house.index(cell)] = palette.index(block)
            house = House(house.task_id, (), house.size, house.origin, palette, bytes(target))
            self._layouts[text] = Layout(house, rows, cells, {c: o for c, (_, o) in colours.items()})
        return self._layouts[text]

    def observe(self, task: Mapping[str, Any]) -> list[str]:
        lay = self.layout(task)
        return [
            prompts.first_prompt(lay.house, lay.rows, self.palettes[i], i, self.n_agents, self.show_target)
            for i in range(self.n_agents)
        ]

    def outcome(self, state: EnvState, actions: Sequence[str]) -> StrOutcome:
        """This turn's commands alone on an empty bbox, measured by the reference's rules."""
        lay = self.layout(state.task)
        house = lay.house
        parsed = tuple(parse_setblocks(a, house, p, c) for a, p, c in zip(actions, self.palettes, self.caps))
        world = apply(house, empty_world(house), parsed)
        width, height, _ = house.size
        cells = ((x, y, self.local_z) for x in range(width) for y in range(height))
        built = {c: house.palette[world[house.index(c)]] for c in cells if world[house.index(c)]}
        return StrOutcome(world, parsed, measure_build(built, lay.cells, width * height, self.palettes), built)

    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        o = self.outcome(state, actions)
        m = o.measures
        info = {
            "iou": m.iou,
            "coverage": m.coverage,
            "extra_ratio": m.extra_ratio,
            "adjacent_ratio": m.adjacent_ratio,
            "missing_palettes": float(m.missing_palettes),
            "commands": float(sum(len(p.commands) for p in o.parsed)),
            "rejected": float(sum(len(p.rejected) for p in o.parsed)),
        }
        return Score(rewards=(m.reward,) * self.n_agents, info=info, memory={"world": o.world})

    def feedback(self, state: EnvState, actions: Sequence[str], score: Score) -> list[str]:
        """Each agent's next message in the configured mode (:mod:`~collab.envs.minecraft.str_prompts`)."""
        lay, n, turn = self.layout(state.task), self.n_agents, state.turn
        if self.feedback_mode == "score":
            return [prompts.score_feedback(score.rewards[0], turn, self.horizon)] * n
        if self.feedback_mode == "position":
            return [
                prompts.position_feedback(lay.cells, self.palettes[i], self.caps[i], turn, self.horizon)
                for i in range(n)
            ]
        o = self.outcome(state, actions)
        target = lay.house.target
        wrong = [
            [
                c
                for c in lay.cells
                if lay.owners[c] == i and o.built.get(c, AIR) != lay.house.palette[target[lay.house.index(c)]]
            ]
            for i in range(n)
        ]
        extra = sorted(c for c, b in o.built.items() if c not in lay.owners and b not in AIRS)
        return [prompts.perfect_feedback(wrong[i], extra if i == n - 1 else None, turn, self.horizon) for i in range(n)]

    def prompt_tokens(self, first: int, turn: int, responses: Sequence[int]) -> int:
        """As :meth:`Env.prompt_tokens`, the feedback counted as the mode writes it: about 10 tokens a listed cell
        (``- (12, 4, 0)``), every letter cell for ``position``, up to the whole bbox for ``perfect``."""
        kept = turn if self.history_window is None else min(turn, self.history_window)
        tasks = [t for split in self.splits.values() for t in split]
        if self.feedback_mode == "score":
            note = 64
        elif self.feedback_mode == "position":
            note = 120 + 10 * max(len(self.layout(t).cells) for t in tasks)
        else:
            note = 80 + 10 * max(self.layout(t).house.volume for t in tasks)
        return first + kept * (max(responses, default=0) + note)

    def voxels(self, state: EnvState) -> tuple[torch.Tensor, torch.Tensor]:
        """``(built, target)`` as ``uint8`` grids of shape ``(X, 5, 1)``, 1 where a block stands: the evaluation's
        IoU is then the reference's (any block covers a letter cell)."""
        house = self.layout(state.task).house
        world = state.memory.get("world") or empty_world(house)
        return (as_tensor(house, world) != 0).to(torch.uint8), (as_tensor(house, house.target) != 0).to(torch.uint8)


def _palettes(blocks: Any, n_agents: int) -> tuple[tuple[str, ...], ...]:
    """Each agent's non-air blocks (reference-normalized: only a leading ``minecraft:`` dropped)."""
    ok = isinstance(blocks, Sequence) and not isinstance(blocks, str) and len(blocks) == n_agents
    require(ok, f"blocks must be a list of {n_agents} block lists, one per agent, got {blocks!r}")
    out = []
    for i, agent in enumerate(blocks):
        require(
            isinstance(agent, Sequence) and not isinstance(agent, str) and all(isinstance(b, str) for b in agent),
            f"blocks[{i}] must be a list of block names, got {agent!r}",
        )
        names = tuple(dict.fromkeys(block_name(b) for b in agent if block_name(b) and block_name(b) not in AIRS))
        require(bool(names), f"blocks[{i}] must name at least one block other than air, got {agent!r}")
        out.append(names)
    return tuple(out)
