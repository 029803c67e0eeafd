"""Sokoban: push every box onto a goal with U/D/L/R moves (PettingLLMs, ``SokobanGridEnvState`` of
``pettingllms/multi_agent_env/stateful/env_state.py``; its generator ``generate_room`` in ``stateful/utils.py``).

A board: ``#`` wall, `` `` floor, ``.`` goal, ``$`` box, ``*`` box on a goal, ``@`` player, ``+`` player on a goal.

Instances are made the reference's way, from collab's own ``random.Random(seed)``: a room carved by a random walk
of 25 steps stamping 3 x 3 masks (turning with probability 0.35) inside a wall border; goals and the player placed on
the floor; then the game played backwards from the solved room (the player pulls boxes) and the reached room whose
boxes lie farthest from their goals (each at least 2 cells, Manhattan) kept. Every room reached by pulls is solved by
the pushes that undo them, so every instance has a solution. The reference searches the pulls depth-first (300
levels) and then walks the player up to 3 random steps; collab searches breadth-first (each room once), which
already places the player anywhere it can go.

The reward of one move (``step_single``): -0.01 for a move, -0.05 for an invalid one (not a move, into a wall or off
the board, a box pushed into a wall or another box: nothing moves); a push +1.0 when the box lands on a goal, -0.5
when it leaves one; plus the shaping ``0.1 * (0.99 * phi(after) - phi(before))``, ``phi`` minus the boxes' summed
Manhattan distances to their nearest goals; +10.0 when every box is on a goal (the game ends); -5.0 and the end when
``max_moves`` (200) moves are made. An action is a list of moves played until the game ends, its reward their sum;
anything but a list of strings scores -1.0 and moves nothing.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, replace

from collab.envs.games.plan_path import STEPS, play_moves

R_STEP, R_INVALID, R_ON_GOAL, R_OFF_GOAL, R_WIN, R_FAIL = -0.01, -0.05, 1.0, -0.5, 10.0, -5.0
GAMMA, LAMBDA = 0.99, 0.1
MASKS = (
    ((0, 0, 0), (1, 1, 1), (0, 0, 0)),
    ((0, 1, 0), (0, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (1, 1, 0)),
    ((0, 0, 0), (0, 1, 1), (0, 1, 0)),
)
WALK_STEPS, TURN, MIN_DISTANCE, TRIES, MAX_ROOMS = 25, 0.35, 2, 1000, 300_000

Cell = tuple[int, int]


def carve(rng: random.Random, size: int) -> list[Cell]:
    """The floor cells of a room carved by a random walk of 3 x 3 masks (``room_topology_generation``)."""
    floor: set[Cell] = set()
    direction = rng.choice(list(STEPS.values()))
    r, c = rng.randint(1, size - 1), rng.randint(1, size - 1)
    for _ in range(WALK_STEPS):
        if rng.random() < TURN:
            direction = rng.choice(list(STEPS.values()))
        r, c = min(max(r + direction[0], 1), size - 2), min(max(c + direction[1], 1), size - 2)
        mask = rng.choice(MASKS)
        floor |= {(r - 1 + i, c - 1 + j) for i in range(3) for j in range(3) if mask[i][j]}
    return sorted(cell for cell in floor if 0 < cell[0] < size - 1 and 0 < cell[1] < size - 1)


def pulls(floor: frozenset[Cell], player: Cell, boxes: frozenset[Cell]):
    """The rooms one backward move away: the player steps to a free cell, pulling a box it had behind it."""
    for dr, dc in STEPS.values():
        step = (player[0] + dr, player[1] + dc)
        if step not in floor or step in boxes:
            continue
        yield step, boxes
        behind = (player[0] - dr, player[1] - dc)
        if behind in boxes:
            yield step, (boxes - {behind}) | {player}


def distance(boxes, goals) -> int:
    """The boxes' summed Manhattan distances to their nearest goals (minus the reference's potential)."""
    if not goals:
        return 0
    return sum(min(abs(b[0] - g[0]) + abs(b[1] - g[1]) for g in goals) for b in boxes)


def farthest(floor: frozenset[Cell], player: Cell, goals: frozenset[Cell]) -> tuple[Cell, frozenset[Cell]] | None:
    """The room reached by pulls from the solved one whose boxes are farthest from the goals, every box at least
    ``MIN_DISTANCE`` from every goal; None when there is none."""
    start = (player, goals)
    seen, queue, best, best_score = {start}, deque([start]), None, 0
    while queue and len(seen) < MAX_ROOMS:
        here, boxes = queue.popleft()
        near = min(abs(b[0] - g[0]) + abs(b[1] - g[1]) for b in boxes for g in goals)
        if near >= MIN_DISTANCE and distance(boxes, goals) > best_score:
            best, best_score = (here, boxes), distance(boxes, goals)
        for room in pulls(floor, here, boxes):
            if room not in seen:
                seen.add(room)
                queue.append(room)
    return best


def generate(seed: int, size: int, boxes: int) -> dict:
    """One instance ``{"rows"}`` (the board's text rows) drawn from ``seed`` (module docstring)."""
    rng = random.Random(seed)
    for _ in range(TRIES):
        floor = carve(rng, size)
        if len(floor) <= boxes + 1:
            continue
        player, *goals = rng.sample(floor, boxes + 1)
        found = farthest(frozenset(floor), player, frozenset(goals))
        if found is not None:
            return {"rows": render((size, size), set(floor), set(goals), found[1], found[0])}
    raise RuntimeError(f"no sokoban room with {boxes} boxes on a {size} x {size} board after {TRIES} tries")


def render(shape: tuple[int, int], floor: set[Cell], goals: set[Cell], boxes, player: Cell) -> list[str]:
    """The text rows of a room of ``shape`` (rows, columns); a cell off the floor is a wall."""
    rows = []
    for r in range(shape[0]):
        row = ""
        for c in range(shape[1]):
            cell = (r, c)
            if cell == player:
                row += "+" if cell in goals else "@"
            elif cell in boxes:
                row += "*" if cell in goals else "$"
            elif cell in goals:
                row += "."
            else:
                row += " " if cell in floor else "#"
        rows.append(row)
    return rows


@dataclass(frozen=True)
class Room:
    """One game's state: walls, goals, boxes, the player, the moves made and whether it ended."""

    walls: frozenset[Cell]
    goals: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell
    size: tuple[int, int]
    max_moves: int = 200
    moves: int = 0
    invalid: int = 0
    done: bool = False

    @classmethod
    def start(cls, task: dict, max_moves: int = 200) -> Room:
        width = max(map(len, task["rows"]))
        rows = [row.ljust(width, "#") for row in task["rows"]]  # a short row ends in wall
        cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
        pick = lambda chars: frozenset(cell for cell, ch in cells.items() if ch in chars)  # noqa: E731
        player = next(iter(pick("@+")))
        return cls(pick("#"), pick(".*+"), pick("$*"), player, (len(rows), width), max_moves)

    @property
    def won(self) -> bool:
        return self.boxes <= self.goals

    def free(self, cell: Cell) -> bool:
        return 0 <= cell[0] < self.size[0] and 0 <= cell[1] < self.size[1] and cell not in self.walls

    def move(self, letter: object) -> tuple[Room, float]:
        """One move and its reward (``step_single``); a finished game stays as it is, for 0."""
        if self.done:
            return self, 0.0
        dr, dc = STEPS.get(letter, (0, 0)) if isinstance(letter, str) else (0, 0)
        nxt = (self.player[0] + dr, self.player[1] + dc)
        boxes, reward = self.boxes, R_STEP
        valid = (dr, dc) != (0, 0) and self.free(nxt)
        if valid and nxt in boxes:
            onto = (nxt[0] + dr, nxt[1] + dc)
            valid = self.free(onto) and onto not in boxes
            if valid:
                boxes = (boxes - {nxt}) | {onto}
                reward += R_ON_GOAL * (onto in self.goals and nxt not in self.goals)
                reward += R_OFF_GOAL * (nxt in self.goals and onto not in self.goals)
        if not valid:
            reward, nxt = R_INVALID, self.player
        reward += LAMBDA * (GAMMA * -distance(boxes, self.goals) + distance(self.boxes, self.goals))
        room = replace(self, boxes=boxes, player=nxt, moves=self.moves + 1, invalid=self.invalid + (not valid))
        if room.won:
            return replace(room, done=True), reward + R_WIN
        if room.moves >= self.max_moves:
            return replace(room, done=True), reward + R_FAIL
        return room, reward

    def play(self, action: object) -> tuple[Room, float]:
        return play_moves(self, action)

    def render(self) -> str:
        """The board in the legend's symbols (the reference's text observation)."""
        floor = {(r, c) for r in range(self.size[0]) for c in range(self.size[1])} - self.walls
        return "\n".join(render(self.size, floor, set(self.goals), self.boxes, self.player))
