"""Plan-Path: walk a grid from a start cell to a goal cell with U/D/L/R moves (PettingLLMs, ``PlanPathGridEnvState``
of ``pettingllms/multi_agent_env/stateful/env_state.py``).

A board is ``'.'`` (free) and ``'#'`` (blocked) cells. An instance is drawn as the reference draws one: every cell
blocked with probability ``block_ratio`` (0.22), a start and a different goal drawn among the free cells, redrawn
until a BFS reaches the goal from the start (2,000 tries; then an open board from corner to corner). collab draws
from its own ``random.Random(seed)``, so an instance is the same on every machine but not the reference's own
instance for that seed (the reference mixes ``random`` and numpy's global generator).

The reward of one move (``step_single``): -0.01 for a move onto a free cell, -0.10 for an invalid one (unknown
letter, off the board, into ``#``: the walker stays), plus the potential shaping ``1.0 * (0.99 * phi(next) -
phi(here))`` with ``phi`` minus the Manhattan distance to the goal (``next`` is ``here`` after an invalid move);
reaching the goal adds +1.0, and +0.5 more when the moves so far (invalid ones counted) equal the shortest path's
length; the goal ends the game. ``max_moves`` (the reference's ``max_steps``, 10,000) moves without the goal add
-1.0 and end it. An action is a list of moves, played until the game ends (``_execute_action_sequence``); its
reward is the sum of its moves' rewards; an action that is not a list of strings scores -1.0 and moves nothing.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, replace

STEPS = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
R_STEP, R_INVALID, R_GOAL, R_OPTIMAL, R_FAIL = -0.01, -0.10, 1.0, 0.5, -1.0
GAMMA, LAMBDA = 0.99, 1.0
R_BAD_FORMAT = -1.0
TRIES = 2000

Cell = tuple[int, int]


def shortest(grid: tuple[str, ...], start: Cell, goal: Cell) -> int | None:
    """Moves of a shortest start-goal path (BFS over free cells), None when the goal cannot be reached."""
    seen, queue = {start: 0}, deque([start])
    while queue:
        r, c = queue.popleft()
        if (r, c) == goal:
            return seen[(r, c)]
        for dr, dc in STEPS.values():
            n = (r + dr, c + dc)
            if 0 <= n[0] < len(grid) and 0 <= n[1] < len(grid[0]) and grid[n[0]][n[1]] != "#" and n not in seen:
                seen[n] = seen[(r, c)] + 1
                queue.append(n)
    return None


def generate(seed: int, rows: int, cols: int, block_ratio: float) -> dict:
    """One instance ``{"grid", "start", "goal"}`` drawn from ``seed`` (module docstring)."""
    rng = random.Random(seed)
    for _ in range(TRIES):
        grid = tuple("".join("#" if rng.random() < block_ratio else "." for _ in range(cols)) for _ in range(rows))
        free = [(r, c) for r in range(rows) for c in range(cols) if grid[r][c] == "."]
        if len(free) < 2:
            continue
        start = rng.choice(free)
        goal = rng.choice([f for f in free if f != start])
        if shortest(grid, start, goal) is not None:
            return {"grid": list(grid), "start": list(start), "goal": list(goal)}
    return {"grid": ["." * cols] * rows, "start": [0, 0], "goal": [rows - 1, cols - 1]}


@dataclass(frozen=True)
class Walk:
    """One game's state: the board, where the walker is, the moves made (invalid ones too) and whether it ended."""

    grid: tuple[str, ...]
    goal: Cell
    pos: Cell
    optimal: int
    """Moves of a shortest path from the start."""
    max_moves: int = 10_000
    moves: int = 0
    invalid: int = 0
    done: bool = False

    @classmethod
    def start(cls, task: dict, max_moves: int = 10_000) -> Walk:
        grid, start, goal = tuple(task["grid"]), tuple(task["start"]), tuple(task["goal"])
        return cls(grid, goal, start, shortest(grid, start, goal) or 0, max_moves)

    def distance(self, cell: Cell) -> int:
        return abs(cell[0] - self.goal[0]) + abs(cell[1] - self.goal[1])

    def move(self, letter: object) -> tuple[Walk, float]:
        """One move and its reward (``step_single``); a finished game stays as it is, for 0."""
        if self.done:
            return self, 0.0
        dr, dc = STEPS.get(letter, (0, 0)) if isinstance(letter, str) else (0, 0)
        nxt = (self.pos[0] + dr, self.pos[1] + dc)
        valid = (dr, dc) != (0, 0) and 0 <= nxt[0] < len(self.grid) and 0 <= nxt[1] < len(self.grid[0])
        valid = valid and self.grid[nxt[0]][nxt[1]] != "#"
        nxt = nxt if valid else self.pos
        reward = (R_STEP if valid else R_INVALID) + LAMBDA * (GAMMA * -self.distance(nxt) + self.distance(self.pos))
        moves = self.moves + 1
        done = False
        if nxt == self.goal:
            reward += R_GOAL + (R_OPTIMAL if moves == self.optimal else 0.0)
            done = True
        elif moves >= self.max_moves:
            reward += R_FAIL
            done = True
        return replace(self, pos=nxt, moves=moves, invalid=self.invalid + (not valid), done=done), reward

    def play(self, action: object) -> tuple[Walk, float]:
        return play_moves(self, action)

    def render(self) -> str:
        """The board with ``S`` where the walker is and ``G`` at the goal (the reference's text observation)."""
        rows = []
        for r, row in enumerate(self.grid):
            cells = ["S" if (r, c) == self.pos else "G" if (r, c) == self.goal else ch for c, ch in enumerate(row)]
            rows.append("".join(cells))
        return "\n".join(rows)


def play_moves(state, action: object):
    """An action (a list of moves) on a grid game's ``state`` (a :class:`Walk`, a Sokoban room: ``move(letter)`` gives
    the next state and the move's reward) and its reward (the reference's ``step``): the moves' rewards summed, up to
    the game's end; -1.0 for anything but a list of strings; 0 once the game has ended."""
    if state.done:
        return state, 0.0
    if not isinstance(action, list) or not all(isinstance(a, str) for a in action):
        return state, R_BAD_FORMAT
    total = 0.0
    for letter in action:
        state, reward = state.move(letter)
        total += reward
        if state.done:
            break
    return state, total
