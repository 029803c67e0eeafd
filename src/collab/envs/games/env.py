"""PettingLLMs' grid games (Plan-Path, Sudoku, Sokoban) as collab environments: a tool agent and a plan agent
take turns on one board (PettingLLMs, AT-GRPO; ``pettingllms/multi_agent_env/stateful/``).

Each turn the **tool** agent (``agents/tool_agent.py``) writes a Python program that prints an action list; collab
runs it in its sandbox (:mod:`collab.sandbox`, ``program_seconds`` of wall time, the reference's 20 s) and reads
the list (:func:`~collab.envs.games.turns.printed_action`). The **plan** agent (``agents/plan_agent.py``) writes its
reasoning and the action after ``####`` (:func:`~collab.envs.games.turns.final_action`); its action is the one
played on the board. The tool's action is played on a copy of the board, for its own reward only. The roles act
in that order (the reference's ``turn_order``); under ``model.dependency: chain`` the plan agent sees the tool's
response in the same turn, and both see the tool's printed output, the actions and the board in the next turn's
feedback (the reference shows the plan agent the tool's output within the turn).

Rewards per turn, as ``multi_agents_execution_engine.py`` assigns them (each agent's ``step`` and then its
``calculate_reward``, which adds the board's reward after the plan agent's move), with ``r_plan`` the reward of the
plan action on the board and ``r_tool`` that of the tool action on the pre-turn board:

- plan agent: ``r_plan + r_plan``, or ``-2 + r_plan`` when it gave no action or an empty one (then ``r_plan`` is
  the empty action's reward, 0);
- tool agent: ``r_tool + r_plan``; a program that printed no readable action scores ``-2 + r_plan`` in Plan-Path
  and Sokoban and ``-1 + r_plan`` in Sudoku (the reference plays the missing action there: an invalid format, -1).

Each agent gets its own reward (a POSG: ``joint_reward = False``); the game's reward rules are in its module. The
episode ends when the board is solved or the game's move limit is hit, or after ``horizon`` turns (the reference's
``max_turns``: 5 in ``config/stateful/stateful_L1_prompt.yaml``, 4 in its game scripts).

``one_move`` (Plan-Path and Sokoban; not the reference's game): both roles answer one move a turn from the closed
vocabulary U/D/L/R (one token each, :data:`turns.MOVES`), the tool agent without a program; the same boards and
reward rules, with one-move lists. A small scale for models that cannot yet write the reference's program and
``#### <list>`` line (SmolLM2-135M writes neither on 3 x 3 boards: docs/measurements.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from collab.envs.base import AgentRole, Env, EnvState, Score
from collab.envs.games import plan_path, sokoban, sudoku, turns
from collab.errors import UserError, require
from collab.sandbox import Limits, run

EVAL_SEED = 100_000
"""The eval instances' seeds start here, the train ones at ``seed`` (the reference's train and test seed offsets)."""
NO_ACTION = -2.0
OUTPUT_CHARS = 600
"""The program output a feedback shows: its last characters."""
LIST_CHARS = 300
"""An action list a feedback shows: its first characters."""
FEEDBACK_EXTRA = 1500
"""Tokens a feedback holds beyond the task's restatement, about at most: the output and the two lists at a token a
character (ASCII), and the lines around them."""

ONE_MOVE_FEEDBACK = 40
"""The same under ``one_move``: the two moves and the rewards."""
ONE_MOVE_LINE = "Answer with the next move only: U, D, L or R."
ONE_MOVE_PROMPT = "You walk a grid game one move at a time. Answer with the next move only: one letter, U, D, L or R."

TOOL_PROMPT = (
    "You solve planning problems by writing code. Write one complete Python program in a single ```python block. "
    "It must compute the answer from the given state (use a search such as BFS) and print it on its own line "
    "exactly as: **Actions List**: <list>"
)
PLAN_PROMPT = (
    "You are a planning and reasoning agent. You get the task and the code agent's program and output. Check them "
    "against the task, adopt the code's answer when it is right and correct it when it is not, reason briefly, "
    "and end with one line: #### <list>"
)


class GameEnv(Env):
    """The two roles, the turn's rewards and the feedback shared by the games; a game supplies its board."""

    game: ClassVar[str]
    joint_reward = False
    num_generations = 2
    """K of MAGRPO's tree when ``model.num_generations`` is null: a tree of T turns has K^T leaves (T = 4-5 here)."""

    def __init__(
        self, horizon: int, seed: int, num_train: int, num_eval: int, max_new_tokens: int, program_seconds: float
    ) -> None:
        super().__init__(horizon)
        for name, value in (("num_train", num_train), ("num_eval", num_eval), ("max_new_tokens", max_new_tokens)):
            require(
                type(value) is int and value >= 1, f"{self.name} option {name} must be an integer >= 1, got {value!r}"
            )
        require(type(seed) is int, f"{self.name} option seed must be an integer, got {seed!r}")
        require(
            isinstance(program_seconds, (int, float)) and not isinstance(program_seconds, bool) and program_seconds > 0,
            f"{self.name} option program_seconds must be a number > 0, got {program_seconds!r}",
        )
        self.seed, self.num_train, self.num_eval = seed, num_train, num_eval
        self.program_seconds = float(program_seconds)
        self.roles = (
            AgentRole("tool", TOOL_PROMPT, max_new_tokens=max_new_tokens),
            AgentRole("plan", PLAN_PROMPT, max_new_tokens=max_new_tokens),
        )
        self._splits: dict[str, list[dict]] = {}
        self.one_move = False

    def play_one_move(self, one_move: bool) -> None:
        """Under ``one_move`` both roles answer one move of :data:`turns.MOVES` (module docstring)."""
        require(type(one_move) is bool, f"{self.name} option one_move must be true or false, got {one_move!r}")
        self.one_move = one_move
        if one_move:
            self.roles = tuple(
                AgentRole(name, ONE_MOVE_PROMPT, max_new_tokens=1, choices=turns.MOVES) for name in ("tool", "plan")
            )

    # -- what a game supplies ---------------------------------------------------------------------------------
    def instance(self, seed: int) -> dict:
        """The instance drawn from ``seed``."""
        raise NotImplementedError

    def board(self, task: Mapping[str, Any]) -> Any:
        """The starting board of ``task``: a value with ``play(action) -> (board, reward)``, ``done``, ``render()``."""
        raise NotImplementedError

    def describe(self, board: Any) -> str:
        """The task's text for both roles: the rules, the board and the action format."""
        raise NotImplementedError

    # -- the env protocol -------------------------------------------------------------------------------------
    def tasks(self, split: str) -> Sequence[Mapping[str, Any]]:
        if split not in ("train", "eval"):
            raise UserError(f"unknown split {split!r}; valid: eval, train")
        if split not in self._splits:
            count, first = (self.num_train, self.seed) if split == "train" else (self.num_eval, EVAL_SEED)
            self._splits[split] = [{"id": f"{self.name}-{split}-{k}", **self.instance(first + k)} for k in range(count)]
        return self._splits[split]

    def observe(self, task: Mapping[str, Any]) -> list[str]:
        text = self.describe(self.board(task))
        if self.one_move:
            return [f"{text}\n\nYour next move:"] * 2
        return [f"{text}\n\nWrite the program.", f"{text}\n\nGive your plan, then the line #### <list>."]

    def current(self, state: EnvState) -> Any:
        return state.memory.get("board") or self.board(state.task)

    def tool_action(self, response: str) -> tuple[list | None, str | None]:
        """The tool agent's action and its program's output (None when the program did not finish)."""
        result = run(turns.program(response), limits=Limits(timeout_s=self.program_seconds, memory_mb=512))
        output = None if result.timed_out or result.killed_by else result.stdout
        return turns.printed_action(output, self.game), output

    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        board = self.current(state)
        if self.one_move:
            tool_action, plan_action = (turns.one_move(a) for a in actions)
            output = None
        else:
            tool_action, output = self.tool_action(actions[0])
            plan_action = turns.final_action(actions[1], moves=self.game != "sudoku")
        after, r_plan = board.play(plan_action or [])
        _, r_tool = board.play(tool_action)
        tool_missing = NO_ACTION if self.game != "sudoku" else r_tool
        rewards = (
            (tool_missing if tool_action is None else r_tool) + r_plan,
            (NO_ACTION if not plan_action else r_plan) + r_plan,
        )
        info = {
            "solved": float(after.done and self.solved(after)),
            "plan_reward": r_plan,
            "tool_reward": r_tool,
            "plan_parsed": float(plan_action is not None),
            "tool_parsed": float(tool_action is not None),
        }
        memory = {"board": after, "tool_output": output, "tool_action": tool_action, "plan_action": plan_action}
        return Score(rewards, terminated=after.done, info=info, memory=memory)

    def solved(self, board: Any) -> bool:
        """Whether a finished board is a win (not a move limit)."""
        return True

    def prompt_tokens(self, first: int, turn: int, responses: Sequence[int]) -> int:
        """Each turn's feedback restates the task with the new board (about ``first`` tokens) and adds the program's
        last :data:`OUTPUT_CHARS` characters of output, the two lists and the rewards (:data:`FEEDBACK_EXTRA`;
        :data:`ONE_MOVE_FEEDBACK` under ``one_move``)."""
        kept = turn if self.history_window is None else min(turn, self.history_window)
        extra = ONE_MOVE_FEEDBACK if self.one_move else FEEDBACK_EXTRA
        return first + kept * (max(responses, default=0) + first + extra)

    def feedback(self, state: EnvState, actions: Sequence[str], score: Score) -> list[str]:
        m = score.memory
        if self.one_move:
            text = (
                f"Moves: tool {turns.show(m['tool_action'], LIST_CHARS)}, "
                f"played {turns.show(m['plan_action'], LIST_CHARS)}. "
                f"Rewards this turn: tool {score.rewards[0]:.2f}, plan {score.rewards[1]:.2f}.\n\n"
                f"{self.describe(m['board'])}\n\nYour next move:"
            )
            return [text, text]
        output = (
            "(the program did not finish)" if m["tool_output"] is None else m["tool_output"].strip()[-OUTPUT_CHARS:]
        )
        text = (
            f"The code agent's program printed:\n{output or '(nothing)'}\n"
            f"Code agent's action: {turns.show(m['tool_action'], LIST_CHARS)}. "
            f"Played action: {turns.show(m['plan_action'], LIST_CHARS)}. "
            f"Rewards this turn: tool {score.rewards[0]:.2f}, plan {score.rewards[1]:.2f}.\n\n"
            f"{self.describe(m['board'])}"
        )
        return [f"{text}\n\nWrite the program.", f"{text}\n\nGive your plan, then the line #### <list>."]


class PlanPathEnv(GameEnv):
    """Plan-Path (:mod:`collab.envs.games.plan_path`): walk from S to G; default boards 4 x 4, as small as the
    embedded SmolLM2-135M can walk (the reference's ``map_size`` boards are 10 x 10 by default)."""

    name = "plan_path"
    game = "plan_path"
    # reward_max stays None (unknown): one turn's list of moves is unbounded, and the reference's shaping pays a
    # walker stepping back and forth d > 1 cells from the goal 0.02 d - 0.03 a pair of moves.

    def __init__(
        self,
        size: int = 4,
        block_ratio: float = 0.22,
        max_moves: int = 10_000,
        horizon: int = 5,
        seed: int = 0,
        num_train: int = 256,
        num_eval: int = 32,
        max_new_tokens: int = 256,
        program_seconds: float = 20.0,
        one_move: bool = False,
        rows: int | None = None,
    ) -> None:
        """
        Args:
            size: Columns of a board, and its rows unless ``rows`` (the reference's ``map_size``).
            block_ratio: Probability that a cell is blocked.
            max_moves: Moves (over all turns) after which the game is lost (the reference's ``max_steps``).
            horizon: Turns of an episode (the reference's ``max_turns``).
            seed: Seed of the first training board (board k: ``seed + k``; eval board k: 100,000 + k).
            num_train, num_eval: Boards in each split.
            max_new_tokens: Each role's response length.
            program_seconds: Wall time of the tool agent's program.
            one_move: Both roles answer one move a turn from U/D/L/R (module docstring; not the reference's game).
            rows: Rows of a board when not ``size`` (not the reference's: its boards are square); one row makes a
                corridor, where the right move is L or R by whether G lies left or right of S.
        """
        super().__init__(horizon, seed, num_train, num_eval, max_new_tokens, program_seconds)
        require(type(size) is int and size >= 2, f"plan_path option size must be an integer >= 2, got {size!r}")
        rows = size if rows is None else rows
        require(type(rows) is int and rows >= 1, f"plan_path option rows must be an integer >= 1, got {rows!r}")
        require(
            isinstance(block_ratio, (int, float)) and 0 <= block_ratio < 1,
            f"plan_path option block_ratio must be a number in [0, 1), got {block_ratio!r}",
        )
        require(
            type(max_moves) is int and max_moves >= 1, f"plan_path option max_moves must be >= 1, got {max_moves!r}"
        )
        self.size, self.rows, self.block_ratio, self.max_moves = size, rows, float(block_ratio), max_moves
        self.play_one_move(one_move)

    def instance(self, seed: int) -> dict:
        return plan_path.generate(seed, self.rows, self.size, self.block_ratio)

    def board(self, task):
        return plan_path.Walk.start(dict(task), self.max_moves)

    def solved(self, board) -> bool:
        return board.pos == board.goal

    def describe(self, board) -> str:
        return (
            "Walk on the grid from S to G ('.' free, '#' blocked; rows and columns count from 0). Moves: U (up), "
            "D (down), L (left), R (right); stay on the grid and off '#'.\n"
            f"Grid:\n{board.render()}\nYou are at {list(board.pos)}; the goal is at {list(board.goal)}.\n"
            + (
                ONE_MOVE_LINE
                if self.one_move
                else 'The list is the moves from here, e.g. ["R", "D"]; an empty list [] when at the goal.'
            )
        )


class SudokuEnv(GameEnv):
    """Sudoku (:mod:`collab.envs.games.sudoku`): default 4 x 4 with 6 blanks, the size of the reference's script."""

    name = "sudoku"
    game = "sudoku"

    def __init__(
        self,
        size: int = 4,
        blanks: int = 6,
        instances: str | None = None,
        horizon: int = 4,
        seed: int = 0,
        num_train: int = 256,
        num_eval: int = 32,
        max_new_tokens: int = 256,
        program_seconds: float = 20.0,
    ) -> None:
        """
        Args:
            size: N of the N x N grid: a square >= 4 (4, 9, 16).
            blanks: Empty cells of a generated puzzle.
            instances: A reference instance file (``sudoku_4x4.json``: :func:`~collab.envs.games.sudoku.read_puzzles`)
                instead of generated puzzles: task k of a split is record ``(first seed + k) mod records``, as the
                reference picks ``seed % len``.
            horizon: Turns of an episode (the reference's ``max_turns``: 4 in its 4 x 4 Sudoku script,
                ``scripts/train/game/plan_path_L1_prompt_8B_grpo copy.sh``, whose ``benchmark`` is ``suduku``).
            seed: Seed of the first training puzzle (puzzle k: ``seed + k``; eval puzzle k: 100,000 + k).
            num_train, num_eval: Puzzles in each split.
            max_new_tokens: Each role's response length.
            program_seconds: Wall time of the tool agent's program.
        """
        super().__init__(horizon, seed, num_train, num_eval, max_new_tokens, program_seconds)
        require(
            type(size) is int and size >= 4 and size == int(size**0.5) ** 2,
            f"sudoku option size must be a square >= 4 (4, 9, 16), got {size!r}",
        )
        require(
            type(blanks) is int and 1 <= blanks <= size * size,
            f"sudoku option blanks must be an integer in 1..{size * size}, got {blanks!r}",
        )
        self.size, self.blanks = size, blanks
        self.records = None
        if instances is not None:
            self.records = sudoku.read_puzzles(str(instances), size)

    def instance(self, seed: int) -> dict:
        if self.records is not None:
            return self.records[seed % len(self.records)]
        return sudoku.generate(seed, self.size, self.blanks)

    def board(self, task):
        return sudoku.Board.start(dict(task))

    def describe(self, board) -> str:
        n = self.size
        return (
            f"Solve the {n}x{n} Sudoku: fill 1..{n} so that each row, column and box holds every digit once.\n"
            f"Grid ('.' empty, rows and columns count from 0):\n{board.render()}\n"
            f"The list is either the whole solved grid, e.g. [[1,2,3,4],[3,4,1,2],[2,1,4,3],[4,3,2,1]], or fill "
            "steps [[row, column, digit], ...]."
        )


class SokobanEnv(GameEnv):
    """Sokoban (:mod:`collab.envs.games.sokoban`): default 6 x 6 rooms with one box, the reference's script's."""

    name = "sokoban"
    game = "sokoban"
    # reward_max stays None (unknown): a turn's list of moves is unbounded, as in plan_path

    def __init__(
        self,
        size: int = 6,
        boxes: int = 1,
        max_moves: int = 200,
        horizon: int = 4,
        seed: int = 0,
        num_train: int = 256,
        num_eval: int = 32,
        max_new_tokens: int = 256,
        program_seconds: float = 20.0,
        one_move: bool = False,
    ) -> None:
        """
        Args:
            size: Rows and columns of a room, the wall border included (the reference's ``map_size``: 6 in its
                ``scripts/train/game/sokoban_prompt_1.7B_at_grpo.sh``).
            boxes: Boxes (and goals) of a room (the reference's ``num_boxes``, 1).
            max_moves: Moves (over all turns) after which the game is lost (the reference's ``max_steps``).
            horizon: Turns of an episode (the reference's ``max_turns``: 4 in that script).
            seed: Seed of the first training room (room k: ``seed + k``; eval room k: 100,000 + k).
            num_train, num_eval: Rooms in each split.
            max_new_tokens: Each role's response length.
            program_seconds: Wall time of the tool agent's program.
            one_move: Both roles answer one move a turn from U/D/L/R (module docstring; not the reference's game).
        """
        super().__init__(horizon, seed, num_train, num_eval, max_new_tokens, program_seconds)
        require(type(size) is int and size >= 5, f"sokoban option size must be an integer >= 5, got {size!r}")
        require(
            type(boxes) is int and 1 <= boxes <= (size - 2) ** 2 // 4,
            f"sokoban option boxes must be an integer in 1..{(size - 2) ** 2 // 4} on a {size} x {size} room, got "
            f"{boxes!r}",
        )
        require(type(max_moves) is int and max_moves >= 1, f"sokoban option max_moves must be >= 1, got {max_moves!r}")
        self.size, self.boxes, self.max_moves = size, boxes, max_moves
        self.play_one_move(one_move)

    def instance(self, seed: int) -> dict:
        return sokoban.generate(seed, self.size, self.boxes)

    def board(self, task):
        return sokoban.Room.start(dict(task), self.max_moves)

    def solved(self, board) -> bool:
        return board.won

    def describe(self, board) -> str:
        on = len(board.boxes & board.goals)
        return (
            "Push every box onto a goal. Legend: '#' wall, ' ' floor, '.' goal, '$' box, '*' box on a goal, '@' you, "
            "'+' you on a goal. Moves: U (up), D (down), L (left), R (right); walking into a box pushes it if the "
            "cell behind it is free.\n"
            f"Boxes on goals: {on}/{len(board.boxes)}\nRoom:\n{board.render()}\n"
            + (ONE_MOVE_LINE if self.one_move else 'The list is the moves from here, e.g. ["R", "D"].')
        )
