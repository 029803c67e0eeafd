r"""The math problem-solving environment of MARFT (MARFT, Sections 3.1 and 5.1).

A Flex-MG on a shared text state (:class:`~collab.envs.shared.SharedStateEnv`): s_0 is the problem,
the profile's agents (``duo``: Reasoner -> Actor, Appendix D.3) act in order, and the verifier grades
the graded agent's final answer: reward 1 when it is correct, 0 otherwise (Section 5.1), for every
agent. A wrong answer appends the joint action and ``Judge: incorrect`` to the state and the team
tries again, up to ``horizon`` turns (2 in Tables 5, 9 and 10); a correct one ends the episode.

The answer is the last ``\boxed{}`` of the graded agent's output (:mod:`collab.envs.math.answers`);
with ``fallback=True`` (the default) an unboxed output is graded by its last "answer is X" phrase or
its last number, since small models rarely box; ``fallback=False`` grades boxed answers only, as the
paper does. ``grader="deepscaler"`` grades by Dr. MAS's rules instead (:mod:`collab.envs.math.deepscaler`:
the box after ``</think>``, MATH's normalisation or sympy equality; no fallback). Each grade logs ``correct``,
``answered`` (an answer was found) and ``boxed``.

Tools (:mod:`collab.tools.options`): a call whose result equals the problem's answer counts as ``tool_right``
(:meth:`MathEnv.right_call`); the calculator's task: docs/environments.md#tools-within-a-turn.

**Splits** (docs/environments.md#math-datasets): a generated dataset's eval set is fixed (its seed ignores
``seed``) and training problems skip any eval text (``small_addition``, ``large_arithmetic``: any eval
operands); a fixed dataset's eval set is a fixed random sample of ``num_eval``, train the rest in file order.

**Dr. MAS's verifier** (arXiv 2602.08847, its math orchestra: ``langfengQ/DrMAS``,
``agent_system/agent/orchestra/math``): with ``judge: verifier`` and a profile whose last agent reviews
(``math_drmas``: Solver -> Verifier, under MAGRPO's ``rollout_mode: episodes`` with ``dependency: chain``), no gold
answer is shown between turns: the verifier's ``<verify>approve</verify>`` (or a review without a verdict) ends the
attempt, ``<verify>reject</verify>`` sends the solver back with the turn's outputs appended to the state, and the
last turn (the reference's ``max_loop_num``: ``horizon``) is the solver's alone. The reward, 0 before, is the last
solver answer's grade, for every agent.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from collab.envs.base import EnvState, Score
from collab.envs.math import deepscaler
from collab.envs.math.answers import fallback_answer, is_equiv, last_boxed
from collab.envs.math.datasets import DATASETS, GENERATED, generate
from collab.envs.math.published import known, load_source, with_answers
from collab.envs.records import select
from collab.envs.shared import SharedStateEnv
from collab.errors import UserError, require, unknown

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
"""The line after each problem: the D.3 profiles ask for a boxed answer, the problem text says it too."""
SPLITS = ("train", "eval")
JUDGES = ("truth", "verifier")
APPROVE, REJECT = "<verify>approve</verify>", "<verify>reject</verify>"
CJK = re.compile("[\u4e00-\u9fff]")
GRADERS = ("collab", "deepscaler")


class MathEnv(SharedStateEnv):
    """Math problem solving with a team of profiled agents; reward 1 for a correct final answer."""

    name = "math"
    domain = "math"
    default_max_new_tokens = 256

    def __init__(
        self,
        dataset: str = "gsm_symbolic",
        profile: str = "duo",
        horizon: int = 2,
        train_split: str | None = None,
        eval_split: str | None = None,
        num_train: int = 512,
        num_eval: int = 64,
        fallback: bool = True,
        seed: int = 0,
        eval_dataset: str | None = None,
        judge: str = "truth",
        grader: str = "collab",
    ) -> None:
        """
        Args:
            dataset: ``gsm_symbolic`` (default), ``arithmetic``, ``addition``, ``gsm8k``, ``math``, ``math500``,
                ``aime`` (:mod:`collab.envs.math.datasets`), a path to a ``.json`` / ``.jsonl`` file with
                ``problem`` (or ``question``) and ``answer``, or a publisher's file as ``NAME:PATH``
                (``marft``, ``aime_1983_2024``, ``gsm8k``, ``tinygsm``, ``drmas_math``:
                :mod:`collab.envs.math.published`).
            eval_dataset: Where the eval split comes from instead (a fixed dataset, a path or ``NAME:PATH``);
                each split then defaults to all of its records (a generated training set still skips the
                eval problems).
            profile: ``solo``, ``duo`` (Reasoner -> Actor), ``trio``, a shipped profile name or a path.
            horizon: Attempts per problem; the episode also ends at the first correct answer.
            train_split, eval_split: Slices (``"[:100]"``) of each split's problems (module docstring).
            num_train, num_eval: Problems generated for train and eval; ``num_eval`` is also the size
                of the default eval sample of a fixed dataset.
            fallback: Grade unboxed answers by their last "answer is X" phrase or last number.
            seed: Seed of the generated training problems.
            judge: Who ends an attempt: ``truth`` (the gold answer: a correct one ends the episode, a wrong one gets
                ``Judge: incorrect``) or ``verifier`` (the profile's last agent, Dr. MAS's verifier: module docstring).
            grader: ``collab`` (:mod:`collab.envs.math.answers`: exact numbers, no algebra) or ``deepscaler``
                (Dr. MAS's DeepScaleR rules, :mod:`collab.envs.math.deepscaler`: sympy equality; ``fallback``
                does not apply, an unboxed answer is wrong).
        """
        super().__init__(profile, horizon)
        for name in (dataset, eval_dataset or dataset):
            if not known(name) or (name == eval_dataset and name in GENERATED):
                raise UserError(
                    f"unknown math dataset {name!r}; valid: {', '.join(DATASETS)}, a path to a .json/.jsonl file "
                    "or NAME:PATH with NAME marft, aime_1983_2024, gsm8k, tinygsm or drmas_math (eval_dataset: not "
                    "generated)"
                )
        for kind, value, valid in (("math grader", grader, GRADERS), ("math judge", judge, JUDGES)):
            if value not in valid:
                raise unknown(kind, value, valid)
        require(
            num_train >= 1 and num_eval >= 1, f"num_train and num_eval must be >= 1, got {num_train} and {num_eval}"
        )
        for spec in (train_split, eval_split):
            select([], spec)  # a malformed slice fails here, not at the first tasks() call
        require(
            judge == "truth" or self.answer_agent < self.n_agents - 1,
            f"math option judge verifier needs a profile whose last agent reviews the graded one (e.g. math_drmas), "
            f"got profile {profile!r}",
        )
        self.dataset, self.eval_dataset, self.fallback, self.seed = dataset, eval_dataset, fallback, seed
        self.judge = judge
        self.num_train, self.num_eval, self.grader = num_train, num_eval, grader
        self.split_specs = {"train": train_split, "eval": eval_split}
        self._splits: dict[str, list[dict[str, Any]]] = {}
        self._all: list[dict[str, Any]] | None = None  # every record of a fixed dataset

    # -- tasks ---------------------------------------------------------------------------------------
    def tasks(self, split: str) -> Sequence[Mapping[str, Any]]:
        if split not in SPLITS:
            raise UserError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
        if split not in self._splits:
            self._splits[split] = self._load(split)
        return self._splits[split]

    def _load(self, split: str) -> list[dict[str, Any]]:
        spec = self.split_specs[split]
        if split == "eval" and self.eval_dataset is not None:
            out = select(load_source(self.eval_dataset), spec)
        elif self.dataset in GENERATED:
            if split == "eval":
                records = generate(self.dataset, self.num_eval, "eval")
            else:
                held_out = {r["problem"] for r in self.tasks("eval")}
                records = generate(self.dataset, self.num_train, self.seed, exclude=held_out, phrasings=True)
            out = select(records, spec)
        elif spec is not None or self.eval_dataset is not None:
            out = select(self._records(), spec)
        else:  # every record that the other split does not take
            other = "eval" if split == "train" else "train"
            if split == "eval" and self.split_specs["train"] is None:
                out = self._default_eval()
            else:
                taken = {r["id"] for r in self.tasks(other)}
                out = [r for r in self._records() if r["id"] not in taken]
        out = with_answers(out)  # TinyGSM's answers, from the code of the problems selected
        require(
            bool(out),
            f"the {split} split of math dataset {self.dataset!r} is empty ({split}_split={spec!r}); "
            f"pass {split}_split, e.g. '[:]' for every record",
        )
        return out

    def _records(self) -> list[dict[str, Any]]:
        if self._all is None:
            self._all = load_source(self.dataset)
        return self._all

    def _default_eval(self) -> list[dict[str, Any]]:
        """A fixed random sample of ``num_eval`` records, in file order (the same in every run)."""
        records = self._records()
        rng = random.Random(f"collab.math/{self.dataset}/eval")
        keep = set(rng.sample(range(len(records)), min(self.num_eval, len(records))))
        return [r for i, r in enumerate(records) if i in keep]

    # -- Flex-MG -------------------------------------------------------------------------------------
    def problem(self, task: Mapping[str, Any]) -> str:
        return f"{task['problem']}\n\n{INSTRUCTION}"

    def right_call(self, task: Mapping[str, Any], use) -> bool:
        """Whether a tool call within a turn (:class:`collab.tools.turns.ToolUse`) returned the problem's answer
        (with tools: ``env/tool_right``, :mod:`collab.tools.setup`)."""
        return not use.result.startswith("error:") and is_equiv(use.result.strip(), str(task["answer"]))

    def grade(self, task: Mapping[str, Any], answer: str) -> tuple[float, dict[str, float]]:
        """1.0 when the graded agent's final answer equals the gold one (MARFT, Section 5.1)."""
        if self.grader == "deepscaler":
            found = deepscaler.final_answer(answer)
            boxed = float(found is not None)  # its only answers are boxed ones
            correct = float(found is not None and deepscaler.matches(found, task["answer"]))
            return correct, {"correct": correct, "answered": boxed, "boxed": boxed}
        boxed = last_boxed(answer or "")
        pred = boxed if boxed is not None else (fallback_answer(answer or "") if self.fallback else None)
        correct = float(bool(pred) and is_equiv(pred, str(task["answer"])))
        return correct, {"correct": correct, "answered": float(bool(pred)), "boxed": float(boxed is not None)}

    # -- Dr. MAS's verifier as the judge -------------------------------------------------------------------
    @staticmethod
    def approves(review: str) -> bool:
        """The verifier's verdict as Dr. MAS reads it: ``<verify>approve</verify>`` anywhere approves, else
        ``<verify>reject</verify>`` rejects, and a review with neither approves."""
        return APPROVE in review or REJECT not in review

    def score_batch(self, states: Sequence[EnvState], actions: Sequence[Sequence[str]]) -> list[Score]:
        """With ``judge: verifier`` an attempt ends when the verifier approves it, or at the last turn, where the
        verifier is not called; the episode's reward is then the graded answer's, 0 before."""
        if self.judge == "truth":
            return super().score_batch(states, actions)
        graded = self.grade_batch([s.task for s in states], [a[self.answer_agent] for a in actions])
        out = []
        for state, joint, (reward, info) in zip(states, actions, graded):
            last = state.turn + 1 >= self.horizon
            approved = self.approves(joint[-1])
            ends = last or approved
            info = {**info, "solved": float(ends and reward >= self.solve_threshold)}
            if not last:
                info["approved"] = float(approved)
            out.append(Score((float(reward) if ends else 0.0,) * self.n_agents, terminated=ends, info=info))
        return out

    def valid(self, agent: int, action: str) -> bool:
        """Dr. MAS's valid actions: the solver's holds a boxed answer; the verifier's (the last agent's) holds
        ``<verify>`` and ``</verify>`` and no CJK character (its tag projection's rules). Any other agent's, and every
        action under ``judge: truth``, is valid."""
        if self.judge == "truth":
            return True
        if agent == self.answer_agent:  # the reference's projection: DeepScaleR's box, over the whole response
            return deepscaler.last_boxed(action) is not None
        if agent == self.n_agents - 1:  # the verifier
            return "<verify>" in action and "</verify>" in action and CJK.search(action) is None
        return True

    def verdict(self, score: Score) -> str | None:
        return None if self.judge == "verifier" else super().verdict(score)

    def played(self, state: EnvState, actions: Sequence[str]) -> tuple[bool, ...]:
        """Under the verifier the last turn is the graded agent's alone: Dr. MAS's last loop calls no verifier."""
        if self.judge == "verifier" and state.turn + 1 >= self.horizon:
            return tuple(i != self.n_agents - 1 for i in range(self.n_agents))
        return super().played(state, actions)
