"""Reading the grid games' actions (collab.envs.games.turns), as PettingLLMs' stateful/utils.py reads them."""

import pytest

from collab.envs.games.turns import final_action, printed_action, program


@pytest.mark.parametrize(
    "text,moves,action",
    [
        ('Think.\n#### ["R", "D"]', True, ["R", "D"]),
        ("#### [R, D]", True, ["R", "D"]),  # unquoted moves
        ("#### [R, X]", True, None),
        ("#### [R, D]", False, None),  # unquoted words are no Sudoku list
        ('#### ["U"]\nmore\n#### ["L"]', True, ["L"]),  # the last #### line
        ("#### []", True, []),
        ("#### [[1, 2], [3, 4]]", False, [[1, 2], [3, 4]]),
        ("####[R]", True, None),  # a space after #### is required
        ('The answer is ["R"]', True, None),
        ("#### R, D", True, None),
        ("#### " + "[" * 100_000, False, None),
    ],
)
def test_final_action(text, moves, action):
    assert final_action(text, moves) == action


@pytest.mark.parametrize(
    "output,game,action",
    [
        ('**Actions List**: ["R", "D"]\n', "plan_path", ["R", "D"]),
        ("**Actions List**: [[1,2],[2,1]]", "sudoku", [[1, 2], [2, 1]]),  # read to the matching bracket
        ('Actions: ["U"]', "plan_path", ["U"]),
        ('path found\n["L", "L"]\n', "plan_path", ["L", "L"]),  # a line that is a list
        ('**Actions List**: ["R", "Q"]\n["D"]', "plan_path", ["D"]),  # not moves: the next reading
        ("**Actions List**: [1, 2]", "sudoku", None),
        ("[[0, 1, 2]]", "sudoku", [[0, 1, 2]]),
        ("nothing here", "plan_path", None),
        (None, "plan_path", None),
    ],
)
def test_printed_action(output, game, action):
    assert printed_action(output, game) == action


@pytest.mark.parametrize(
    "text,code",
    [
        ("Here:\n```python\nprint(1)\n```\nand\n```python\nprint(2)\n```", "print(2)"),
        ("```\nx = 1\n```", "x = 1"),
        ("```python\nprint(3)", "print(3)"),  # unclosed
        ("```\nx = 4", "x = 4"),
        ("```\nhello", "```\nhello"),  # an unclosed fence without code: the whole response
        ("  print(5)  ", "print(5)"),
    ],
)
def test_program(text, code):
    assert program(text) == code
