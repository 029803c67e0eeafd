"""Sudoku: fill an N x N grid (N a square: 4, 9, 16) so that every row, column and sqrt(N) x sqrt(N) box holds
1..N once (PettingLLMs, ``SudukuEnvState`` of ``pettingllms/multi_agent_env/stateful/env_state.py``).

Instances: collab draws a complete grid from ``random.Random(seed)`` (the pattern grid with its digits, row bands,
rows within bands, column stacks and columns within stacks shuffled) and empties ``blanks`` cells, so every
instance has a solution; the reference's generator (``scripts/dataprocess/load_sokoban.py``) places digits that
break no rule and can leave grids without one. The reference's own files (``sudoku_4x4.json``: a JSON list of
records with a ``puzzle`` grid, 0 for an empty cell) are read by :func:`read_puzzles`.

Rewards (``SudukuEnvState.step``), for an action that is

- a complete grid: every value must be an integer 1..N, else -1.0 and nothing changes. Otherwise the grid
  replaces the board (the givens are not checked, as in the reference) for -0.01, plus 2.0 when it solves the
  rules and 0.5 more when the fill steps so far are at most the puzzle's blanks; unsolved, plus 0.5 x the filled
  fraction's change, plus 0.02 x the change in satisfied constraints (:func:`constraints`), minus 0.5 when a rule
  is broken.
- a list of ``[r, c, v]`` steps (0-based): each step that is not three integers is skipped; an allowed one
  (empty cell, v in 1..N, no clash) scores -0.01, +0.2 when v was the cell's only candidate or +0.1 when it was
  one of two, + 0.5 x the filled fraction's change + 0.02 x the constraints' change + 0.1 x the filled fraction,
  + 0.05 when empty cells remain (the reference compares the filled cell's candidates, none, with the empty cells'
  mean); a disallowed one scores -0.3. Solving adds 2.0, and 0.5 more when the fill steps are at most the blanks.
- anything else: -1.0.

Each played action counts one more fill step (a step list one per step too); a solved grid ends the game.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path

from collab.errors import UserError

Grid = tuple[tuple[int, ...], ...]
R_BAD = -1.0


def box_side(size: int) -> int:
    return math.isqrt(size)


def units(size: int) -> list[list[tuple[int, int]]]:
    """The rows, columns and boxes, each as its cells."""
    b = box_side(size)
    rows = [[(r, c) for c in range(size)] for r in range(size)]
    cols = [[(r, c) for r in range(size)] for c in range(size)]
    boxes = [
        [(r, c) for r in range(R, R + b) for c in range(C, C + b)] for R in range(0, size, b) for C in range(0, size, b)
    ]
    return rows + cols + boxes


def constraints(grid: Grid) -> int:
    """The reference's satisfied-constraint count: for each unit without a repeated digit, its filled cells - 1."""
    total = 0
    for unit in units(len(grid)):
        values = [grid[r][c] for r, c in unit if grid[r][c]]
        if len(values) == len(set(values)) and len(values) > 1:
            total += len(values) - 1
    return total


def rules_hold(grid: Grid) -> bool:
    """No unit holds a digit twice (empty cells aside)."""
    for unit in units(len(grid)):
        values = [grid[r][c] for r, c in unit if grid[r][c]]
        if len(values) != len(set(values)):
            return False
    return True


def candidates(grid: Grid, r: int, c: int) -> set[int]:
    """The digits an empty cell may take; none for a filled cell."""
    if grid[r][c]:
        return set()
    size, b = len(grid), box_side(len(grid))
    seen = set(grid[r]) | {grid[k][c] for k in range(size)}
    seen |= {grid[i][j] for i in range(r // b * b, r // b * b + b) for j in range(c // b * b, c // b * b + b)}
    return set(range(1, size + 1)) - seen


def filled(grid: Grid) -> float:
    return sum(1 for row in grid for v in row if v) / len(grid) ** 2


def generate(seed: int, size: int, blanks: int) -> dict:
    """One instance ``{"puzzle"}``: a shuffled complete grid with ``blanks`` cells emptied (module docstring)."""
    rng, b = random.Random(seed), box_side(size)
    digits = rng.sample(range(1, size + 1), size)
    rows = [band * b + r for band in rng.sample(range(b), b) for r in rng.sample(range(b), b)]
    cols = [stack * b + c for stack in rng.sample(range(b), b) for c in rng.sample(range(b), b)]
    full = [[digits[(b * (r % b) + r // b + c) % size] for c in cols] for r in rows]
    for r, c in rng.sample([(r, c) for r in range(size) for c in range(size)], blanks):
        full[r][c] = 0
    return {"puzzle": full}


def read_puzzles(path: str, size: int) -> list[dict]:
    """The puzzles of a reference instance file: a JSON list of records, each with a ``puzzle`` of ``size`` rows of
    ``size`` integers 0..size (0: empty), as ``sudoku_{N}x{N}.json``; anything else is a one-line UserError."""
    expected = f'a JSON list of records with a "puzzle" of {size} rows of {size} integers 0..{size} (sudoku_NxN.json)'
    file = Path(path)
    if not file.is_file():
        raise UserError(f"sudoku instances {path}: no such file; expected {expected}")
    try:
        records = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"sudoku instances {path}: not JSON ({e}); expected {expected}") from None
    if not isinstance(records, list) or not records:
        raise UserError(f"sudoku instances {path}: not a non-empty list; expected {expected}")
    for k, record in enumerate(records):
        grid = record.get("puzzle") if isinstance(record, dict) else None
        ok = isinstance(grid, list) and len(grid) == size
        ok = ok and all(isinstance(row, list) and len(row) == size for row in grid)
        ok = ok and all(type(v) is int and 0 <= v <= size for row in grid for v in row)
        if not ok:
            raise UserError(f"sudoku instances {path}: record {k} has no valid puzzle; expected {expected}")
    return [{"puzzle": record["puzzle"]} for record in records]


@dataclass(frozen=True)
class Board:
    """One game's state: the grid now, the puzzle's number of blanks, the fill steps made and whether it ended."""

    grid: Grid
    blanks: int
    steps: int = 0
    done: bool = False

    @classmethod
    def start(cls, task: dict) -> Board:
        grid = tuple(tuple(row) for row in task["puzzle"])
        return cls(grid, sum(1 for row in grid for v in row if v == 0))

    @property
    def solved(self) -> bool:
        return all(all(row) for row in self.grid) and rules_hold(self.grid)

    def play(self, action: object) -> tuple[Board, float]:
        """An action and its reward (module docstring); 0 once the game has ended."""
        if self.done:
            return self, 0.0
        size = len(self.grid)
        if not isinstance(action, list):
            return self, R_BAD
        if len(action) == size and all(isinstance(row, list) and len(row) == size for row in action):
            return self._whole(action)
        if all(isinstance(step, list) and len(step) == 3 for step in action):
            return self._steps(action)
        return self, R_BAD

    def _whole(self, rows: list) -> tuple[Board, float]:
        size = len(self.grid)
        try:
            grid = tuple(tuple(int(v) for v in row) for row in rows)
        except (ValueError, TypeError, OverflowError):
            return self, R_BAD
        if not all(1 <= v <= size for row in grid for v in row):
            return self, R_BAD
        after = replace(self, grid=grid, steps=self.steps + 1)
        reward = -0.01
        if after.solved:
            reward += 2.0 + (0.5 if self.steps <= self.blanks else 0.0)
            return replace(after, done=True), reward
        reward += (filled(grid) - filled(self.grid)) * 0.5 + (constraints(grid) - constraints(self.grid)) * 0.02
        return after, reward - (0.0 if rules_hold(grid) else 0.5)

    def _steps(self, steps: list) -> tuple[Board, float]:
        grid, count, total = [list(row) for row in self.grid], self.steps, 0.0
        for step in steps:
            try:
                r, c, v = (int(x) for x in step)
            except (ValueError, TypeError, OverflowError):
                continue
            before = tuple(tuple(row) for row in grid)
            if self._allowed(before, r, c, v):
                options = len(candidates(before, r, c))
                reward = -0.01 + (0.2 if options == 1 else 0.1 if options == 2 else 0.0)
                grid[r][c] = v
                after = tuple(tuple(row) for row in grid)
                reward += (filled(after) - filled(before)) * 0.5 + (constraints(after) - constraints(before)) * 0.02
                reward += filled(after) * 0.1 + (0.05 if filled(after) < 1 else 0.0)
            else:
                reward = -0.3
            total += reward
            count += 1
        board = replace(self, grid=tuple(tuple(row) for row in grid), steps=count + 1)
        if board.solved:
            total += 2.0 + (0.5 if count <= self.blanks else 0.0)
            board = replace(board, done=True)
        return board, total

    @staticmethod
    def _allowed(grid: Grid, r: int, c: int, v: int) -> bool:
        size = len(grid)
        return 0 <= r < size and 0 <= c < size and 1 <= v <= size and v in candidates(grid, r, c)

    def render(self) -> str:
        """The grid, ``.`` for an empty cell (the reference's text observation)."""
        return "\n".join(" ".join(str(v) if v else "." for v in row) for row in self.grid)
