"""Plan-Path (collab.envs.games): moves and rewards against hand computations of PettingLLMs' rules
(``PlanPathGridEnvState.step_single``), the two roles' turn rewards, the turn and move limits, and the seeded boards.

The hand board, start (0, 0) and goal (2, 2), shortest walk 4 moves::

    ...
    .#.
    ...

A free move from distance d to d - 1 pays -0.01 + 0.99 * -(d - 1) + d; an invalid one at distance d pays
-0.10 + 0.99 * -d + d.
"""

from collections import deque

import pytest

from collab.envs import make_env
from collab.envs.games.plan_path import Walk, generate
from collab.errors import UserError

TASK = {"id": "hand", "grid": ["...", ".#.", "..."], "start": [0, 0], "goal": [2, 2]}
OPTIMAL = 1.02 + 1.01 + 1.00 + (0.99 + 1.0 + 0.5)  # R R D D: distances 4 -> 3 -> 2 -> 1 -> 0, goal, optimal bonus


def program(moves: str) -> str:
    return f"```python\nprint('**Actions List**: {moves}')\n```"


@pytest.mark.parametrize(
    "action,reward,pos,moves,invalid,done",
    [
        (["R", "R", "D", "D"], OPTIMAL, (2, 2), 4, 0, True),
        (["R", "R", "D", "D", "L"], OPTIMAL, (2, 2), 4, 0, True),  # moves after the goal are not played
        (["D", "R"], 1.02 + (-0.10 + 0.03), (1, 0), 2, 1, False),  # R runs into '#': the walker stays at d = 3
        (["U"], -0.10 + 0.04, (0, 0), 1, 1, False),  # off the board
        (["X"], -0.10 + 0.04, (0, 0), 1, 1, False),  # not a move
        (["U", "R", "R", "D", "D"], -0.06 + 1.02 + 1.01 + 1.00 + 1.99, (2, 2), 5, 1, True),  # 5 moves: no bonus
        (["D", "U"], 1.02 + (-0.01 + 0.99 * -4 + 3), (0, 0), 2, 0, False),  # a step away from the goal
        ([], 0.0, (0, 0), 0, 0, False),
        ([1, 2], -1.0, (0, 0), 0, 0, False),  # not a list of moves: the format penalty, nothing moves
        ("R", -1.0, (0, 0), 0, 0, False),
    ],
)
def test_moves_and_rewards_by_hand(action, reward, pos, moves, invalid, done):
    walk, got = Walk.start(TASK).play(action)
    assert got == pytest.approx(reward, rel=1e-12, abs=1e-12)
    assert (walk.pos, walk.moves, walk.invalid, walk.done) == (pos, moves, invalid, done)


def test_a_finished_walk_pays_nothing_and_the_move_limit_ends_it():
    walk, _ = Walk.start(TASK).play(["R", "R", "D", "D"])
    assert walk.play(["L"]) == (walk, 0.0)
    limited, reward = Walk.start(TASK, max_moves=2).play(["R", "R", "D"])
    assert limited.done and limited.moves == 2 and limited.pos == (0, 2)
    assert reward == pytest.approx(1.02 + 1.01 - 1.0, rel=1e-12)  # the second move hits the limit: -1.0


def test_the_roles_rewards_by_hand():
    """Tool: its action's reward on the pre-turn board + the plan's; plan: its reward twice, or -2 + it when empty."""
    env = make_env("plan_path")
    state = env.reset(TASK)
    step = env.step(state, [program('["D"]'), 'I go right twice, then down twice.\n#### ["R", "R", "D", "D"]'])
    assert step.rewards == pytest.approx((1.02 + OPTIMAL, 2 * OPTIMAL), rel=1e-12)
    assert step.done and step.turns_left == env.horizon - 1 and step.info["solved"] == 1.0
    # no #### line and a program printing nothing: -2 each, the board unchanged
    step = env.step(state, ["print(1)", "I would go right."])
    assert step.rewards == (-2.0, -2.0) and step.info["plan_parsed"] == step.info["tool_parsed"] == 0.0
    assert step.state.memory["board"].pos == (0, 0) and not step.done
    # an empty list is no action for the plan agent; the tool's printed [] is an action worth 0
    step = env.step(state, [program("[]"), "#### []"])
    assert step.rewards == (0.0, -2.0)
    # the tool's action is played on a copy: the plan's invalid move is what the board keeps
    step = env.step(state, [program('["R"]'), "#### [U]"])
    assert step.rewards == pytest.approx((1.02 - 0.06, -0.12), rel=1e-12)
    assert step.state.memory["board"].invalid == 1


def test_the_board_carries_over_turns_until_the_horizon():
    env = make_env("plan_path", horizon=2)
    first = env.step(env.reset(TASK), ["", "#### [R]"])
    assert first.rewards == pytest.approx((-2.0 + 1.02, 2 * 1.02), rel=1e-12) and not first.done
    feedback = first.state.histories[1][-1]["content"]
    assert "S.." not in feedback and ".S." in feedback and "You are at [0, 1]" in feedback
    second = env.step(first.state, ["", "#### [R]"])
    assert second.rewards == pytest.approx((-2.0 + 1.01, 2 * 1.01), rel=1e-12)
    assert second.done and second.turns_left == 0 and second.state.memory["board"].pos == (0, 2)


def test_the_move_limit_ends_the_episode():
    env = make_env("plan_path", max_moves=1)
    step = env.step(env.reset(TASK), ["", "#### [D]"])
    assert step.done and step.info["solved"] == 0.0
    assert step.rewards[1] == pytest.approx(2 * (1.02 - 1.0), rel=1e-9)


def bfs(grid, start, goal):
    seen, queue = {start}, deque([start])
    while queue:
        r, c = queue.popleft()
        if (r, c) == goal:
            return True
        for n in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if 0 <= n[0] < len(grid) and 0 <= n[1] < len(grid[0]) and grid[n[0]][n[1]] == "." and n not in seen:
                seen.add(n)
                queue.append(n)
    return False


@pytest.mark.parametrize("size", [4, 6])
def test_boards_are_seeded_and_solvable(size):
    env = make_env("plan_path", size=size, num_train=200, num_eval=20)
    train, again = env.tasks("train"), make_env("plan_path", size=size, num_train=200, num_eval=20).tasks("train")
    assert train == again and len({str(t["grid"]) + str(t["start"]) for t in train}) > 150
    for task in train + list(env.tasks("eval")):
        grid, start, goal = task["grid"], tuple(task["start"]), tuple(task["goal"])
        assert len(grid) == size and all(len(row) == size and set(row) <= {".", "#"} for row in grid)
        assert start != goal and grid[start[0]][start[1]] == "." == grid[goal[0]][goal[1]]
        assert bfs(grid, start, goal)
    blocked = sum(row.count("#") for t in train for row in t["grid"]) / (200 * size * size)
    assert 0.12 < blocked < 0.22  # 0.22 drawn, less kept: boards where the goal is cut off are drawn again
    assert [t["grid"] for t in env.tasks("eval")] != [t["grid"] for t in train[:20]]
    assert generate(7, size, size, 0.22) == generate(7, size, size, 0.22) != generate(8, size, size, 0.22)


def test_corridors_of_one_row_send_the_walker_left_or_right():
    """``rows: 1``: boards of one row and ``size`` columns; the right first move is R when G lies right of S and L
    when it lies left, both drawn, and U or D is an invalid move that leaves the walker where it is."""
    env = make_env("plan_path", size=4, rows=1, block_ratio=0.0, num_train=64, num_eval=16, one_move=True)
    tasks = env.tasks("train") + env.tasks("eval")
    assert all(t["grid"] == ["...."] and t["start"][0] == 0 == t["goal"][0] for t in tasks)
    sides = {"R" if t["goal"][1] > t["start"][1] else "L" for t in tasks}
    assert sides == {"L", "R"}
    task = next(t for t in tasks if t["goal"][1] == t["start"][1] - 1)  # G just left of S
    step = env.step(env.reset(task), ["U", "L"])
    assert step.done and step.info["solved"] == 1.0
    step = env.step(env.reset(task), ["L", "D"])
    assert not step.done and step.state.memory["board"].pos == tuple(task["start"])
    assert len(make_env("plan_path", size=5, rows=2).tasks("train")[0]["grid"]) == 2
    assert len(make_env("plan_path", size=5).tasks("train")[0]["grid"]) == 5  # rows default to size


def test_bad_options_are_one_line_errors():
    for options, word in (
        ({"size": 1}, "size"),
        ({"rows": 0}, "rows"),
        ({"rows": 1.5}, "rows"),
        ({"block_ratio": 1.0}, "block_ratio"),
        ({"max_moves": 0}, "max_moves"),
    ):
        with pytest.raises(UserError, match=word):
            make_env("plan_path", **options)


def test_one_move_roles_answer_one_move_each_by_hand():
    """``one_move``: both roles choose one of U/D/L/R (one token); the plan's move is played, the tool's on a copy,
    with the same rewards as the one-move lists; an answer outside the vocabulary is no action (-2 + r_plan)."""
    env = make_env("plan_path", one_move=True, horizon=5)
    assert [r.choices for r in env.roles] == [("U", "D", "L", "R")] * 2
    assert [r.max_new_tokens for r in env.roles] == [1, 1]
    state = env.reset(TASK)
    assert all(
        h[-1]["content"].endswith("Answer with the next move only: U, D, L or R.\n\nYour next move:")
        for h in state.histories
    )
    step = env.step(state, ["U", "R"])  # tool: off the board at d = 4 (-0.06); plan: R from 4 to 3 (1.02)
    assert step.rewards == pytest.approx((-0.06 + 1.02, 2 * 1.02), rel=1e-12)
    assert step.state.memory["board"].pos == (0, 1) and step.info["tool_parsed"] == 1.0 and not step.done
    assert step.state.histories[1][-1]["content"].startswith('Moves: tool ["U"], played ["R"].')
    step = env.step(step.state, [" R\n", "go"])  # the plan answered no move: -2 + 0, the board unchanged
    assert step.rewards == pytest.approx((1.01, -2.0), rel=1e-12) and step.state.memory["board"].pos == (0, 1)
    for tool, plan in (("R", "R"), ("D", "D"), ("D", "D")):
        step = env.step(step.state, [tool, plan])
    assert step.done and step.info["solved"] == 1.0 and step.state.memory["board"].pos == (2, 2)
    # the start-of-run size check's prompt bound: a turn's feedback adds the board's text and ~40 tokens, not a
    # program's output (100-token board text, 1-token answers, whole history)
    assert env.prompt_tokens(100, 2, [1]) == 100 + 2 * (1 + 100 + 40)
    with pytest.raises(UserError, match="plan_path option one_move must be true or false, got 1"):
        make_env("plan_path", one_move=1)
