"""Guess the hidden number: a two-agent cooperative env of one's own (docs/extending.md).

A hidden number n is drawn from 1..``high``. Each agent sees half of the information: the first is told
an interval of width ``window`` that holds n, the second whether n is even or odd; each answers with a
number. The team shares one reward (a Dec-POMDP, as MAGRPO's envs): the mean closeness of the two
guesses, 1 - |guess - n| / (high - 1) (0 for an answer without a number), plus ``agree_bonus`` when both
name n. Over several turns (``data.num_turns``) each agent is told whether its guess was too high or too
low and what its partner said, so that the two can combine their hints.

Tasks come from a seeded generator: ``num_tasks`` draws for the train split and ``num_eval_tasks`` others
for eval (different seeds, so the eval split is held out). Use it from this folder::

    python -m collab.fit --algo magrpo --config guess.yaml
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from collab.envs import AgentRole, Env, EnvState, Score
from collab.errors import UserError, require

_NUMBER = re.compile(r"-?\d+")


def guessed(text: str) -> int | None:
    """The first integer of a response (``None``: it names none)."""
    match = _NUMBER.search(text)
    return None if match is None else int(match.group())


class GuessEnv(Env):
    name = "guess"

    def __init__(
        self,
        high: int = 20,
        window: int = 6,
        agree_bonus: float = 1.0,
        num_tasks: int = 64,
        num_eval_tasks: int = 16,
        seed: int = 0,
        horizon: int = 1,
    ) -> None:
        super().__init__(horizon)
        require(
            high >= 2 and 1 <= window <= high,
            f"guess env needs high >= 2 and 1 <= window <= high, got {high}, {window}",
        )
        self.high, self.window, self.agree_bonus = high, window, agree_bonus
        self.num_tasks, self.num_eval_tasks, self.seed = num_tasks, num_eval_tasks, seed
        self.reward_max = 1.0 + agree_bonus
        system = f"You and a partner must guess a hidden whole number from 1 to {high}. Answer with the number only."
        self.roles = (AgentRole("interval", system, max_new_tokens=4), AgentRole("parity", system, max_new_tokens=4))

    def tasks(self, split: str) -> list[dict]:
        if split not in ("train", "eval"):
            raise UserError(f"unknown split {split!r}; valid: eval, train")
        rng = random.Random(f"{self.seed}-{split}")  # a seeded generator per split: eval is held out
        out = []
        for i in range(self.num_tasks if split == "train" else self.num_eval_tasks):
            n = rng.randint(1, self.high)
            low = rng.randint(max(1, n - self.window + 1), min(n, self.high - self.window + 1))
            out.append({"id": f"guess-{split}-{i}", "number": n, "low": low})
        return out

    def observe(self, task) -> list[str]:
        low = task["low"]
        parity = "even" if task["number"] % 2 == 0 else "odd"
        return [
            f"Hint: the number is between {low} and {low + self.window - 1}. Your guess:",
            f"Hint: the number is {parity}. Your guess:",
        ]

    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        n = state.task["number"]
        guesses = [guessed(a) for a in actions]
        closeness = [0.0 if g is None else max(0.0, 1 - abs(g - n) / (self.high - 1)) for g in guesses]
        exact = all(g == n for g in guesses)
        joint = sum(closeness) / len(closeness) + (self.agree_bonus if exact else 0.0)
        info = {"exact": float(exact), "invalid": float(sum(g is None for g in guesses))}
        return Score((joint, joint), terminated=exact, info=info)

    def feedback(self, state: EnvState, actions: Sequence[str], score: Score) -> list[str]:
        n = state.task["number"]
        guesses = [guessed(a) for a in actions]

        def verdict(g: int | None) -> str:
            return "no number" if g is None else "too low" if g < n else "too high" if g > n else "right"

        return [
            f"Your guess was {verdict(mine)}; your partner said "
            f"{other if other is not None else 'nothing'}. Guess again:"
            for mine, other in ((guesses[0], guesses[1]), (guesses[1], guesses[0]))
        ]
