"""Sudoku (collab.envs.games): fills and rewards against hand computations of PettingLLMs' rules
(``SudukuEnvState.step``), the roles' turn rewards, the reference's instance files and the seeded puzzles.

Constraint counts (:func:`constraints`): a unit without a repeated digit counts its filled cells - 1. ONE_BLANK has
three full rows, columns and boxes (3 each) and one of each with 3 digits (2 each): 33; filled, 36.
"""

import json

import pytest

from collab.envs import make_env
from collab.envs.games.sudoku import Board, constraints, generate, read_puzzles
from collab.errors import UserError

SOLUTION = [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]
ONE_BLANK = {"puzzle": [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 0]]}
CORNER = {"puzzle": [[1, 2, 0, 0], [3, 4, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]}  # constraints: 1 + 1 + 1 + 1 + 3 = 7
LAST = -0.01 + 0.2 + 0.5 / 16 + 3 * 0.02 + 0.1  # the only candidate, 15 -> 16 filled, 33 -> 36 constraints, none empty


def test_constraint_counts_by_hand():
    assert constraints(Board.start(ONE_BLANK).grid) == 33 and constraints(Board.start(CORNER).grid) == 7
    assert constraints(tuple(map(tuple, SOLUTION))) == 36


@pytest.mark.parametrize(
    "task,action,reward,steps,done",
    [
        (ONE_BLANK, [[3, 3, 1]], LAST + 2.0 + 0.5, 2, True),  # 1 fill step <= 1 blank: the bonus
        (ONE_BLANK, SOLUTION, -0.01 + 2.0 + 0.5, 1, True),
        # another valid grid: the reference does not check the givens
        (ONE_BLANK, [SOLUTION[1], SOLUTION[0], SOLUTION[3], SOLUTION[2]], 2.49, 1, True),
        (ONE_BLANK, [[3, 3, 2]], -0.3, 2, False),  # clashes with row 3's 2
        (ONE_BLANK, [[0, 0, 1]], -0.3, 2, False),  # a given cell
        (ONE_BLANK, [[4, 0, 1]], -0.3, 2, False),  # off the grid
        (ONE_BLANK, [["a", 3, 1]], 0.0, 1, False),  # not three integers: skipped
        (ONE_BLANK, [], 0.0, 1, False),
        # a full grid breaking the rules: 15 -> 16 filled, 33 -> 27 constraints, -0.5
        (ONE_BLANK, [*SOLUTION[:3], [4, 3, 2, 2]], -0.01 + 0.5 / 16 - 6 * 0.02 - 0.5, 1, False),
        (ONE_BLANK, [*SOLUTION[:3], [4, 3, 2, 5]], -1.0, 0, False),  # a digit out of range
        (ONE_BLANK, [[1, 2]], -1.0, 0, False),  # neither a grid nor steps
        (ONE_BLANK, "[[3, 3, 1]]", -1.0, 0, False),
        # 2 candidates (+0.1), 4 -> 5 filled, 7 -> 8 constraints, 5/16 filled, cells left (+0.05)
        (CORNER, [[0, 2, 3]], -0.01 + 0.1 + 0.5 / 16 + 0.02 + 0.5 / 16 + 0.05, 2, False),
        # then (0, 3) = 4, its only candidate: 8 -> 10 constraints, 6/16 filled
        (
            CORNER,
            [[0, 2, 3], [0, 3, 4]],
            (-0.01 + 0.1 + 0.5 / 16 + 0.02 + 0.5 / 16 + 0.05) + (-0.01 + 0.2 + 0.5 / 16 + 0.04 + 0.6 / 16 + 0.05),
            3,
            False,
        ),
    ],
)
def test_fills_and_rewards_by_hand(task, action, reward, steps, done):
    board, got = Board.start(task).play(action)
    assert got == pytest.approx(reward, rel=1e-12, abs=1e-12)
    assert (board.steps, board.done) == (steps, done)


def test_the_bonus_needs_few_fill_steps_and_a_solved_board_pays_nothing():
    first, _ = Board.start(ONE_BLANK).play([[3, 3, 2]])  # 1 step + 1 played action: 2 steps
    second, reward = first.play([[3, 3, 1]])
    assert reward == pytest.approx(LAST + 2.0, rel=1e-12) and second.done and second.steps == 4
    assert second.play(SOLUTION) == (second, 0.0)


def grid_program(grid) -> str:
    return f"```python\nprint('**Actions List**: {json.dumps(grid)}')\n```"


def test_the_roles_rewards_by_hand():
    env = make_env("sudoku")
    state = env.reset({"id": "hand", **ONE_BLANK})
    # the tool prints the solution in the format its prompt asks for; the plan agent gives nothing: -2 + its 0
    step = env.step(state, [grid_program(SOLUTION), "The last cell is 1."])
    assert step.rewards == pytest.approx((2.49, -2.0), rel=1e-12) and not step.done
    assert step.state.memory["board"].steps == 1  # the plan's missing action is played as an empty one
    # a program that prints no list: the reference plays the missing action, an invalid format (-1)
    step = env.step(state, ["print('no idea')", "#### [[3, 3, 1]]"])
    assert step.rewards == pytest.approx((-1.0 + LAST + 2.5, 2 * (LAST + 2.5)), rel=1e-12)
    assert step.done and step.info["solved"] == 1.0


def test_puzzles_are_seeded_and_solvable():
    env = make_env("sudoku", num_train=100, num_eval=10)
    train = env.tasks("train")
    assert train == make_env("sudoku", num_train=100, num_eval=10).tasks("train")
    assert len({str(t["puzzle"]) for t in train}) > 90
    for size, blanks in ((4, 6), (4, 12), (9, 40)):
        for seed in range(20):
            puzzle = generate(seed, size, blanks)["puzzle"]
            assert sum(v == 0 for row in puzzle for v in row) == blanks
            solution = solve([row[:] for row in puzzle])
            assert solution is not None and all(
                puzzle[r][c] in (0, solution[r][c]) for r in range(size) for c in range(size)
            )


def solve(grid):
    """Backtracking over empty cells: a solution of ``grid`` or None."""
    size, box = len(grid), int(len(grid) ** 0.5)
    for r in range(size):
        for c in range(size):
            if grid[r][c] == 0:
                for v in range(1, size + 1):
                    R, C = r // box * box, c // box * box
                    block = [grid[i][j] for i in range(R, R + box) for j in range(C, C + box)]
                    if v not in grid[r] and v not in [grid[i][c] for i in range(size)] and v not in block:
                        grid[r][c] = v
                        if solve(grid) is not None:
                            return grid
                        grid[r][c] = 0
                return None
    return grid


def test_the_reference_instance_file(tmp_path):
    """``sudoku_4x4.json`` as scripts/dataprocess/load_sokoban.py writes it; task k is record (seed + k) mod n."""
    records = [
        {"id": k, "size": 4, "seed": k * 1000 + 400, "puzzle": p, "filled_cells": 0, "difficulty": "easy"}
        for k, p in enumerate([ONE_BLANK["puzzle"], CORNER["puzzle"], SOLUTION])
    ]
    path = tmp_path / "sudoku_4x4.json"
    path.write_text(json.dumps(records))
    assert [r["puzzle"] for r in read_puzzles(str(path), 4)] == [r["puzzle"] for r in records]
    env = make_env("sudoku", instances=str(path), num_train=4, num_eval=2, seed=1)
    assert [t["puzzle"] for t in env.tasks("train")] == [records[k]["puzzle"] for k in (1, 2, 0, 1)]
    assert [t["puzzle"] for t in env.tasks("eval")] == [records[k]["puzzle"] for k in (100_000 % 3, 100_001 % 3)]


@pytest.mark.parametrize(
    "text",
    [
        None,
        "not json",
        "{}",
        "[]",
        '[{"puzzle": [[1, 2], [3, 4]]}]',
        '[{"puzzle": [[1,2,3,4],[0,0,0,0],[0,0,0,0],[0,0,0,9]]}]',
    ],
)
def test_a_missing_or_malformed_instance_file_is_one_line(tmp_path, text):
    path = tmp_path / "sudoku_4x4.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UserError) as error:
        make_env("sudoku", instances=str(path))
    message = str(error.value)
    assert "\n" not in message and str(path) in message and '"puzzle" of 4 rows of 4 integers 0..4' in message


def test_bad_options_are_one_line_errors():
    for options, word in (({"size": 5}, "size"), ({"blanks": 0}, "blanks"), ({"num_train": 0}, "num_train")):
        with pytest.raises(UserError, match=word):
            make_env("sudoku", **options)


def test_the_prompt_size_bounds_a_long_feedback():
    """Counting a character as a token (the most ASCII text can take), the start-of-run projection
    (``Env.prompt_tokens``) holds a second turn whose program printed 5,000 characters and whose plan is 400 steps."""
    env = make_env("sudoku")
    state = env.reset({"id": "hand", **CORNER})
    tool = "```python\nprint('x' * 5000)\nprint('**Actions List**: ' + str([[0, 2, 3]] * 400))\n```"
    plan = "#### " + json.dumps([[0, 2, 3]] * 400)
    step = env.step(state, [tool, plan])
    for history in step.state.histories:
        first, response, feedback = history[1]["content"], history[2]["content"], history[3]["content"]
        assert len(feedback) > 1000 and "..." in feedback
        assert env.prompt_tokens(len(first), 1, [len(tool), len(plan)]) >= len(first) + len(response) + len(feedback)
