"""Competitive programming as a Flex-MG (MARFT, Sections 3.1 and 5.1, Appendix D.3, E.2).

The state s_0 is a CodeForces-style problem statement (E.2 layout) followed by the instruction to answer
with a complete Python program that reads standard input and writes standard output. The agents of a
D.3 coding profile act in order (``solo``: Coder; ``duo``: Reasoner -> Coder; ``trio``: Reasoner ->
Coder -> Reviewer) and the graded agent's program is run on the problem's tests; the team reward is
"the test case pass rate" (5.1). The judge line of the next state reads ``correct (passed 5/5 tests)`` or
``incorrect (passed 2/5 tests)``. Table 6 runs coding with a maximum horizon of 1, the default here.

Data (``dataset=``): ``None`` is the problem set shipped with collab (``collab/data/competitive_coding.jsonl``:
40 small problems of our own, 5-6 tests each with the examples first, and a reference solution each); a path or
``codeforces:PATH`` reads CodeForces records (:mod:`~collab.envs.competitive_coding.problems`). Default splits:
:func:`default_splits`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from collab.envs.base import Score
from collab.envs.competitive_coding.judge import extract_program, judge
from collab.envs.competitive_coding.problems import Skipped, load_problems
from collab.envs.records import packaged, select
from collab.envs.shared import SharedStateEnv
from collab.errors import UserError, require

SHIPPED = "competitive_coding.jsonl"

INSTRUCTION = (
    "Solve the problem in Python 3. The solution must be a complete program that reads the input "
    "from standard input and prints the answer to standard output. Give the program in one "
    "```python code block."
)


def default_splits(n: int) -> tuple[str, str]:
    """(train, eval) slices: the last fifth (rounded down) for eval, all problems for both when n < 5."""
    n_eval = n // 5
    return (f"[:{n - n_eval}]", f"[{n - n_eval}:]") if n_eval else ("[:]", "[:]")


class CompetitiveCodingEnv(SharedStateEnv):
    """Stdin/stdout programming problems graded by test pass rate (MARFT, 5.1)."""

    name = "competitive_coding"
    domain = "coding"
    default_max_new_tokens = 512

    def __init__(
        self,
        dataset: str | None = None,
        profile: str = "duo",
        horizon: int = 1,
        train_split: str | None = None,
        eval_split: str | None = None,
        timeout: float | None = 2.0,
        max_tests: int | None = 10,
        workers: int | None = None,
        memory_mb: int = 1024,
        eval_dataset: str | None = None,
    ) -> None:
        """
        Args:
            dataset: ``None`` for the shipped problem set, a path to a json/jsonl file, or ``codeforces:PATH``
                (``open-r1/codeforces`` as published, e.g. ``data/train-*.parquet``).
            eval_dataset: Where the eval split comes from instead (the same forms, e.g. the hub's
                ``data/test-*.parquet``); each split then defaults to its whole file.
            profile: ``solo``, ``duo``, ``trio``, a shipped profile name or a path (:mod:`collab.envs.profiles`).
            horizon: Steps per episode (MARFT Table 6: 1).
            train_split, eval_split: Slices of the problems, e.g. ``"[:32]"`` (default: module docstring).
            timeout: Wall-clock seconds per test; ``None``: each problem's own ``time_limit``.
            max_tests: Tests per problem at most (the first ones: examples come first); ``None``: all.
            workers: Programs run in parallel (default: the CPU count).
            memory_mb: Address-space limit of each run (a Python process needs more than CodeForces'
                256 MB measure of a C++ program, so problems' memory limits are shown, not enforced).
        """
        super().__init__(profile, horizon)
        require(
            timeout is None or float(timeout) > 0,
            f"competitive_coding timeout must be > 0 seconds or None, got {timeout}",
        )
        require(
            max_tests is None or int(max_tests) >= 1,
            f"competitive_coding max_tests must be >= 1 or None, got {max_tests}",
        )
        require(workers is None or int(workers) >= 1, f"competitive_coding workers must be >= 1, got {workers}")
        require(int(memory_mb) >= 64, f"competitive_coding memory_mb must be >= 64, got {memory_mb}")
        self.timeout = None if timeout is None else float(timeout)
        self.max_tests = None if max_tests is None else int(max_tests)
        self.workers = int(workers) if workers else os.cpu_count() or 1
        self.memory_mb = int(memory_mb)
        self.skipped = Skipped()
        problems = self._problems(dataset or packaged(SHIPPED))
        eval_problems, (train, evaluation) = problems, default_splits(len(problems))
        if eval_dataset is not None:
            eval_problems, train, evaluation = self._problems(eval_dataset), "[:]", "[:]"
        self.splits = {
            "train": select(problems, train_split or train),
            "eval": select(eval_problems, eval_split or evaluation),
        }

    def _problems(self, source: str) -> list[dict[str, Any]]:
        """The problems of ``source``, each cut to ``max_tests`` tests; a warning counts the skipped ones."""
        problems, skipped = load_problems(source)
        self.skipped.update(skipped)
        if skipped:
            warnings.warn(f"competitive_coding: skipped {sum(skipped.values())} problems ({skipped})", stacklevel=3)
        return [{**p, "tests": p["tests"][: self.max_tests]} for p in problems]

    def tasks(self, split: str) -> Sequence[Mapping[str, Any]]:
        if split not in self.splits:
            raise UserError(f"unknown split {split!r}; valid: eval, train")
        return self.splits[split]

    def problem(self, task: Mapping[str, Any]) -> str:
        return f"{task['statement'].strip()}\n\n{INSTRUCTION}"

    def time_limit(self, task: Mapping[str, Any]) -> float:
        """Seconds each test of ``task`` may run."""
        return self.timeout if self.timeout is not None else float(task.get("time_limit") or 2.0)

    def grade(self, task: Mapping[str, Any], answer: str) -> tuple[float, dict[str, float]]:
        return self.grade_batch([task], [answer])[0]

    def grade_batch(
        self, tasks: Sequence[Mapping[str, Any]], answers: Sequence[str]
    ) -> list[tuple[float, dict[str, float]]]:
        """Pass rates of many answers; all their tests run in one sandbox pool map (in parallel)."""
        programs = [extract_program(a) for a in answers]
        results = judge(tasks, programs, [self.time_limit(t) for t in tasks], self.workers, self.memory_mb)
        return [(j.pass_rate, j.info()) for j in results]

    def verdict(self, score: Score) -> str:
        """``correct``/``incorrect`` with the tests passed, or why nothing ran."""
        info = score.info
        word = "correct" if score.terminated else "incorrect"
        if not info.get("has_code", 1.0):
            return f"{word} (no Python program found)"
        if not info.get("compiled", 1.0):
            return f"{word} (the program has a syntax error)"
        if "tests_total" in info:
            return f"{word} (passed {int(info['tests_passed'])}/{int(info['tests_total'])} tests)"
        return word
