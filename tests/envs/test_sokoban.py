"""Sokoban (collab.envs.games): moves, pushes and rewards against hand computations of PettingLLMs' rules
(``SokobanGridEnvState.step_single``), the roles' turn rewards and the seeded rooms (solved by a BFS here).

A move pays -0.01 (-0.05 when invalid) + 0.1 * (0.99 * -D_after + D_before), D the boxes' summed distances to their
nearest goals; a push onto a goal +1.0, off one -0.5; all boxes on goals +10.0.
"""

from collections import deque

import pytest

from collab.envs import make_env
from collab.envs.games.sokoban import Room, generate
from collab.errors import UserError

LINE = {"rows": ["#######", "#     #", "# @$ .#", "#     #", "#######"]}  # D = 2
WALLED = {"rows": ["#######", "#  .  #", "# @$# #", "#     #", "#######"]}  # the box at (2, 3), a wall right of it
TWO = {"rows": ["#######", "#     #", "# @*  #", "#   $.#", "#######"]}  # one box on a goal, one next to its goal
STILL_AT = {2: -0.01 + 0.1 * (0.99 * -2 + 2), 1: -0.01 + 0.1 * (0.99 * -1 + 1)}  # a move with no push, at D
WIN = -0.01 + 0.1 * (0.99 * -1 + 2) + (-0.01 + 1.0 + 0.1 * 1 + 10.0)  # R R: D 2 -> 1 -> 0, onto the goal, won


@pytest.mark.parametrize(
    "task,action,reward,player,moves,invalid,done",
    [
        (LINE, ["R", "R"], WIN, (2, 4), 2, 0, True),
        (LINE, ["R", "R", "L"], WIN, (2, 4), 2, 0, True),  # nothing after the win
        (LINE, ["L"], STILL_AT[2], (2, 1), 1, 0, False),
        (LINE, ["U", "U"], STILL_AT[2] + (-0.05 + 0.1 * (0.99 * -2 + 2)), (1, 2), 2, 1, False),  # into the wall
        (LINE, ["X"], -0.05 + 0.1 * (0.99 * -2 + 2), (2, 2), 1, 1, False),
        (WALLED, ["R"], -0.05 + 0.1 * (0.99 * -1 + 1), (2, 2), 1, 1, False),  # the box cannot move into the wall
        (WALLED, ["D", "R", "U"], 2 * STILL_AT[1] + (-0.01 + 1.0 + 0.1 * 1 + 10.0), (2, 3), 3, 0, True),
        (TWO, ["R"], -0.01 - 0.5 + 0.1 * (0.99 * -2 + 1), (2, 3), 1, 0, False),  # pushed off its goal
        (LINE, [], 0.0, (2, 2), 0, 0, False),
        (LINE, [1], -1.0, (2, 2), 0, 0, False),
        (LINE, "R", -1.0, (2, 2), 0, 0, False),
    ],
)
def test_moves_and_rewards_by_hand(task, action, reward, player, moves, invalid, done):
    room, got = Room.start(task).play(action)
    assert got == pytest.approx(reward, rel=1e-12, abs=1e-12)
    assert (room.player, room.moves, room.invalid, room.done) == (player, moves, invalid, done)


def test_a_pushed_box_moves_and_the_move_limit_ends_the_game():
    room, _ = Room.start(LINE).play(["R"])
    assert room.boxes == {(2, 4)} and "@$" in room.render()
    assert room.play(["R"])[0].render().splitlines()[2] == "#   @*#"
    limited, reward = Room.start(LINE, max_moves=1).play(["L", "L"])
    assert limited.done and limited.moves == 1 and reward == pytest.approx(STILL_AT[2] - 5.0, rel=1e-12)
    finished, _ = Room.start(LINE).play(["R", "R"])
    assert finished.play(["L"]) == (finished, 0.0)


def test_the_roles_rewards_by_hand():
    env = make_env("sokoban")
    state = env.reset({"id": "hand", **LINE})
    step = env.step(state, ["print('stuck')", "#### [R, R]"])
    assert step.rewards == pytest.approx((-2.0 + WIN, 2 * WIN), rel=1e-12) and step.done and step.info["solved"]
    # any printed list is the tool's action in Sokoban: a list of numbers is a bad format, -1
    step = env.step(state, ["```python\nprint('**Actions List**: [1, 2]')\n```", '#### ["L"]'])
    assert step.rewards == pytest.approx((-1.0 + STILL_AT[2], 2 * STILL_AT[2]), rel=1e-12) and not step.done


def solvable(rows) -> bool:
    """A BFS over (player, boxes) with pushes: whether every box can reach a goal."""
    cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    walls = {p for p, ch in cells.items() if ch == "#"}
    goals = {p for p, ch in cells.items() if ch in ".*+"}
    start = (next(p for p, ch in cells.items() if ch in "@+"), frozenset(p for p, ch in cells.items() if ch in "$*"))
    seen, queue = {start}, deque([start])
    while queue:
        (r, c), boxes = queue.popleft()
        if boxes <= goals:
            return True
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            step, beyond = (r + dr, c + dc), (r + 2 * dr, c + 2 * dc)
            if step in walls:
                continue
            moved = boxes
            if step in boxes:
                if beyond in walls or beyond in boxes:
                    continue
                moved = (boxes - {step}) | {beyond}
            if (step, moved) not in seen:
                seen.add((step, moved))
                queue.append((step, moved))
    return False


@pytest.mark.parametrize("size,boxes", [(6, 1), (7, 2)])
def test_rooms_are_seeded_and_solvable(size, boxes):
    env = make_env("sokoban", size=size, boxes=boxes, num_train=60, num_eval=10)
    train = env.tasks("train")
    assert train == make_env("sokoban", size=size, boxes=boxes, num_train=60, num_eval=10).tasks("train")
    assert len({str(t["rows"]) for t in train}) > 30
    for task in [*train, *env.tasks("eval")]:
        rows = task["rows"]
        assert len(rows) == size and all(len(row) == size for row in rows)
        assert rows[0] == rows[-1] == "#" * size and all(row[0] == row[-1] == "#" for row in rows)
        text = "".join(rows)
        assert text.count("@") + text.count("+") == 1
        assert text.count("$") == boxes and text.count("*") == 0 and text.count(".") + text.count("+") == boxes
        assert solvable(rows)
    assert generate(3, size, boxes) == generate(3, size, boxes)


def test_bad_options_are_one_line_errors():
    for options, word in (({"size": 4}, "size"), ({"boxes": 0}, "boxes"), ({"boxes": 5}, "boxes")):
        with pytest.raises(UserError, match=word):
            make_env("sokoban", **options)
