"""Preference losses: MADPO, a multi-agent DPO whose preferences come from the team's joint reward.

DPO (Rafailov et al. 2023, Eq. 7) fits a policy to preference pairs (y_w preferred to y_l given x) with

    L = -log sigmoid(beta log pi(y_w | x) / pi_ref(y_w | x) - beta log pi(y_l | x) / pi_ref(y_l | x)).

The MAGRPO authors' MADPO (CoMLRL, ``comlrl/trainers/preference/madpo.py``) applies it to a team: a pair is two
joint actions drawn at the same history, the one with the larger joint reward preferred. The agents act
independently given their prompts, so the joint policy's log-prob is the sum of the agents' sequence log-probs,
and the joint log-ratio inside the one sigmoid is the sum of every agent's; each agent's gradient flows through
its own log-probs only (its parameters are its own). The library's loss has no reference model (pi_ref uniform:
it cancels); :func:`joint_dpo_loss` takes the reference's log-probs optionally, for Eq. 7 itself.

MARLHF (CoMLRL, ``comlrl/trainers/preference/marlhf.py``) fits a joint reward model to the same pairs with the
Bradley-Terry likelihood instead (:func:`bradley_terry_loss`), then trains the team on its scores.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

PAIR_SELECTIONS = ("reward_gap", "all", "random")


def preference_pairs(
    rewards: Sequence[float], selection: str = "reward_gap", limit: int | None = None, generator=None
) -> list[tuple[int, int]]:
    """The (winner, loser) pairs of K joint actions with joint rewards ``rewards``, as CoMLRL's MADPO forms them.

    Every ordered pair (i, j) with r_i - r_j > 0 is a candidate (a tie is no preference and gives none), in the
    order i, then j. ``reward_gap`` sorts them by the gap, largest first (equal gaps keep that order: a stable
    sort); ``all`` keeps the order; ``random`` shuffles them (``generator``: a torch.Generator, None: torch's own).
    The first ``limit`` are kept (None: all of them).
    """
    if selection not in PAIR_SELECTIONS:
        raise ValueError(f"unknown pair selection {selection!r}; valid: {', '.join(PAIR_SELECTIONS)}")
    values = [float(r) for r in rewards]
    candidates = [
        (values[i] - values[j], i, j)
        for i in range(len(values))
        for j in range(len(values))
        if i != j and values[i] - values[j] > 0
    ]
    if selection == "reward_gap":
        candidates.sort(key=lambda c: c[0], reverse=True)
    elif selection == "random":
        order = torch.randperm(len(candidates), generator=generator).tolist()
        candidates = [candidates[k] for k in order]
    if limit is not None:
        candidates = candidates[:limit]
    return [(i, j) for _, i, j in candidates]


def joint_log_ratios(
    winner_logprobs: Tensor,
    loser_logprobs: Tensor,
    ref_winner_logprobs: Tensor | None = None,
    ref_loser_logprobs: Tensor | None = None,
) -> Tensor:
    """Each pair's joint log-ratio margin, ``[P]``, from each agent's sequence log-probs, ``[P, n]`` each:
    sum_i (log pi_i(y_w^i) - log pi_i(y_l^i)), less the same under the reference when one is given (DPO Eq. 7's
    argument over beta, for the joint policy prod_i pi_i)."""
    margins = winner_logprobs - loser_logprobs
    if ref_winner_logprobs is not None and ref_loser_logprobs is not None:
        margins = margins - (ref_winner_logprobs - ref_loser_logprobs)
    return margins.sum(-1)


def joint_dpo_loss(
    winner_logprobs: Tensor,
    loser_logprobs: Tensor,
    beta: float,
    ref_winner_logprobs: Tensor | None = None,
    ref_loser_logprobs: Tensor | None = None,
) -> Tensor:
    """DPO's loss (Rafailov et al. 2023, Eq. 7) of each pair of joint actions, ``[P]``: -log sigmoid(beta m) with m
    the pair's :func:`joint_log_ratios` (the sum over the agents inside one sigmoid, as CoMLRL's MADPO). Agent i's
    gradient is -beta sigmoid(-beta m) times the gradient of its own log-ratio: the one CoMLRL's per-agent loss,
    with the other agents' log-ratios held constant, gives."""
    margins = joint_log_ratios(winner_logprobs, loser_logprobs, ref_winner_logprobs, ref_loser_logprobs)
    return -F.logsigmoid(beta * margins)


def bradley_terry_loss(chosen: Tensor, rejected: Tensor) -> Tensor:
    """The Bradley-Terry negative log-likelihood of each pair, ``[P]``: -log sigmoid(r(y_w) - r(y_l)), with
    ``chosen`` and ``rejected`` the reward model's scores of the preferred and of the other joint action
    (Ouyang et al. 2022, Eq. 1; CoMLRL's MARLHF reward model, whose loss is their mean over a batch of pairs)."""
    return -F.logsigmoid(chosen - rejected)
