"""The one-step two-agent matrix game of MAGRPO appendix, Appendix A.3, and Table 1 for N players.

Each agent picks option ``A`` (the paper's A^(1)) or ``B`` (A^(2)) without seeing the other's choice. Presets:
``table1`` (Dec-POMDP, Table 1's joint utility 10, 7, 7, 0), ``table2a`` and ``table2b`` (POSG: each agent its own
entry of Table 2a / 2b); ``team_reward=True`` gives both agents the sum of their utilities (Table 1 for both
decompositions); ``players=N`` plays Table 1 with N agents (docs/environments.md, *matrix*).

With ``constrained=True`` (the default) the policies are restricted to the two one-token options (a closed action
vocabulary); with ``constrained=False`` the first standalone ``A`` or ``B`` in the response is the choice. A response
with neither gets ``invalid_penalty``: in a joint-reward game the team gets it; with per-agent rewards the agent that
answered badly gets it and the other agent is valued at its worst case over the partner's options (its row or
column minimum).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from collab.envs.base import AgentRole, Env, EnvState, Score
from collab.errors import UserError, require, unknown

# PAYOFFS[preset][a1][a2] = (utility of agent 1, utility of agent 2); 0 = A, 1 = B.
PAYOFFS: dict[str, tuple[tuple[tuple[float, float], ...], ...]] = {
    "table1": (((10, 10), (7, 7)), ((7, 7), (0, 0))),
    "table2a": (((5, 5), (3, 4)), ((4, 3), (0, 0))),
    "table2b": (((5, 5), (1, 6)), ((6, 1), (0, 0))),
}
OPTIONS = ("A", "B")
_CHOICE = re.compile(r"\b([AB])\b")


def parse_choice(text: str) -> int | None:
    """0 for A, 1 for B, ``None`` when the response names neither as a standalone letter."""
    m = _CHOICE.search(text)
    return None if m is None else OPTIONS.index(m.group(1))


def utilities(preset: str, choices: Sequence[int | None], invalid_penalty: float) -> tuple[float, ...]:
    """Per-agent utilities of a joint choice; an unparseable choice scores ``invalid_penalty``."""
    if len(choices) != 2:  # Table 1 for N players (module docstring); a valid choice next to an invalid one is
        # valued at its worst case over the others' choices, as for two: A at 7, B at 0
        if None in choices:
            return tuple(invalid_penalty if c is None else (7.0, 0.0)[c] for c in choices)
        value = 10.0 if set(choices) == {0} else 0.0 if set(choices) == {1} else 7.0
        return (value,) * len(choices)
    table = PAYOFFS[preset]
    a1, a2 = choices
    if a1 is not None and a2 is not None:
        return table[a1][a2]
    u1 = invalid_penalty if a1 is None else min(table[a1][b][0] for b in (0, 1))
    u2 = invalid_penalty if a2 is None else min(table[b][a2][1] for b in (0, 1))
    return (u1, u2)


class MatrixEnv(Env):
    name = "matrix"

    def __init__(
        self,
        preset: str = "table1",
        team_reward: bool | None = None,
        constrained: bool = True,
        invalid_penalty: float = -1.0,
        horizon: int = 1,
        players: int = 2,
    ) -> None:
        super().__init__(horizon)
        if preset not in PAYOFFS:
            raise unknown("matrix preset", preset, PAYOFFS)
        require(
            isinstance(players, int) and not isinstance(players, bool) and players >= 2,
            f"matrix players must be an integer >= 2, got {players!r}",
        )
        require(
            players == 2 or preset == "table1",
            f"matrix preset {preset} is a two-player table; {players} players play table1 (10 when all pick A, "
            "0 when all pick B, 7 otherwise)",
        )
        self.players = players
        self.preset = preset
        # Table 1 is a joint-reward game by definition; Table 2 games are POSGs unless asked otherwise.
        self.joint_reward = True if preset == "table1" else bool(team_reward)
        self.invalid_penalty = invalid_penalty
        pairs = [pair for row in PAYOFFS[preset] for pair in row]
        joint = [pair[0] if preset == "table1" else sum(pair) for pair in pairs]
        self.reward_max = max(joint) if self.joint_reward else max(u for pair in pairs for u in pair)
        choices = OPTIONS if constrained else None
        partners = "a partner" if players == 2 else f"{players - 1} partners"
        system = f"You are playing a game with {partners}. Answer with a single letter."
        self.roles = tuple(
            AgentRole(f"player{i + 1}", system, max_new_tokens=1 if constrained else 8, choices=choices)
            for i in range(players)
        )

    def tasks(self, split: str):
        if split not in ("train", "eval"):
            raise UserError(f"unknown split {split!r}; valid: eval, train")
        return [{"id": f"matrix-{self.preset}"}]

    def observe(self, task) -> list[str]:
        who = "You and your partner each choose" if self.players == 2 else "You and your partners all choose"
        text = (
            f"{who} A or B at the same time, without talking. "
            "Your team scores best when you coordinate. Your choice (A or B):"
        )
        return [text] * self.players

    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        choices = [parse_choice(a) for a in actions]
        u = utilities(self.preset, choices, self.invalid_penalty)
        joint = sum(u) if self.preset != "table1" else u[0]
        if None in choices:  # a joint reward cannot be earned with an unusable answer
            joint = self.invalid_penalty
        rewards = (joint,) * self.players if self.joint_reward else u
        info = {
            "joint_utility": float(sum(u) if self.preset != "table1" else u[0]),
            "optimum": float(choices == [0] * self.players),
            "invalid": float(sum(c is None for c in choices)),
        }
        return Score(tuple(float(r) for r in rewards), info=info)
