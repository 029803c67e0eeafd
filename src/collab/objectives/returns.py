"""Returns and advantages: discounted and absorbing returns, group-relative advantages (MAGRPO, CoLLM), TD
targets and GAE (CoLLM, MARFT), and MARFT's sequential decision chain."""

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
        factor = (1.0 - torch.pow(torch.as_tensor(gamma, dtype=r.dtype, device=r.device), (m + 1).to(r.dtype))) / (
            1.0 - gamma
        )
    return r * factor


def group_advantages(returns: Tensor, baseline: str = "mean", normalize_std: bool = False, eps: float = 1e-6) -> Tensor:
    """Group-relative advantages of K sibling samples (last dimension), MAGRPO Eq. 1 / CoLLM Eq. 1.

    ``mean``  A_k = G_k - mean_j G_j                      (MAGRPO; GRPO, Shao et al. 2024)
    ``max``   A_k = G_k - max_j G_j                       (only the best sample is not pushed down)
    ``rloo``  A_k = G_k - mean_{j != k} G_j               (leave-one-out, Kool et al. 2019; RLOO, Ahmadian et al.
                                                           2024): = (G_k - mean_j G_j) K / (K - 1), unbiased
    ``none``  A_k = G_k                                   (REINFORCE without a baseline, Williams 1992)

    With the MAGRPO tree these are the trainers of the MAGRPO authors' library (CoMLRL's ``advantage_mode``):
    ``mean`` MAGRPO, ``rloo`` MARLOO, ``max`` MAReMax, ``none`` MAREINFORCE (its ``raw``). ``max`` is named after
    ReMax (Li et al. 2023) there, but ReMax's baseline is the reward of the greedy response, which costs one
    greedy decode per prompt; the group max uses no extra sample and makes every advantage <= 0.

    With ``normalize_std`` the advantages are divided by the group's standard deviation (unbiased,
    as TRL's GRPO) plus ``eps``; a group of identical returns then has zero advantages. Not with ``none``:
    uncentred returns over a near-zero spread would be G / eps.
    """
    if normalize_std and baseline == "none":
        raise ValueError("normalize_std needs a baseline: with none a group of equal returns G gets G / eps")
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


def low_mean_groups(means: Sequence[float], ratio: float) -> list[int]:
    """AT-GRPO's group filter (PettingLLMs' ``filter_method: mean``): the groups to drop, the ``int(len(means) *
    ratio)`` with the lowest mean reward (ties: the earlier group first, as a stable sort), by their index."""
    order = sorted(range(len(means)), key=lambda g: means[g])
    return sorted(order[: int(len(means) * ratio)])


def best_joint(rewards: Sequence[Sequence[float]]) -> int:
    """The candidate joint action AT-GRPO's tree continues from: the largest mean of the agents' rewards, the first
    of equals (PettingLLMs' ``np.argmax`` over a turn's candidates)."""
    team = [sum(r) / len(r) for r in rewards]
    return max(range(len(team)), key=lambda c: (team[c], -c))


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


def bellman_targets(
    rewards: Tensor, values: Tensor, dones: Tensor, gamma: float, last_value: float | Tensor = 0.0
) -> Tensor:
    """One-step backup along a chain, y_k = r_k + gamma (1 - done_k) V_{k+1} (V after the chain: ``last_value``).

    On MARFT-T's token chain this is Section 4's token-level Bellman backup: 0 + gamma V(next token) inside a
    response, 0 + gamma V(next agent's first decision) at an agent's last token, R + gamma V(s_{t+1}) at the last
    agent's last token. It equals ``gae(...)`` 's returns with lam = 0.
    """
    last = torch.as_tensor(last_value, dtype=values.dtype, device=values.device).reshape(1)
    return td_targets(rewards, torch.cat([values[1:], last]), dones, gamma)
