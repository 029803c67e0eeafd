r"""Coding collaboration: an auxiliary and a main coder solve a problem together (CoLLM, 5.1, E.2, F.2).

The auxiliary agent writes a helper ``aux(...)``; the main agent writes the problem's entry point and
may call ``aux``. Their code is cleaned (:mod:`~collab.envs.coding.static`), concatenated after the
problem's imports and scored by :func:`~collab.envs.coding.reward.coding_reward`, with every assert
of the problem's ``check(candidate)`` run on its own in the sandbox (:mod:`collab.sandbox`).

Multi-turn (E.2): after a turn both agents receive the static and execution diagnostics (definitions
found, syntax, k/n tests passed, the first failing assert with its error, aux usage) and revise. The
episode ends when every test passes and main calls aux, or at the turn limit; with
``stop_on_failure`` it also ends where the reward evaluation stops (no main, a syntax error, no test
passing), as the writing environment does.

``reward_mode``: ``paper`` (default) reads CoLLM F.2 with ``ast`` (:mod:`~collab.envs.coding.static`,
:mod:`~collab.envs.coding.reward`); ``reference`` reproduces the reference code's reward (rules R1-R14 in
:mod:`~collab.envs.coding.reference`). Every difference, and why collab's default differs: docs/fidelity.md.

The E.2 diagnostics have the same layout in both modes, filled from the mode's own analysis (the reference's
``level_feedback`` lists every failing case instead of the first).

``visible_tests``, the ``run_tests`` tool (:mod:`~collab.envs.coding.tests_tool`) and the datasets (default
splits eval ``[:16]``, train ``[16:]``, CoopHumanEval's convention): docs/environments.md#coding-collaboration-collm.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from collab import sandbox
from collab.envs.base import AgentRole, Env, EnvState, Score
from collab.envs.coding import reference, schemes
from collab.envs.coding.harness import TestReport, run_many
from collab.envs.coding.reward import STAGES, RewardWeights, coding_reward
from collab.envs.coding.static import CodeFacts, analyze
from collab.envs.coding.tasks import load_tasks
from collab.envs.records import select
from collab.errors import UserError, require, unknown

AUX_PROMPT = """Create a helper function for this coding problem.
Problem: {prompt}
Instructions:
- Output ONLY the function code, no explanations or examples
- Do NOT include markdown code blocks (```python)
- Do NOT include any text before or after the function
- Do NOT include test cases or example usage
- Create a helper function named 'aux' that can assist the main function
- The function should return useful data for solving the problem

Your output should follow this format:

def aux(...):
    # your code here
    return result"""

MAIN_PROMPT = """Solve this coding problem by implementing the required function.
Problem: {prompt}
You have access to a helper function: aux(...)
Instructions:
- Output ONLY the function code, no explanations or examples
- Do NOT include markdown code blocks (```python)
- Do NOT include any text before or after the function
- Do NOT include test cases or example usage
- Do NOT redefine the aux() function
- Implement ONLY the '{entry_point}' function as specified
- You can call aux() to assign a value to a variable within your function if helpful

Your output should follow this format:

def {entry_point}({params}):
    # your function code here
    return result"""


def aux_usage(facts: CodeFacts) -> str:
    """The E.2 "aux usage" diagnostic line."""
    if not facts.calls_aux:
        return "NOT USED (main does not call aux)"
    if facts.discards_aux:
        return "DISCARDED (main calls aux but discards its return value)"
    if facts.thin_wrapper:
        return "WRAPPER ONLY (main only forwards its arguments to aux)"
    return "USED (main calls aux and uses its return value)"


def diagnostics(facts: CodeFacts, report: TestReport | None, entry_point: str) -> str:
    """CoLLM E.2's "Static and execution diagnostics" block (without the closing instruction)."""
    lines = [
        "Static and execution diagnostics:",
        "- Aux definition: "
        + (
            "FOUND (Auxiliary function aux defined)"
            if facts.aux_defined
            else "MISSING (no function aux with a return statement)"
        ),
        "- Main definition: "
        + (
            f"FOUND (Main function {entry_point} defined)"
            if facts.main_defined
            else f"MISSING (no function {entry_point} with a return statement)"
        ),
        "- Syntax: " + ("OK (Combined code syntax OK)" if facts.syntax_ok else f"ERROR ({facts.syntax_error})"),
    ]
    if report is None:
        lines.append("- Tests: not run")
    else:
        lines.append(f"- Tests: {report.n_passed}/{report.n_total} passed")
        if report.first_failure:
            lines += ["```", report.first_failure.strip("\n"), "```"]
    lines.append("- Aux usage: " + aux_usage(facts))
    return "\n".join(lines)


REWARD_MODES = ("paper", "reference")


def with_visible(task: dict[str, Any], n: int) -> dict[str, Any]:
    """``task`` with its first ``n`` tests visible (``visible_tests``) and the rest, or all of them when there is no
    rest, as its ``tests`` (what the reward runs); unchanged when ``n`` is 0."""
    if not n:
        return task
    tests = list(task["tests"])
    return {**task, "visible_tests": tests[:n], "tests": tests[n:] or tests}


class CodingEnv(Env):
    """Aux + main coders with the F.2 joint reward (max 4.0 with the default weights)."""

    name = "coding"
    roles = (AgentRole("aux", max_new_tokens=256), AgentRole("main", max_new_tokens=256))
    offered_tools = {"run_tests": "collab.envs.coding.tests_tool:RunTests"}

    def __init__(
        self,
        horizon: int = 1,
        dataset: str = "humaneval",
        path: str | None = None,
        train_split: str | None = None,
        eval_split: str | None = None,
        test_timeout: float | None = None,
        workers: int | None = None,
        stop_on_failure: bool = False,
        weights: Mapping[str, float] | None = None,
        reward_mode: str = "paper",
        visible_tests: int = 0,
    ) -> None:
        """
        Args:
            horizon: Turns per episode.
            dataset: humaneval | mbpp | coophumaneval | ``coophumaneval:PATH``.
            path: The file of ``coophumaneval`` as published (the hub's parquet, or its records as json/jsonl).
            train_split, eval_split: Slices of the records, e.g. ``"[16:]"``; default train ``[16:]``, eval ``[:16]``.
            test_timeout: Wall-clock seconds of each assert (default 8, CoLLM F.2; 10 in
                ``reference`` mode, the reference's alarm).
            workers: Programs run in parallel (default: the CPU count).
            stop_on_failure: Also end the episode where the reward evaluation stops.
            weights: Overrides of :class:`RewardWeights` fields, e.g. ``{discard_penalty: 1.0}`` (both modes).
            reward_mode: ``paper`` (CoLLM F.2 as collab reads it) or ``reference`` (the reference
                code's reward, quirks included); see the module docstring.
            visible_tests: Tests of each task shown in the prompts (its first ones; 0: none, as the papers). The
                reward, ``solved`` and pass@k then count the hidden ones, the rest (every test of a task that has
                no more than these); the ``run_tests`` tool runs an agent's code on the visible ones within its
                turn (:mod:`collab.envs.coding.tests_tool`). ``paper`` reward mode only.
        """
        super().__init__(horizon)
        if reward_mode not in REWARD_MODES:
            raise unknown("coding reward_mode", reward_mode, REWARD_MODES)
        self.reward_mode = reward_mode
        if test_timeout is None:
            test_timeout = reference.TEST_TIMEOUT if reward_mode == "reference" else 8.0
        require(test_timeout > 0, f"coding test_timeout must be > 0 seconds, got {test_timeout}")
        valid = set(RewardWeights.__dataclass_fields__)
        bad = sorted(set(weights or {}) - valid)
        if bad:
            raise UserError(f"unknown coding reward weight {bad[0]!r}; valid: {', '.join(sorted(valid))}")
        self.weights = RewardWeights(**{k: float(v) for k, v in (weights or {}).items()})
        self.reward_max = self.weights.maximum
        require(
            isinstance(visible_tests, int) and visible_tests >= 0,
            f"coding visible_tests must be a whole number >= 0, got {visible_tests!r}",
        )
        require(
            not visible_tests or reward_mode == "paper",
            "coding visible_tests needs reward_mode paper (the reference code shows no tests)",
        )
        self.visible_tests = visible_tests
        records = [with_visible(r, visible_tests) for r in load_tasks(dataset, path)]
        self.dataset = dataset.partition(":")[0]
        self.splits = {"train": select(records, train_split or "[16:]"), "eval": select(records, eval_split or "[:16]")}
        self.limits = sandbox.Limits(timeout_s=test_timeout)
        self.workers = workers or os.cpu_count() or 1
        self.stop_on_failure = stop_on_failure

    @cached_property
    def pool(self) -> sandbox.Pool:
        return sandbox.Pool(self.workers, self.limits)

    def tasks(self, split: str) -> Sequence[Mapping[str, Any]]:
        if split not in self.splits:
            raise UserError(f"unknown split {split!r}; valid: eval, train")
        return self.splits[split]

    def observe(self, task: Mapping[str, Any]) -> list[str]:
        prompt = task["prompt"].strip("\n")
        if task.get("visible_tests"):
            prompt += "\nVisible tests (candidate is your function):\n" + "\n".join(task["visible_tests"])
        return [
            AUX_PROMPT.format(prompt=prompt),
            MAIN_PROMPT.format(prompt=prompt, entry_point=task["entry_point"], params=task["params"]),
        ]

    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        return self.score_batch([state], [actions])[0]

    def score_batch(self, states: Sequence[EnvState], actions: Sequence[Sequence[str]]) -> list[Score]:
        """Analyze every pair, then run the tests of all pairs that reach level 3 in one pool."""
        if self.reward_mode == "reference":
            return self._score_reference(states, actions)
        facts = [analyze(a[0], a[1], s.task["entry_point"], s.task.get("imports", "")) for s, a in zip(states, actions)]
        testable = [i for i, f in enumerate(facts) if f.main_defined and f.syntax_ok]
        reports: list[TestReport | None] = [None] * len(facts)
        for i, report in zip(testable, run_many([(states[i].task, facts[i].program) for i in testable], self.pool)):
            reports[i] = report
        return [self._score(s, f, r) for s, f, r in zip(states, facts, reports)]

    def _score_reference(self, states: Sequence[EnvState], actions: Sequence[Sequence[str]]) -> list[Score]:
        facts = [reference.analyze(a[0], a[1], s.task) for s, a in zip(states, actions)]
        testable = [i for i, f in enumerate(facts) if f.main_defined and f.syntax_ok and f.cases]
        reports: list[reference.RefReport | None] = [None] * len(facts)
        runs = reference.run_many(
            [(facts[i].program, facts[i].cases) for i in testable], self.limits.timeout_s, self.workers, self.limits
        )
        for i, report in zip(testable, runs):
            reports[i] = report
        return [
            self._score(s, f, r, reference.reference_reward(f, r, self.weights))
            for s, f, r in zip(states, facts, reports)
        ]

    def _score(
        self,
        state: EnvState,
        facts: CodeFacts,
        report: TestReport | None,
        scored: tuple[float, str, dict[str, float]] | None = None,
    ) -> Score:
        if isinstance(facts, reference.RefFacts):
            n_total = len(facts.cases)
            n_passed = report.n_passed if isinstance(report, reference.RefReport) and report.loaded else 0
        else:
            n_passed, n_total = (report.n_passed, report.n_total) if report else (0, len(state.task["tests"]))
        total, stage, parts = scored or coding_reward(facts, n_passed, n_total, self.weights)
        solved = report is not None and n_total > 0 and n_passed == n_total
        scheme = schemes.classify(facts.main_code, state.task["entry_point"]) if facts.aux_defined else "none"
        info = {
            **parts,
            "total": total,
            "pass_rate": n_passed / max(n_total, 1),
            "solved": float(solved),
            "aux_defined": float(facts.aux_defined),
            "main_defined": float(facts.main_defined),
            "syntax_ok": float(facts.syntax_ok),
            "calls_aux": float(facts.calls_aux),
            "discards_aux": float(facts.discards_aux),
            "thin_wrapper": float(facts.thin_wrapper),
            **{f"stage/{s}": float(s == stage) for s in STAGES if s != "cooperation"},
            **{f"scheme/{s}": float(s == scheme) for s in schemes.SCHEMES},
        }
        terminated = (solved and facts.calls_aux) or (
            self.stop_on_failure and stage in ("structure", "syntax", "tests")
        )
        memory = {"diagnostics": diagnostics(facts, report, state.task["entry_point"])}
        return Score(rewards=(total, total), terminated=terminated, info=info, memory=memory)

    def feedback(self, state: EnvState, actions: Sequence[str], score: Score) -> list[str]:
        """E.2: both agents see the diagnostics, then "Revise your <function> accordingly."."""
        text = score.memory["diagnostics"]
        return [
            f"{text}\n\nRevise your aux accordingly.",
            f"{text}\n\nRevise your {state.task['entry_point']} accordingly.",
        ]

    def code(self, state: EnvState, actions: Sequence[str]) -> str:
        """The program the tests run for a joint action (for inspection in notebooks)."""
        if self.reward_mode == "reference":
            return reference.analyze(actions[0], actions[1], state.task).program
        return analyze(actions[0], actions[1], state.task["entry_point"], state.task.get("imports", "")).program
