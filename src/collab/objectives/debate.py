"""MAPoRL's debate rewards: influence-aware rewards (Definition 1), revision and influence incentives (Tables 1-2),
majority votes (Section 4.1), absorbing early stops and the per-token KL reward (Section 3.2)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

# --- MAPoRL (MAPoRL, Sections 3.1-3.3 and 4.1) ---------------------------------------------------------------------
#
# A debate of A agents over T turns yields a verifier score s[t, a] of every answer (0-based turns and agents here).
# Definition 1 turns the scores into influence-aware rewards; Tables 1 and 2 add revision and influence incentives,
# both relative to the "majority opinion of others" at a turn (:func:`majority_of_others`), and Section 4.1 scores a
# finished debate by a majority vote with ties taken in expectation (:func:`majority_vote`).


def influence_rewards(scores: Tensor, gamma: float) -> Tensor:
    """Influence-aware verification rewards of MAPoRL, Definition 1, on one sampled debate.

    ``scores[..., t, a]`` is the verifier's score of agent a's answer at turn t (T turns, A agents). The expectation of
    Definition 1 is replaced by the sampled debate:

        R[t, a] = (s[t, a] + sum_{t'=t+1..T-1} gamma^(t'-t) mean_j s[t', j]) / sum_{t'=t..T-1} gamma^(t'-t)

    so an answer is rewarded for its own score and, discounted, for the mean score of every later turn it influenced.
    The last turn's reward is its own score; ``gamma = 0`` gives the plain per-turn scores (0^0 = 1).
    """
    if scores.dim() < 2:
        raise ValueError(f"scores must be [..., T, A], got shape {tuple(scores.shape)}")
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    means = scores.mean(-1)  # [..., T]
    turns = scores.shape[-2]
    future = torch.zeros_like(means)
    norm = torch.ones(turns, dtype=scores.dtype, device=scores.device)
    for t in range(turns - 2, -1, -1):  # F_t = gamma (mean_{t+1} + F_{t+1}); N_t = 1 + gamma N_{t+1}
        future[..., t] = gamma * (means[..., t + 1] + future[..., t + 1])
        norm[t] = 1.0 + gamma * norm[t + 1]
    return (scores + future.unsqueeze(-1)) / norm.unsqueeze(-1)


def _votes(answers: Sequence[str | None], correct: Sequence[bool]) -> dict[str, list[bool]]:
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers but {len(correct)} correctness flags")
    votes: dict[str, list[bool]] = {}
    for answer, right in zip(answers, correct):
        if answer is not None:
            votes.setdefault(answer, []).append(bool(right))
    return votes


def majority_vote(answers: Sequence[str | None], correct: Sequence[bool]) -> float:
    """Majority-vote accuracy of one turn's answers, ties in expectation (MAPoRL, Section 4.1 "Evaluation Method").

    Each agent votes for its (normalised) answer; ``None`` (unparsable) casts no vote. The answers with the most votes
    are the winners; the score is the share of winners that are correct (the expected accuracy of picking one of the
    tied answers at random). An answer's correctness is its voters' (their mean, should graders disagree). No vote at
    all scores 0. Two agents, one right: 0.5; three agents answering 1-1-1 with one right: 1/3; 2-1 with the two
    right: 1.
    """
    votes = _votes(answers, correct)
    if not votes:
        return 0.0
    top = max(len(v) for v in votes.values())
    winners = [sum(v) / len(v) for v in votes.values() if len(v) == top]
    return float(sum(winners) / len(winners))


def majority_of_others(answers_t: Sequence[str | None], correct_t: Sequence[bool], a: int) -> float | None:
    """Whether the majority opinion of the agents other than ``a`` at one turn is right (MAPoRL, Tables 1-2).

    The other agents' answers are put to :func:`majority_vote`: 1.0 (R) when its value is 1 (every winning answer is
    correct), 0.0 (W) when it is 0 (every winning answer is wrong), and ``None`` (undetermined) otherwise — a tie
    between a right and a wrong answer, whose expected correctness lies strictly between 0 and 1 — or when the others
    cast no vote (all unparsable, or A = 1). An undetermined majority gives no incentive.
    """
    others_answers = [x for j, x in enumerate(answers_t) if j != a]
    others_correct = [c for j, c in enumerate(correct_t) if j != a]
    if not _votes(others_answers, others_correct):
        return None
    value = majority_vote(others_answers, others_correct)
    if value == 1.0:
        return 1.0
    if value == 0.0:
        return 0.0
    return None


def majority_of_others_table(answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]]) -> Tensor:
    """:func:`majority_of_others` for every turn and agent of a debate: a float ``[T, A]`` tensor of 1 (R), 0 (W) and
    NaN (undetermined), the ``majority`` argument of :func:`revision_incentives` and :func:`influence_incentives`.

    ``answers[t][a]`` / ``correct[t][a]`` as the debate env's ``memory["answers"]`` / ``memory["correct"]``.
    """
    rows = []
    for answers_t, correct_t in zip(answers, correct, strict=True):
        row = [majority_of_others(answers_t, correct_t, a) for a in range(len(answers_t))]
        rows.append([float("nan") if m is None else m for m in row])
    return torch.tensor(rows, dtype=torch.float32)


def _check_incentive_inputs(correct: Tensor, majority: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    if correct.shape != majority.shape or correct.dim() < 2:
        raise ValueError(
            f"correct and majority must both be [..., T, A], got {tuple(correct.shape)} and {tuple(majority.shape)}"
        )
    right = correct.bool()
    maj = majority.to(torch.promote_types(majority.dtype, torch.float32))
    known = ~torch.isnan(maj)
    return right, maj == 1, known


def revision_incentives(correct: Tensor, majority: Tensor, alpha0: float, alpha1: float) -> Tensor:
    """Incentives for an agent's own answer revisions, MAPoRL Table 1 (Section 3.3).

    ``correct[..., t, a]``: whether agent a's answer at turn t is right (R) or wrong (W); ``majority[..., t, a]``: the
    majority opinion of the others at turn t, 1 (R), 0 (W) or NaN (undetermined; :func:`majority_of_others_table`).
    For each consecutive pair (t, t+1), with the agent's answers at t -> t+1 and the others' majority at t:

        R -> W, majority R: -alpha1        (talked out of a right answer although the others agreed with it)
        R -> W, majority W: -alpha0        (followed a wrong majority)
        W -> R, majority W: +alpha0        (critical reasoning: found the right answer against a wrong majority)
        W -> R, majority R: +alpha1        (persuaded by correct information)
        R -> R, W -> W, or majority undetermined: 0

    The incentive is applied to the answer at turn t+1: row t+1 of the output; row 0 is 0.
    """
    right, maj_r, known = _check_incentive_inputs(correct, majority)
    out = torch.zeros(correct.shape, dtype=torch.float32, device=correct.device)
    before, after, m, k = right[..., :-1, :], right[..., 1:, :], maj_r[..., :-1, :], known[..., :-1, :]
    value = torch.zeros(before.shape, dtype=torch.float32, device=correct.device)
    value = torch.where(before & ~after & m, -alpha1, value)
    value = torch.where(before & ~after & ~m, -alpha0, value)
    value = torch.where(~before & after & ~m, alpha0, value)
    value = torch.where(~before & after & m, alpha1, value)
    out[..., 1:, :] = torch.where(k, value, torch.zeros_like(value))
    return out


def influence_incentives(correct: Tensor, majority: Tensor, beta0: float, beta1: float) -> Tensor:
    """Incentives for an agent's influence on the others' answers, MAPoRL Table 2 (Section 3.3).

    Same inputs as :func:`revision_incentives`. For each consecutive pair (t, t+1), with the others' majority at
    t -> t+1 and the agent's own answer at t:

        majority R -> W, agent R: -beta1   (could not keep the others right although it was right)
        majority R -> W, agent W: -beta0   (its wrong answer pulled the others off the right one)
        majority W -> R, agent W: +beta0   (a wrong answer with useful information led the others to the right one)
        majority W -> R, agent R: +beta1   (persuaded the others with its right answer)
        majority unchanged, or undetermined at t or t+1: 0

    The incentive is applied to the agent's answer at turn t: row t of the output; the last row is 0.
    """
    right, maj_r, known = _check_incentive_inputs(correct, majority)
    out = torch.zeros(correct.shape, dtype=torch.float32, device=correct.device)
    before, after, own = maj_r[..., :-1, :], maj_r[..., 1:, :], right[..., :-1, :]
    k = known[..., :-1, :] & known[..., 1:, :]
    value = torch.zeros(before.shape, dtype=torch.float32, device=correct.device)
    value = torch.where(before & ~after & own, -beta1, value)
    value = torch.where(before & ~after & ~own, -beta0, value)
    value = torch.where(~before & after & ~own, beta0, value)
    value = torch.where(~before & after & own, beta1, value)
    out[..., :-1, :] = torch.where(k, value, torch.zeros_like(value))
    return out


# --- MAPoRL's rewards of a played debate (MAPoRL, Section 3.3) and its per-token reward (Section 3.2) ---------


def debate_rewards(
    scores: Tensor,
    correct: Tensor,
    majority: Tensor,
    gamma: float,
    alpha0: float = 0.0,
    alpha1: float = 0.0,
    beta0: float = 0.0,
    beta1: float = 0.0,
) -> Tensor:
    """``[T, A]`` rewards of every answer: Definition 1 plus the Table 1 and Table 2 incentives (MAPoRL, 3.3)."""
    correct = correct.bool()
    return (
        influence_rewards(scores.float(), gamma)
        + revision_incentives(correct, majority, alpha0, alpha1)
        + influence_incentives(correct, majority, beta0, beta1)
    )


def absorb(rows, turns_left: int):
    """An episode's per-turn table extended to the horizon: the last played turn repeated ``turns_left`` more times.

    ``rows`` is a ``[t, ...]`` tensor or a sequence of per-turn rows (answers, correctness); a debate that ended
    early by consensus is an absorbing state in which the agents keep their last answers."""
    if turns_left < 0:
        raise ValueError(f"turns_left must be >= 0, got {turns_left}")
    if torch.is_tensor(rows):
        return torch.cat([rows, rows[-1:].expand(turns_left, *rows.shape[1:])]) if turns_left else rows
    rows = list(rows)
    return rows + rows[-1:] * turns_left


def episode_rewards(
    scores: Tensor,
    answers,
    correct,
    turns_left: int,
    gamma: float,
    alpha0: float = 0.0,
    alpha1: float = 0.0,
    beta0: float = 0.0,
    beta1: float = 0.0,
) -> Tensor:
    """``[T, A]`` :func:`debate_rewards` of a debate played for t turns (``scores``: ``[t, A]``; ``answers`` and
    ``correct``: t rows of A) that ended ``turns_left`` = T - t turns early: the tables are first extended to T
    turns by :func:`absorb`. Rows t.. are the absorbing turns' rewards (not trained).

    Why (MAPoRL's early stop on consensus, the debate env's ``stop_on_consensus``): a debate that stops at
    turn t < T is an absorbing state in which the agents keep their agreed answer, so the last played turn
    repeats; only the played turns' answers are trained. A debate that reaches the right consensus earlier
    then never gives an answer a lower reward than one that reaches it later (its later turns score the
    maximum). The reference code instead cuts Definition 1's sums at the stopping turn (``score_rule`` in its
    ``trl/trl/trainer/utils_multi_unified.py``), which can reward a wrong turn-1 answer more when the right
    consensus comes later (A = 3, T = 3, gamma 1, two of three agents right at turn 2: 5/9 after a turn-3
    consensus, 1/2 after a turn-2 one; extended, 5/9 and 2/3).
    """
    answers, correct = absorb(answers, turns_left), absorb(correct, turns_left)
    majority = majority_of_others_table(answers, correct)
    return debate_rewards(
        absorb(scores, turns_left),
        torch.tensor(correct, dtype=torch.bool),
        majority,
        gamma,
        alpha0,
        alpha1,
        beta0,
        beta1,
    )


def token_rewards(reward: float | Tensor, old_logprobs: Tensor, ref_logprobs: Tensor, kl_coef: float) -> Tensor:
    """Section 3.2's per-token reward of one response: -lambda_KL (log pi_old - log pi_ref) at every token, plus R
    at the last.

    The paper writes the KL term as KL(pi_ref || pi); the per-token sample estimate of KL(pi || pi_ref) used
    here is the usual choice of PPO fine-tuning (InstructGPT, TRL) and needs no full-vocabulary sums: it is
    the one quantity the rollout's own samples estimate without bias."""
    rewards = -kl_coef * (old_logprobs - ref_logprobs)
    rewards[-1] = rewards[-1] + reward
    return rewards
