"""The math of collab's algorithms as small pure tensor functions.

Every function here is unit-tested against a hand computation (tests/test_objectives.py). Algorithm
files call these and read like the papers' pseudo-code.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

BASELINES = ("mean", "max", "rloo", "none")


def num_inference_calls(n: int, k: int, horizon: int) -> int:
    """Proposition 3.2 of CoLLM: LLM calls for a full K-ary rollout tree of depth H.

    Every history node draws K joint actions (n calls each); a tree of depth H has
    K^0 + ... + K^(H-1) = (K^H - 1)/(K - 1) nodes, so N = n K (K^H - 1)/(K - 1) (= n H when K = 1).
    """
    if k == 1:
        return n * horizon
    return n * k * (k**horizon - 1) // (k - 1)


def discounted_returns(rewards: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma G_{t+1} along the last dimension (an episode's turns)."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        running = rewards[..., t] + gamma * running
        returns[..., t] = running
    return returns


def absorbing_reward(reward: Tensor | float, turns_left: Tensor | int, gamma: float) -> Tensor:
    """The return of a terminal turn whose episode ended ``turns_left`` turns before its horizon H.

    collab treats an early end (the environment terminates, or MAGRPO's early termination) as an absorbing
    state that repeats its last reward r until the horizon:

        G = r (1 + gamma + ... + gamma^m) = r (1 - gamma^(m+1)) / (1 - gamma),     m = ``turns_left``

    (``m = 0``: the plain reward). Without it a branch that succeeds at turn 1 keeps only r, while a
    sibling that succeeds at turn 2 collects two turns of reward, so early success gets a lower return
    and a negative advantage. The papers do not say what an ended branch is worth; the reference code
    (CoMLRL's tree) never ends a branch on the environment's word and scores the team again at every
    turn, which for a team that stays solved is exactly this repetition. Elementwise over tensors.
    """
    r = torch.as_tensor(reward, dtype=torch.float64 if not torch.is_tensor(reward) else reward.dtype)
    m = torch.as_tensor(turns_left, device=r.device)
    if bool((m < 0).any()):
        raise ValueError("turns_left must be >= 0")
    if gamma == 1.0:
        factor = (m + 1).to(r.dtype)
    else:
        factor = (1.0 - torch.pow(torch.as_tensor(gamma, dtype=r.dtype, device=r.device), (m + 1).to(r.dtype))) / (1.0 - gamma)
    return r * factor


def group_advantages(returns: Tensor, baseline: str = "mean", normalize_std: bool = False, eps: float = 1e-6) -> Tensor:
    """Group-relative advantages of K sibling samples (last dimension), MAGRPO Eq. 1 / CoLLM Eq. 1.

    ``mean``  A_k = G_k - mean_j G_j                      (MAGRPO, GRPO)
    ``max``   A_k = G_k - max_j G_j                       (only the best sample is not pushed down)
    ``rloo``  A_k = G_k - mean_{j != k} G_j               (leave-one-out, unbiased)
    ``none``  A_k = G_k                                   (plain MA-REINFORCE, b = 0)

    With ``normalize_std`` the advantages are divided by the group's standard deviation (unbiased,
    as TRL's GRPO) plus ``eps``; a group of identical returns then has zero advantages.
    """
    if baseline == "mean":
        adv = returns - returns.mean(-1, keepdim=True)
    elif baseline == "max":
        adv = returns - returns.max(-1, keepdim=True).values
    elif baseline == "rloo":
        k = returns.shape[-1]
        if k < 2:
            raise ValueError("the rloo baseline needs at least 2 samples per group")
        adv = (returns - returns.mean(-1, keepdim=True)) * k / (k - 1)
    elif baseline == "none":
        adv = returns.clone()
    else:
        raise ValueError(f"unknown baseline {baseline!r}; valid: {', '.join(BASELINES)}")
    if normalize_std:
        adv = adv / (returns.std(-1, keepdim=True) + eps)
    return adv


def clipped_surrogate(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, clip: float) -> Tensor:
    """PPO's clipped objective per sample, as a loss to minimise.

    rho = exp(log pi - log pi_old); loss = -min(rho A, clip(rho, 1 - eps, 1 + eps) A).
    With ``clip = inf`` this is the unclipped importance-weighted policy gradient of CoLLM Eq. 1.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip)
    return -torch.minimum(ratio * advantages, clipped * advantages)


def ratio_stats(logprobs: Tensor, old_logprobs: Tensor, clip: float) -> dict[str, float]:
    """The PPO diagnostics of one minibatch, logged by every clipped-surrogate algorithm.

    With rho = exp(log pi - log pi_old) over the samples (sequences or tokens) of ``logprobs``:
    ``train/ratio`` = mean rho; ``train/clip_frac`` = the share of samples with |rho - 1| > ``clip``
    (the samples whose gradient the clip can cut); ``train/approx_kl`` = mean((rho - 1) - log rho),
    Schulman's k3 estimate of KL(pi_old || pi) from samples of pi_old (>= 0, 0 iff pi = pi_old on them).
    Gradients are not tracked.
    """
    log_ratio = (logprobs.detach() - old_logprobs.detach()).float()
    ratio = log_ratio.exp()
    return {"train/ratio": float(ratio.mean()),
            "train/clip_frac": float(((ratio - 1).abs() > clip).float().mean()),
            "train/approx_kl": float((ratio - 1 - log_ratio).mean())}


def explained_variance(values: Tensor, returns: Tensor) -> float:
    """1 - Var[returns - values] / Var[returns]: how much of the returns' variance the critic's values
    explain (1: perfect, 0: no better than a constant, < 0: worse). Constant returns have no variance to
    explain: 0.0 then (a number, not NaN, so that every process logs the same keys and finite means)."""
    values, returns = values.detach().float().reshape(-1), returns.detach().float().reshape(-1)
    var = returns.var(unbiased=False)
    if values.numel() == 0 or float(var) == 0.0:
        return 0.0
    return float(1.0 - (returns - values).var(unbiased=False) / var)


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token KL(pi || pi_ref) estimate of Schulman's k3: exp(d) - d - 1 with d = log pi_ref - log pi (>= 0)."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1


# --- actor-critic (CoLLM Sections 3.2 and 4, Eqs. 2-5; MARFT's IPPO / MAPoRL baseline) ----------------
#
# Conventions: ``dones[t]`` (bool or 0/1) means the episode terminated with turn t, so h_{t+1} is terminal and its
# value is never bootstrapped (whatever ``next_values[t]`` holds there, NaN included). A horizon cut that is not a
# termination is expressed by bootstrapping from V(h_H) (``last_value`` in ``gae``). These functions keep whatever
# autograd graph their inputs carry; actor weights (TD errors, advantages) and critic targets are meant to be computed
# from detached critic outputs, and ``value_loss`` detaches its targets itself.


def td_targets(rewards: Tensor, next_values: Tensor, dones: Tensor, gamma: float) -> Tensor:
    """TD(0) targets y_t = r_t + gamma (1 - done_t) V(h_{t+1}) of CoLLM Eqs. 3 and 5 (elementwise)."""
    bootstrap = torch.where(dones.bool(), torch.zeros_like(next_values), next_values)
    return rewards + gamma * bootstrap


def td_errors(rewards: Tensor, values: Tensor, next_values: Tensor, dones: Tensor, gamma: float) -> Tensor:
    """delta_t = r_t + gamma (1 - done_t) V(h_{t+1}) - V(h_t): the actor weights of CoLLM Eqs. 2 (DC) and 4 (CC)."""
    return td_targets(rewards, next_values, dones, gamma) - values


def gae(
    rewards: Tensor, values: Tensor, dones: Tensor, gamma: float, lam: float, last_value: float | Tensor = 0.0
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016; "GAE" of MARFT Alg. 1 line 12) along the last dim.

    With V_{t+1} = values[..., t+1] and V_T = ``last_value`` (0 for an episode that ended; V(h_T) for a cut one,
    a float or a tensor shaped like ``values[..., 0]``):

        delta_t = r_t + gamma (1 - done_t) V_{t+1} - V_t
        A_t     = delta_t + gamma lam (1 - done_t) A_{t+1},     A_T = 0
        returns = A + V                                          (the critic's targets, V-hat of MARFT)

    ``lam = 1`` gives Monte Carlo returns minus values, ``lam = 0`` the TD(0) errors of CoLLM Eqs. 2/4. A done
    inside the row starts a new episode after it, so rows may hold back-to-back episodes; padding after a final done
    gets meaningless values and must be masked out by the caller. Returns ``(advantages, returns)``.
    """
    last = torch.as_tensor(last_value, dtype=values.dtype, device=values.device).expand_as(values[..., 0])
    next_values = torch.cat([values[..., 1:], last.unsqueeze(-1)], dim=-1)
    deltas = td_errors(rewards, values, next_values, dones, gamma)
    not_done = 1.0 - dones.to(values.dtype)
    running = torch.zeros_like(deltas[..., 0])
    advantages = []
    for t in range(deltas.shape[-1] - 1, -1, -1):
        running = deltas[..., t] + gamma * lam * not_done[..., t] * running
        advantages.append(running)
    advantages = torch.stack(advantages[::-1], dim=-1)
    return advantages, advantages + values


def value_loss(values: Tensor, targets: Tensor, old_values: Tensor | None = None, clip: float | None = None,
               huber_delta: float | None = None) -> Tensor:
    """Critic loss mean_t (y_t - V(h_t))^2 of CoLLM Eqs. 3/5 (CoLLM-DC/CC) and MARFT Alg. 1 line 15.

    The papers' plain squared error, no 0.5 factor (that is only a learning-rate scale); the mean over samples is
    Alg. 1's (1/|beta|) sum_b. ``targets`` are constants (detached here: semi-gradient TD, as the papers' updates).
    Given ``old_values`` and ``clip`` (PPO/IPPO value clipping), with V_clip = V_old + clip(V - V_old, -eps, eps):

        loss = mean max((V - y)^2, (V_clip - y)^2)

    ``huber_delta`` replaces the square e^2 by the Huber loss 2 H_delta(e) (H = e^2/2 for |e| <= delta, else
    delta (|e| - delta/2)): the same as the square for small errors, linear beyond delta.
    """
    targets = targets.detach()

    def err(v: Tensor) -> Tensor:
        e = v - targets
        if huber_delta is None:
            return e**2
        return 2 * torch.nn.functional.huber_loss(v, targets, reduction="none", delta=huber_delta)

    loss = err(values)
    if (old_values is None) != (clip is None):
        raise ValueError("value clipping needs both old_values and clip")
    if old_values is not None:
        old_values = old_values.detach()
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        loss = torch.maximum(loss, err(clipped))
    return loss.mean()


def mixed_rewards(rewards: Tensor, own_weight: float = 0.5) -> Tensor:
    """MAPoRL / IPPO reward of MARFT Sec. 5.2 over the last dim (agents): r^i = w s^i + (1 - w) mean_k s^k.

    ``own_weight = 0.5`` is the paper's r^i = s^i / 2 + sum_k s^k / (2n); 1 gives independent rewards, 0 the team mean.
    """
    return own_weight * rewards + (1.0 - own_weight) * rewards.mean(-1, keepdim=True)


def normalize(advantages: Tensor, eps: float = 1e-8) -> Tensor:
    """PPO's advantage normalisation over all elements: (A - mean A) / (std A + eps), unbiased std (zeros if < 2)."""
    centered = advantages - advantages.mean()
    if advantages.numel() < 2:
        return centered
    return centered / (advantages.std() + eps)


# --- MARFT (MARFT, Section 4 and Appendix B) ----------------------------------------------------------------------
#
# MARFT turns a Flex-MG episode into one sequential decision chain: at every step t the agents act in order, so the
# chain of an episode is (t=0, agent 1), ..., (t=0, agent n), (t=1, agent 1), ... (MARFT-A), or the same with every
# agent's response unrolled into its tokens (MARFT-T). The successor of agent i is agent i+1 at the same step; the
# successor of the last agent is the first agent at the next step; the team reward r_t sits on the last element of
# step t. GAE and the Bellman backup then run along this chain with the plain ``gae``.


def chain(step_rewards: Tensor, lengths: Sequence[int], terminated: bool = True) -> tuple[Tensor, Tensor]:
    """One episode's chain rewards and dones: step t spans ``lengths[t]`` consecutive chain elements (n agents for
    MARFT-A; the tokens of all n responses for MARFT-T) and its reward ``step_rewards[t]`` goes on the last one.

    Every other element has reward 0 ("zero reward inside a response" and "to preceding agents"). ``dones`` is 1 on
    the chain's last element when the episode ``terminated`` (no bootstrap past it), else all 0.
    """
    if len(step_rewards) != len(lengths):
        raise ValueError(f"{len(step_rewards)} step rewards for {len(lengths)} steps")
    total = int(sum(lengths))
    rewards = torch.zeros(total, dtype=torch.float32, device=step_rewards.device)
    ends = torch.tensor(list(lengths), device=step_rewards.device).cumsum(0) - 1
    rewards[ends] = step_rewards.to(rewards.dtype)
    dones = torch.zeros(total, dtype=torch.float32, device=step_rewards.device)
    if terminated and total:
        dones[-1] = 1.0
    return rewards, dones


def bellman_targets(rewards: Tensor, values: Tensor, dones: Tensor, gamma: float, last_value: float | Tensor = 0.0) -> Tensor:
    """One-step backup along a chain, y_k = r_k + gamma (1 - done_k) V_{k+1} (V after the chain: ``last_value``).

    On MARFT-T's token chain this is Section 4's token-level Bellman backup: 0 + gamma V(next token) inside a
    response, 0 + gamma V(next agent's first decision) at an agent's last token, R + gamma V(s_{t+1}) at the last
    agent's last token. It equals ``gae(...)`` 's returns with lam = 0.
    """
    last = torch.as_tensor(last_value, dtype=values.dtype, device=values.device).reshape(1)
    return td_targets(rewards, torch.cat([values[1:], last]), dones, gamma)


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
        raise ValueError(f"correct and majority must both be [..., T, A], got {tuple(correct.shape)} and "
                         f"{tuple(majority.shape)}")
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

def debate_rewards(scores: Tensor, correct: Tensor, majority: Tensor, gamma: float, alpha0: float = 0.0,
                   alpha1: float = 0.0, beta0: float = 0.0, beta1: float = 0.0) -> Tensor:
    """``[T, A]`` rewards of every answer: Definition 1 plus the Table 1 and Table 2 incentives (MAPoRL, 3.3)."""
    correct = correct.bool()
    return (influence_rewards(scores.float(), gamma)
            + revision_incentives(correct, majority, alpha0, alpha1)
            + influence_incentives(correct, majority, beta0, beta1))


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


def episode_rewards(scores: Tensor, answers, correct, turns_left: int, gamma: float, alpha0: float = 0.0,
                    alpha1: float = 0.0, beta0: float = 0.0, beta1: float = 0.0) -> Tensor:
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
    return debate_rewards(absorb(scores, turns_left), torch.tensor(correct, dtype=torch.bool), majority, gamma,
                          alpha0, alpha1, beta0, beta1)


def token_rewards(reward: float | Tensor, old_logprobs: Tensor, ref_logprobs: Tensor, kl_coef: float) -> Tensor:
    """Section 3.2's per-token reward of one response: -lambda_KL (log pi_old - log pi_ref) at every token, plus R at the last.

    The paper writes the KL term as KL(pi_ref || pi); the per-token sample estimate of KL(pi || pi_ref) used
    here is the usual choice of PPO fine-tuning (InstructGPT, TRL) and needs no full-vocabulary sums: it is
    the one quantity the rollout's own samples estimate without bias."""
    rewards = -kl_coef * (old_logprobs - ref_logprobs)
    rewards[-1] = rewards[-1] + reward
    return rewards
