r"""The collaborative debate of MAPoRL (MAPoRL, Section 3.1; Du et al. 2024), a POSG with per-agent rewards.

A agents answer a question over T = ``horizon`` turns. Turn t+1 *replaces* each agent's history with
``[its system prompt, one user message]`` holding the question and every agent's responses of turns 1..t
(:func:`collab.envs.debate.prompts.debate_prompt`): s_(t+1)i = LLM_i(q ⊕_{j, t' <= t} s_t'j); A = 1 is
self-correction. ``Score.rewards[a]`` is the verifier's score of agent a's answer; the algorithms build
Definition 1 and the incentives of Tables 1-2 from it (:mod:`collab.objectives.debate`).

``stop_on_consensus`` (:func:`consensus`) ends a debate early; the skipped turns are absorbing (``votes``
and ``majority@t`` repeat the last played turn, as :func:`collab.objectives.absorb` does for the scores).
How it departs from the reference code's ``check_agent_consensus``: docs/fidelity.md#debate-consensus-stop.
Datasets and splits: docs/environments.md#debate-maporl.

**Memory** (whole tuples, rewritten every turn; index ``[turn][agent]``): ``answers`` (normalised, ``None``:
unparsable), ``correct`` (rule verdicts, also under a learned verifier), ``scores`` (verifier, in [0, 1]),
``responses``, ``majority`` (per turn); with ``stop_on_consensus`` also ``consensus`` (agreed answer or ``None``).

**Info** (``env/<name>``): ``majority@t`` for t = 1..current (Section 4.1, ties in expectation), ``accuracy``,
``agent_accuracy``, ``answered`` (share parsable); with ``stop_on_consensus`` also ``consensus`` (0/1).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from collab.envs.base import AgentRole, Env, EnvState, Message, Score
from collab.envs.debate.datasets import NLI, is_nli, load_nli
from collab.envs.debate.prompts import agent_name, debate_prompt, first_prompt, system_prompt
from collab.envs.debate.verifier import RuleVerifier, Verifier, grade_answer
from collab.envs.math.datasets import DATASETS, is_path
from collab.envs.math.env import MathEnv
from collab.envs.math.published import known
from collab.envs.records import select
from collab.errors import UserError, require
from collab.objectives import majority_vote

HEADER_TOKENS = 12
"""Tokens of a response's header in a debate prompt (``[Round 1, agent12 (you)]``) and the blank line after it."""

SPLITS = ("train", "eval")
MAX_NEW_TOKENS = {"math": 300, "nli": 250}
"""MAPoRL, Section 4.2: 300 tokens on GSM8K, 250 on ANLI."""


def consensus(
    answers: Sequence[str | None],
    scores: Sequence[float] | None = None,
    share: float = 1.0,
    min_score: float | None = None,
) -> str | None:
    """The answer a debate turn agreed on, or ``None`` (the rule of ``DebateEnv(stop_on_consensus=True)``).

    ``answers[a]`` is agent a's parsed answer (``None``: unparsable). The agreed answer is a parsed
    answer given by at least ``share`` of all the agents (``share`` > 1/2, so at most one answer
    qualifies; unparsable answers count in the total but agree with nobody). With ``min_score``, the
    mean of its agents' ``scores`` must also be above ``min_score``. Two agents: ``("5", "5")`` agree on
    5, ``("5", None)`` and ``("5", "4")`` do not; three agents at ``share`` 2/3: ``("5", "5", "4")`` agree.
    """
    if not 0.5 < share <= 1.0:
        raise ValueError(f"consensus share must be in (0.5, 1], got {share}")
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return None
    answer, count = votes.most_common(1)[0]
    if count < math.ceil(share * len(answers) - 1e-9):
        return None
    if min_score is not None:
        if scores is None:
            raise ValueError("a consensus min_score needs the scores")
        mine = [float(s) for a, s in zip(answers, scores, strict=True) if a == answer]
        if sum(mine) / len(mine) <= min_score:
            return None
    return answer


def valid_datasets() -> str:
    return (
        f"{', '.join(DATASETS + NLI)}, anli:PATH, anli:HUB_ID@SPLIT, a path to a .json/.jsonl math file "
        "or a math NAME:PATH (marft, aime_1983_2024, gsm8k, tinygsm, drmas_math)"
    )


def _kind(dataset: str, eval_dataset: str | None) -> str:
    """``nli`` or ``math``: the kind of both datasets, or one line on a dataset unknown or of the other kind."""
    kind = "nli" if is_nli(dataset) else "math"
    for name in (dataset, eval_dataset or dataset):
        if ("nli" if is_nli(name) else "math") != kind or (kind == "math" and not known(name)):
            raise UserError(f"unknown {kind} debate dataset {name!r}; valid: {valid_datasets()}")
        if name.startswith("anli:"):
            source = name.removeprefix("anli:")
            require(
                is_path(source) or "@" in source,
                f"bad ANLI source {name!r}: {source!r} is not a .json/.jsonl/.parquet "
                "file; expected anli:PATH or anli:HUB_ID@SPLIT",
            )
    return kind


def _verifier(verifier: str | Verifier, fallback: bool) -> Verifier:
    if not isinstance(verifier, Verifier) and verifier != "rule":
        raise UserError(
            f"unknown verifier {verifier!r}; valid: rule, a Verifier object, or on the command line "
            "the folder of a learned verifier (python -m collab.envs.debate.learned_verifier)"
        )
    return verifier if isinstance(verifier, Verifier) else RuleVerifier(fallback)


class DebateEnv(Env):
    """A agents debate a question for T turns; each answer is scored by a verifier (MAPoRL)."""

    name = "debate"
    joint_reward = False
    reward_max = 1.0

    def __init__(
        self,
        dataset: str = "addition",
        agents: int = 2,
        horizon: int = 2,
        verifier: str | Verifier = "rule",
        train_split: str | None = None,
        eval_split: str | None = None,
        num_train: int = 512,
        num_eval: int = 64,
        fallback: bool = True,
        seed: int = 0,
        max_new_tokens: int | None = None,
        stop_on_consensus: bool = False,
        consensus_share: float = 1.0,
        consensus_score: float | None = None,
        eval_dataset: str | None = None,
    ) -> None:
        """
        Args:
            dataset: A dataset of the ``math`` env (:class:`~collab.envs.math.env.MathEnv`; ``addition`` by
                default) or NLI: ``cb``, ``rte``, ``anli:PATH`` (the hub's ``facebook/anli`` parquet, or the
                original release's jsonl), ``anli:HUB_ID@SPLIT``.
            eval_dataset: Where the eval split comes from instead (the same forms, of the same kind; MAPoRL
                trains on TinyGSM and evaluates on GSM8K's test set, ANLI's train_r3 and test_r3); each split
                then defaults to all of its records.
            agents: A, the number of debating agents (1: self-correction).
            horizon: T, the number of turns; every episode runs all of them unless ``stop_on_consensus``.
            verifier: ``rule`` (1 for a correct answer, else 0) or a Verifier object, e.g. a learned one
                (:func:`~collab.envs.debate.learned_verifier.load_verifier`; a folder on the command line).
            train_split, eval_split: Slices (``"[:100]"``) of each split (module docstring).
            num_train, num_eval: Generated training / eval problems (``num_eval``: a fixed dataset's eval sample).
            fallback: Grade unboxed answers (math: last "answer is X" phrase or number; NLI: last label word).
            seed: Seed of the generated training problems.
            max_new_tokens: Suggested response length; ``None``: 300 for math, 250 for NLI (MAPoRL, Section 4.2).
            stop_on_consensus: End a debate at the first turn whose answers reach a consensus (:func:`consensus`);
                the skipped turns are valued as an absorbing state (module docstring). Off (MAPoRL).
            consensus_share: Share of the agents that must give the same parsed answer, in (1/2, 1]; 1.0: all.
            consensus_score: If set, the agreeing agents' mean verifier score must also be above it (the reference
                code's 0.7; with the rule verifier: the agreed answer is right). None: any agreement counts.
        """
        super().__init__(horizon)
        require(agents >= 1, f"the debate needs at least 1 agent, got {agents}")
        require(
            num_train >= 1 and num_eval >= 1, f"num_train and num_eval must be >= 1, got {num_train} and {num_eval}"
        )
        require(0.5 < consensus_share <= 1.0, f"consensus_share must be in (0.5, 1], got {consensus_share}")
        require(
            consensus_score is None or 0.0 <= consensus_score < 1.0,
            f"consensus_score must be in [0, 1) or null, got {consensus_score}",
        )
        self.dataset, self.agents, self.fallback, self.seed = dataset, agents, fallback, seed
        self.stop_on_consensus = stop_on_consensus
        self.consensus_share, self.consensus_score = consensus_share, consensus_score
        self.kind = _kind(dataset, eval_dataset)
        self.eval_dataset = eval_dataset
        for spec in (train_split, eval_split):
            select([], spec)  # a malformed slice fails here
        self.num_train, self.num_eval = num_train, num_eval
        self.split_specs = {"train": train_split, "eval": eval_split}
        tokens = max_new_tokens or MAX_NEW_TOKENS[self.kind]
        self.roles = tuple(AgentRole(agent_name(i), system_prompt(i, agents), tokens) for i in range(agents))
        self.verifier = _verifier(verifier, fallback)
        self._math = None
        if self.kind == "math":
            self._math = MathEnv(
                dataset=dataset,
                profile="solo",
                horizon=1,
                train_split=train_split,
                eval_split=eval_split,
                num_train=num_train,
                num_eval=num_eval,
                fallback=fallback,
                seed=seed,
                eval_dataset=eval_dataset,
            )
        self._splits: dict[str, list[dict[str, Any]]] = {}
        self._all: list[dict[str, Any]] | None = None

    # -- tasks ---------------------------------------------------------------------------------------
    def tasks(self, split: str) -> Sequence[Mapping[str, Any]]:
        if split not in SPLITS:
            raise UserError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
        if self._math is not None:
            return self._math.tasks(split)
        if split not in self._splits:
            self._splits[split] = self._nli_split(split)
        return self._splits[split]

    def _records(self) -> list[dict[str, Any]]:
        if self._all is None:
            self._all = load_nli(self.dataset)
            require(bool(self._all), f"NLI dataset {self.dataset!r} has no labelled records")
        return self._all

    def _nli_split(self, split: str) -> list[dict[str, Any]]:
        spec = self.split_specs[split]
        if split == "eval" and self.eval_dataset is not None:
            out = select(load_nli(self.eval_dataset), spec)
        elif spec is not None or self.eval_dataset is not None:
            out = select(self._records(), spec)
        elif split == "eval" and self.split_specs["train"] is None:
            records = self._records()  # a fixed random sample, in file order, the same in every run
            rng = random.Random(f"collab.debate/{self.dataset}/eval")
            keep = set(rng.sample(range(len(records)), min(self.num_eval, len(records))))
            out = [r for i, r in enumerate(records) if i in keep]
        else:  # every record the other split does not take
            other = "eval" if split == "train" else "train"
            taken = {r["id"] for r in self.tasks(other)}
            out = [r for r in self._records() if r["id"] not in taken]
        require(
            bool(out),
            f"the {split} split of debate dataset {self.dataset!r} is empty ({split}_split={spec!r}); "
            f"pass {split}_split (e.g. train_split='[:16]' for cb, whose 56 records are all eval by default)",
        )
        return out

    # -- grading -------------------------------------------------------------------------------------
    def grade_answers(self, task: Mapping[str, Any], texts: Sequence[str]) -> list[tuple[str | None, bool]]:
        """The rule verdict on each response to ``task``: (normalised answer or None, correct)."""
        return [grade_answer(task, text, self.fallback) for text in texts]

    def votes(self, state: EnvState) -> tuple[tuple[tuple[str | None, ...], ...], tuple[tuple[bool, ...], ...]]:
        """Every turn's votes so far: ``(answers[t][a], correct[t][a])`` (the majority-vote evaluation's input).

        A debate that ended early (consensus) has the last played turn's votes repeated up to T: the agents
        keep their agreed answer, so ``majority@T`` counts it."""
        answers, correct = tuple(state.memory.get("answers", ())), tuple(state.memory.get("correct", ()))
        left = self.horizon - len(answers) if state.done and answers else 0
        return answers + answers[-1:] * left, correct + correct[-1:] * left

    # -- the Env protocol ----------------------------------------------------------------------------
    def observe(self, task: Mapping[str, Any]) -> list[str]:
        return [first_prompt(task)] * self.n_agents

    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        return self.score_batch([state], [actions])[0]

    def score_batch(self, states: Sequence[EnvState], actions: Sequence[Sequence[str]]) -> list[Score]:
        n = self.n_agents
        tasks = [s.task for s in states for _ in range(n)]
        texts = [str(a) for joint in actions for a in joint]
        graded = [grade_answer(t, x, self.fallback) for t, x in zip(tasks, texts)]
        if isinstance(self.verifier, RuleVerifier) and self.verifier.fallback == self.fallback:
            scores = [float(c) for _, c in graded]
        else:  # one call for every response of the batch
            scores = [min(1.0, max(0.0, float(s))) for s in self.verifier.score(tasks, texts)]
        out = []
        for k, (state, joint) in enumerate(zip(states, actions, strict=True)):
            rows = graded[k * n : (k + 1) * n]
            answers = tuple(a for a, _ in rows)
            correct = tuple(bool(c) for _, c in rows)
            turn_scores = tuple(scores[k * n : (k + 1) * n])
            majority = majority_vote(answers, correct)
            memory = state.memory
            mem = {
                "answers": tuple(memory.get("answers", ())) + (answers,),
                "correct": tuple(memory.get("correct", ())) + (correct,),
                "scores": tuple(memory.get("scores", ())) + (turn_scores,),
                "responses": tuple(memory.get("responses", ())) + (tuple(str(a) for a in joint),),
                "majority": tuple(memory.get("majority", ())) + (majority,),
            }
            stop = False
            if self.stop_on_consensus:
                agreed = consensus(answers, turn_scores, self.consensus_share, self.consensus_score)
                mem["consensus"] = tuple(memory.get("consensus", ())) + (agreed,)
                stop = agreed is not None
            played = len(mem["majority"])
            skipped = self.horizon - played if stop else 0  # absorbing: the agreed turn repeats to T
            info = {f"majority@{t + 1}": float(mem["majority"][min(t, played - 1)]) for t in range(played + skipped)}
            info.update(
                accuracy=float(majority),
                agent_accuracy=sum(correct) / n,
                answered=sum(a is not None for a in answers) / n,
            )
            if self.stop_on_consensus:
                info["consensus"] = float(stop)
            out.append(Score(turn_scores, terminated=stop, info=info, memory=mem))
        return out

    def prompt_tokens(self, first: int, turn: int, responses: Sequence[int]) -> int:
        """A turn's prompt replaces the history (:meth:`next_histories`) and holds the question and every agent's
        responses of every turn before, each under its round's and agent's header (:data:`HEADER_TOKENS`): with
        A agents a prompt grows by A responses a turn."""
        return first + turn * sum(r + HEADER_TOKENS for r in responses)

    def feedback(self, state: EnvState, actions: Sequence[str], score: Score) -> list[str]:
        """Each agent's next user message: the question and every agent's responses so far."""
        responses = tuple(state.memory.get("responses", ())) + (tuple(str(a) for a in actions),)
        return [debate_prompt(state.task, responses, i) for i in range(self.n_agents)]

    def next_histories(
        self, state: EnvState, actions: Sequence[str], score: Score, done: bool
    ) -> list[tuple[Message, ...]]:
        """Turn t+1's histories *replace* turn t's: [own system prompt, debate prompt]. After the last turn the
        final responses are appended instead (kept for logs and evaluation)."""
        if done:
            return [h + ({"role": "assistant", "content": a},) for h, a in zip(state.histories, actions)]
        prompts = self.feedback(state, actions, score)
        out = []
        for role, prompt in zip(self.roles, prompts, strict=True):
            system = ({"role": "system", "content": role.system_prompt},) if role.system_prompt else ()
            out.append(system + ({"role": "user", "content": prompt},))
        return out
