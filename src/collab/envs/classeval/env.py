"""ClassEval: a team completes a Python class, each agent writing its share of the methods (CoMLRL's code
completion task: OpenMLRL/LLM_Collab_Code_Completion, read at 1b754a3).

Every agent sees the whole skeleton and the methods it must write (:mod:`~collab.envs.classeval.data`: the
reference's partition, 1-parameter methods to the first agent and the rest to the second, or collab's ``round_robin``
for 2-8 agents) and answers with their definitions. The snippets go into the skeleton
(:mod:`~collab.envs.classeval.merge`), the record's unit tests run on the class in the sandbox
(:mod:`~collab.envs.classeval.runner`) and the team shares one reward (:mod:`~collab.envs.classeval.reward`,
at most 6).

Prompts and feedback are collab's words. The reference's prompt (``utils/prompting.py``) gives the skeleton, the
agent's methods and output rules (definitions only, no class line, imports or fences; none assigned: an empty
answer); its multi-turn feedback (``external/code_feedback.py``) gives the syntax check, the tests passed and up to 5
failing tests, as here. The reference's config trains 2 turns (``num_turns: 2``) with its rewards shifted by -6 and
ends an episode early through its trainer's threshold (MAGRPO's ``termination: node`` and ``termination_threshold``
here); the env itself never ends one early.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from collab import sandbox
from collab.envs.base import AgentRole, Env, EnvState, Score
from collab.envs.classeval import merge, runner
from collab.envs.classeval.data import PARTITIONS, assign, load_classes, methods, sanitize
from collab.envs.classeval.reward import REWARD_MAX, classeval_reward
from collab.envs.records import select
from collab.errors import require

PROMPT = """Your team is completing the Python class {name}; each of you writes some of its methods.

The class skeleton:

{skeleton}

{task}"""

YOURS = """Write these methods of {name}:
{methods}

Answer with their complete definitions (each starting with its def line) and nothing else: no class line, no
imports, no other methods, no explanations, no markdown fences."""

NONE = "No method of this class is yours: answer with an empty response."


class ClassEvalEnv(Env):
    """A team completing a class; one joint reward (module docstring)."""

    name = "classeval"
    reward_max = REWARD_MAX

    def __init__(
        self,
        horizon: int = 1,
        dataset: str | None = None,
        train_split: str | None = None,
        eval_split: str | None = None,
        agents: int = 2,
        partition: str = "params",
        test_timeout: float = runner.TEST_TIMEOUT,
        workers: int | None = None,
        max_new_tokens: int = 600,
    ) -> None:
        """
        Args:
            horizon: Turns per episode (the reference's config: 2).
            dataset: ClassEval's ``data/ClassEval_data.json`` as published (``PATH`` or ``classeval:PATH``); None:
                collab's three example classes.
            train_split, eval_split: Slices of the records; default the reference's ``[:66]`` and ``[66:82]``
                (the example: ``[:2]`` and ``[2:]``).
            agents: The team's size, 2-8.
            partition: Who writes which method: ``params`` (the reference's, 2 agents) or ``round_robin``
                (collab's, 2-8 agents).
            test_timeout: Seconds of each unit test (the reference's 40); a class's program gets 3 x that + 5.
            workers: Test programs run in parallel (default: the CPU count).
            max_new_tokens: Each agent's response length (the reference's 600).
        """
        super().__init__(horizon)
        require(partition in PARTITIONS, f"unknown classeval partition {partition!r}; valid: {', '.join(PARTITIONS)}")
        require(
            type(agents) is int and 2 <= agents <= 8, f"classeval agents must be a whole number in 2-8, got {agents!r}"
        )
        require(
            partition != "params" or agents == 2,
            f"classeval partition params (the reference's: 1-parameter methods to agent 1, the others to agent 2) "
            f"takes 2 agents, got {agents}; for 2-8 agents use partition round_robin",
        )
        positive = isinstance(test_timeout, (int, float)) and not isinstance(test_timeout, bool) and test_timeout > 0
        require(positive, f"classeval test_timeout must be a number of seconds > 0, got {test_timeout!r}")
        for key, value in {"workers": workers or 1, "max_new_tokens": max_new_tokens}.items():
            require(type(value) is int and value >= 1, f"classeval {key} must be a whole number >= 1, got {value!r}")
        self.partition, self.test_timeout = partition, float(test_timeout)
        self.workers = workers or os.cpu_count() or 1
        self.roles = tuple(AgentRole(f"coder{i + 1}", max_new_tokens=max_new_tokens) for i in range(agents))
        records = [
            {**r, "methods": methods(r["skeleton"]), "assigned": assign(r["skeleton"], agents, partition)}
            for r in load_classes(dataset)
        ]  # the file is read here: a bad one is refused before any model loads
        defaults = ("[:66]", "[66:82]") if dataset is not None else ("[:2]", "[2:]")
        self.splits = {
            "train": select(records, train_split or defaults[0]),
            "eval": select(records, eval_split or defaults[1]),
        }

    @cached_property
    def pool(self) -> sandbox.Pool:
        return sandbox.Pool(self.workers, runner.limits(self.test_timeout))

    def tasks(self, split: str) -> Sequence[Mapping[str, Any]]:
        require(split in self.splits, f"unknown split {split!r}; valid: eval, train")
        return self.splits[split]

    def observe(self, task: Mapping[str, Any]) -> list[str]:
        name, skeleton = task["class_name"], sanitize(task["skeleton"]).strip()
        tasks = [
            YOURS.format(name=name, methods="\n".join(f"- {m}" for m in mine)) if mine else NONE
            for mine in task["assigned"]
        ]
        return [PROMPT.format(name=name, skeleton=skeleton, task=t) for t in tasks]

    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        return self.score_batch([state], [actions])[0]

    def score_batch(self, states: Sequence[EnvState], actions: Sequence[Sequence[str]]) -> list[Score]:
        """Merge every joint action's class, then run all classes that compile in one pool."""
        built = []
        for state, joint in zip(states, actions, strict=True):
            task = state.task
            code = merge.valid_snippets(joint, task["assigned"])
            module = runner.program(merge.merge(task["skeleton"], task["class_name"], code), task["test"])
            built.append((len(code), module, runner.compiles(module)))
        ok = [i for i, (_, module, compiles) in enumerate(built) if compiles]
        runs = dict(zip(ok, runner.run_many([built[i][1] for i in ok], self.test_timeout, self.pool)))
        return [
            self._score(s, a, valid, compiles, runs.get(i, runner.TestRun()))
            for i, (s, a, (valid, _, compiles)) in enumerate(zip(states, actions, built))
        ]

    def _score(self, state: EnvState, joint: Sequence[str], valid: int, compiles: bool, run: runner.TestRun) -> Score:
        names = state.task["methods"]
        overlap = merge.overlaps(joint, names)
        total, parts = classeval_reward(valid, len(names), overlap, compiles, run.passed, run.run)
        info = {
            **parts,
            "total": total,
            "pass_rate": run.passed / run.run if run.run else 0.0,
            "solved": float(compiles and run.run > 0 and run.passed == run.run),
            "syntax_ok": float(compiles),
        }
        return Score(rewards=(total,) * self.n_agents, info=info, memory={"diagnostics": diagnostics(compiles, run)})

    def feedback(self, state: EnvState, actions: Sequence[str], score: Score) -> list[str]:
        text = score.memory["diagnostics"]
        return [
            f"{text}\n\nRevise your methods ({', '.join(mine)}): answer with their complete definitions only."
            if mine
            else f"{text}\n\n{NONE}"
            for mine in state.task["assigned"]
        ]


def diagnostics(compiles: bool, run: runner.TestRun) -> str:
    """The team's class after a turn: syntax, tests passed, up to 5 failing tests."""
    lines = ["Your team's class after this turn:"]
    lines.append("- Syntax: OK" if compiles else "- Syntax: ERROR (the class and its tests do not compile)")
    if not compiles:
        lines.append("- Tests: not run")
    elif run.error:
        lines.append(f"- Tests: no result ({run.error})")
    else:
        lines.append(f"- Tests: {run.passed}/{run.run} passed")
    if run.failing:
        more = f" (+{len(run.failing) - 5} more)" if len(run.failing) > 5 else ""
        lines.append("- Failing: " + "; ".join(run.failing[:5]) + more)
    return "\n".join(lines)
