"""The pure functions of collab.objectives against hand computations."""

import math

import pytest
import torch
from torch.testing import assert_close

from collab.objectives import (
    clipped_surrogate,
    discounted_returns,
    explained_variance,
    gae,
    group_advantages,
    kl_k3,
    mixed_rewards,
    normalize,
    num_inference_calls,
    ratio_stats,
    td_errors,
    td_targets,
    value_loss,
)


@pytest.mark.parametrize("n,k,h,expected", [(2, 2, 2, 12), (2, 4, 2, 40), (3, 2, 3, 42), (2, 1, 3, 6)])
def test_proposition_3_2_counts(n, k, h, expected):
    # (2,2,2): 2*2*(4-1)/1 = 12; (2,4,2): 2*4*(16-1)/3 = 40; (3,2,3): 3*2*(8-1)/1 = 42; K=1: n*H.
    assert num_inference_calls(n, k, h) == expected


def test_discounted_returns_by_hand():
    r = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 1.0]])
    g = discounted_returns(r, 0.5)
    # row 0: G2 = 2, G1 = 0 + .5*2 = 1, G0 = 1 + .5*1 = 1.5; row 1: 1, .5, .25
    assert torch.allclose(g, torch.tensor([[1.5, 1.0, 2.0], [0.25, 0.5, 1.0]]))


RETURNS = torch.tensor([1.0, 2.0, 3.0, 6.0])  # mean 3, max 6


def test_mean_baseline():
    assert torch.allclose(group_advantages(RETURNS, "mean"), torch.tensor([-2.0, -1.0, 0.0, 3.0]))


def test_max_baseline():
    assert torch.allclose(group_advantages(RETURNS, "max"), torch.tensor([-5.0, -4.0, -3.0, 0.0]))


def test_rloo_baseline():
    # leave-one-out means: (2+3+6)/3 = 11/3, (1+3+6)/3 = 10/3, (1+2+6)/3 = 3, (1+2+3)/3 = 2
    expected = torch.tensor([1 - 11 / 3, 2 - 10 / 3, 0.0, 4.0])
    assert torch.allclose(group_advantages(RETURNS, "rloo"), expected)


def test_no_baseline():
    assert torch.allclose(group_advantages(RETURNS, "none"), RETURNS)


def test_std_normalization():
    std = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + 0 + (6 - 3) ** 2) / 3)  # unbiased: 14/3
    adv = group_advantages(RETURNS, "mean", normalize_std=True, eps=0.0)
    assert torch.allclose(adv, torch.tensor([-2.0, -1.0, 0.0, 3.0]) / std)
    assert torch.equal(group_advantages(torch.full((4,), 2.0), "mean", normalize_std=True), torch.zeros(4))


def test_groups_along_last_dim():
    r = torch.tensor([[0.0, 2.0], [5.0, 5.0]])
    assert torch.allclose(group_advantages(r), torch.tensor([[-1.0, 1.0], [0.0, 0.0]]))


def test_unknown_baseline():
    with pytest.raises(ValueError, match="valid: mean, max, rloo, none"):
        group_advantages(RETURNS, "median")


def test_clipped_surrogate_by_hand():
    old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.7]))
    adv = torch.tensor([1.0, -1.0, 2.0, 1.0])
    loss = clipped_surrogate(logp, old, adv, clip=0.2)
    # ratio 1.5, A=1: min(1.5, 1.2) = 1.2 -> -1.2
    # ratio 0.5, A=-1: min(-0.5, -0.8) = -0.8 -> 0.8
    # ratio 1.1, A=2: inside the range -> -2.2
    # ratio 0.7, A=1: min(0.7, 0.8) = 0.7 -> -0.7
    assert torch.allclose(loss, torch.tensor([-1.2, 0.8, -2.2, -0.7]), atol=1e-6)


def test_clipped_surrogate_gradient_vanishes_when_clipped():
    logp = torch.log(torch.tensor([1.5])).requires_grad_()
    clipped_surrogate(logp, torch.zeros(1), torch.ones(1), 0.2).sum().backward()
    assert logp.grad.item() == 0.0
    logp = torch.log(torch.tensor([1.1])).requires_grad_()
    clipped_surrogate(logp, torch.zeros(1), torch.ones(1), 0.2).sum().backward()
    assert logp.grad.item() == pytest.approx(-1.1)  # d(-rho A)/d logp = -rho A


def test_kl_k3():
    lp = torch.log(torch.tensor([0.5, 0.25]))
    ref = torch.log(torch.tensor([0.25, 0.25]))
    # d = log(.25/.5) = -log 2: exp(d) - d - 1 = .5 + log 2 - 1; second token identical -> 0
    assert torch.allclose(kl_k3(lp, ref), torch.tensor([0.5 + math.log(2) - 1, 0.0]))


# --- actor-critic (CoLLM Eqs. 2-5, MARFT IPPO) ---------------------------------------------------------------

F64 = dict(dtype=torch.float64)
# one 3-turn episode: r = (1, 0, 2), V(h_0..h_2) = (.5, 1, 1.5), V(h_3) = 0 (the episode ended), gamma = .9
R = torch.tensor([1.0, 0.0, 2.0], **F64)
V = torch.tensor([0.5, 1.0, 1.5], **F64)
V_NEXT = torch.tensor([1.0, 1.5, 0.0], **F64)


def test_td_targets_and_errors_by_hand():
    # row 0 ends after turn 2:   y = (1 + .9*1, 0 + .9*1.5, 2 + 0) = (1.9, 1.35, 2);  delta = y - V = (1.4, .35, .5)
    # row 1 terminates at turn 1: y_1 = 0 (V(h_2) = 1.5 not bootstrapped), y_2 = 2 (turn 2 is padding)
    rewards, values, next_values = R.expand(2, 3), V.expand(2, 3), V_NEXT.expand(2, 3)
    dones = torch.tensor([[False, False, True], [False, True, True]])
    y = td_targets(rewards, next_values, dones, 0.9)
    assert_close(y, torch.tensor([[1.9, 1.35, 2.0], [1.9, 0.0, 2.0]], **F64))
    delta = td_errors(rewards, values, next_values, dones, 0.9)
    assert_close(delta, torch.tensor([[1.4, 0.35, 0.5], [1.4, -1.0, 0.5]], **F64))
    # 0/1 floats mean the same as bools
    assert_close(td_errors(rewards, values, next_values, dones.double(), 0.9), delta)


def test_terminal_next_value_never_leaks():
    # a placeholder (even NaN) for the value of a terminal history must not reach the target
    y = td_targets(torch.tensor([1.0], **F64), torch.tensor([math.nan], **F64), torch.tensor([1]), 0.9)
    assert_close(y, torch.tensor([1.0], **F64))


def test_gae_by_hand():
    # gamma = .9, lam = .8, gamma*lam = .72; deltas as above: (1.4, .35, .5)
    # A_2 = .5;  A_1 = .35 + .72*.5 = .71;  A_0 = 1.4 + .72*.71 = 1.9112;  returns = A + V = (2.4112, 1.71, 2)
    adv, ret = gae(R, V, torch.zeros(3), 0.9, 0.8)
    assert_close(adv, torch.tensor([1.9112, 0.71, 0.5], **F64))
    assert_close(ret, torch.tensor([2.4112, 1.71, 2.0], **F64))


def test_gae_bootstraps_from_last_value_unless_done():
    # cut at T with V(h_3) = 2: delta_2 = 2 + .9*2 - 1.5 = 2.3;  A_1 = .35 + .72*2.3 = 2.006;  A_0 = 1.4 + .72*2.006
    adv, _ = gae(R, V, torch.zeros(3), 0.9, 0.8, last_value=2.0)
    assert_close(adv, torch.tensor([1.4 + 0.72 * 2.006, 2.006, 2.3], **F64))
    # a done on the last turn ignores last_value
    adv, _ = gae(R, V, torch.tensor([0, 0, 1]), 0.9, 0.8, last_value=2.0)
    assert_close(adv, torch.tensor([1.9112, 0.71, 0.5], **F64))


def test_gae_termination_mid_episode():
    # done at turn 1: delta_1 = 0 + 0 - 1 = -1 and A_1 = -1 (no A_2 carried across); turn 2 is a new episode: A_2 = .5
    # A_0 = 1.4 + .72*(-1) = .68;  returns = (1.18, 0, 2)
    adv, ret = gae(R, V, torch.tensor([False, True, False]), 0.9, 0.8)
    assert_close(adv, torch.tensor([0.68, -1.0, 0.5], **F64))
    assert_close(ret, torch.tensor([1.18, 0.0, 2.0], **F64))


def test_gae_batch_matches_rows():
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(2, 3, 5, generator=g, **F64), torch.randn(2, 3, 5, generator=g, **F64)
    d, last = torch.rand(2, 3, 5, generator=g) < 0.3, torch.randn(2, 3, generator=g, **F64)
    adv, ret = gae(r, v, d, 0.9, 0.8, last_value=last)
    for i in range(2):
        for j in range(3):
            a, b = gae(r[i, j], v[i, j], d[i, j], 0.9, 0.8, last_value=last[i, j])
            assert_close(adv[i, j], a)
            assert_close(ret[i, j], b)


def test_gae_lambda_one_is_monte_carlo_minus_values():
    g = torch.Generator().manual_seed(1)
    r, v = torch.randn(4, 6, generator=g, **F64), torch.randn(4, 6, generator=g, **F64)
    adv, ret = gae(r, v, torch.zeros(4, 6), 0.9, 1.0)
    assert_close(adv, discounted_returns(r, 0.9) - v)
    assert_close(ret, discounted_returns(r, 0.9))
    # with a done after turn 2 the Monte Carlo returns restart: two episodes back to back
    dones = torch.zeros(4, 6, dtype=torch.bool)
    dones[:, 2] = True
    _, ret = gae(r, v, dones, 0.9, 1.0)
    assert_close(ret, torch.cat([discounted_returns(r[:, :3], 0.9), discounted_returns(r[:, 3:], 0.9)], -1))


def test_gae_lambda_zero_is_td_errors():
    g = torch.Generator().manual_seed(2)
    r, v, last = torch.randn(4, 6, generator=g, **F64), torch.randn(4, 6, generator=g, **F64), torch.randn(4, **F64)
    d = torch.rand(4, 6, generator=g) < 0.3
    adv, _ = gae(r, v, d, 0.9, 0.0, last_value=last)
    next_values = torch.cat([v[:, 1:], last[:, None]], -1)
    assert_close(adv, td_errors(r, v, next_values, d, 0.9))


# value clipping, eps = .5, three cases:
#   a: V 1, V_old 1.2, y 1.5  inside the range            -> (1 - 1.5)^2 = .25
#   b: V 2, V_old 0,   y 1    clipped V .5, error .25 < 1  -> 1     (clipping does not bind)
#   c: V 2, V_old 0,   y 3    clipped V .5, error 6.25 > 1 -> 6.25  (clipping binds)
VL_VALUES, VL_OLD, VL_TARGETS = [1.0, 2.0, 2.0], [1.2, 0.0, 0.0], [1.5, 1.0, 3.0]


def test_value_loss_plain_by_hand():
    values = torch.tensor(VL_VALUES, **F64, requires_grad=True)
    targets = torch.tensor(VL_TARGETS, **F64, requires_grad=True)
    loss = value_loss(values, targets)
    assert_close(loss, torch.tensor((0.25 + 1.0 + 1.0) / 3, **F64))  # no 0.5, as CoLLM Eqs. 3/5
    loss.backward()
    assert_close(values.grad, torch.tensor([-1 / 3, 2 / 3, -2 / 3], **F64))  # 2 (V - y) / 3
    assert targets.grad is None  # semi-gradient: no gradient through the targets


def test_value_loss_clipped_by_hand():
    values = torch.tensor(VL_VALUES, **F64, requires_grad=True)
    targets = torch.tensor(VL_TARGETS, **F64, requires_grad=True)
    old = torch.tensor(VL_OLD, **F64, requires_grad=True)
    loss = value_loss(values, targets, old_values=old, clip=0.5)
    assert_close(loss, torch.tensor((0.25 + 1.0 + 6.25) / 3, **F64))
    loss.backward()
    # a, b: unclipped branch, 2 (V - y) / 3; c: clipped branch is flat in V -> 0
    assert_close(values.grad, torch.tensor([-1 / 3, 2 / 3, 0.0], **F64))
    assert targets.grad is None and old.grad is None


def test_value_loss_needs_both_clip_arguments():
    with pytest.raises(ValueError, match="both old_values and clip"):
        value_loss(torch.zeros(2), torch.zeros(2), old_values=torch.zeros(2))


def test_clipped_actor_objective_with_negative_td_error():
    # delta = 0 + .9*1 - 1.4 = -.5 (Eq. 4's weight); ratio 1.5 above 1 + .2: min(-.75, -.6) = -.75, unclipped, the
    # gradient flows (d loss / d log pi = -rho delta = .75); ratio .5 below .8: min(-.25, -.4) = -.4, clipped,
    # no gradient
    delta = td_errors(torch.zeros(2, **F64), torch.full((2,), 1.4, **F64), torch.ones(2, **F64), torch.zeros(2), 0.9)
    assert_close(delta, torch.tensor([-0.5, -0.5], **F64))
    logp = torch.log(torch.tensor([1.5, 0.5], **F64)).requires_grad_()
    loss = clipped_surrogate(logp, torch.zeros(2, **F64), delta, clip=0.2)
    assert_close(loss, torch.tensor([0.75, 0.4], **F64))
    loss.sum().backward()
    assert_close(logp.grad, torch.tensor([0.75, 0.0], **F64))


def test_mixed_rewards_by_hand():
    # MARFT 5.2: r^i = s^i / 2 + sum_k s^k / (2n); scores (1, 0, .5), team mean .5 -> (.75, .25, .5)
    s = torch.tensor([[1.0, 0.0, 0.5], [0.0, 0.0, 0.0]], **F64)
    assert_close(mixed_rewards(s), torch.tensor([[0.75, 0.25, 0.5], [0.0, 0.0, 0.0]], **F64))
    assert_close(mixed_rewards(s, own_weight=1.0), s)
    assert_close(mixed_rewards(s, own_weight=0.0), torch.tensor([[0.5] * 3, [0.0] * 3], **F64))


def test_normalize():
    a = torch.tensor([[1.0, 2.0], [3.0, 6.0]], **F64)  # mean 3, unbiased std sqrt(14/3)
    assert_close(normalize(a, eps=0.0), (a - 3.0) / math.sqrt(14 / 3))
    assert_close(normalize(torch.tensor([4.0], **F64)), torch.zeros(1, **F64))


def test_ratio_stats_by_hand():
    # log-ratios 0, log 1.5, log 0.5 and log 1.1: ratios 1, 1.5, 0.5, 1.1; with clip 0.2 two of four are outside
    old = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    logprobs = old + torch.log(torch.tensor([1.0, 1.5, 0.5, 1.1]))
    stats = ratio_stats(logprobs, old, clip=0.2)
    assert stats["train/ratio"] == pytest.approx((1.0 + 1.5 + 0.5 + 1.1) / 4, rel=1e-6)
    assert stats["train/clip_frac"] == 0.5
    k3 = [r - 1 - math.log(r) for r in (1.0, 1.5, 0.5, 1.1)]  # 0, 0.0945, 0.1931, 0.0047
    assert stats["train/approx_kl"] == pytest.approx(sum(k3) / 4, rel=1e-5)
    same = ratio_stats(old, old, clip=0.2)
    assert same == {"train/ratio": 1.0, "train/clip_frac": 0.0, "train/approx_kl": 0.0}


def test_explained_variance_by_hand():
    returns = torch.tensor([1.0, 2.0, 3.0, 4.0])  # variance 1.25
    assert explained_variance(returns, returns) == 1.0
    assert explained_variance(torch.full((4,), 2.5), returns) == pytest.approx(
        0.0, abs=1e-7
    )  # the mean: nothing explained
    # residuals 0.5, -0.5, 0.5, -0.5: variance 0.25, so 1 - 0.25 / 1.25 = 0.8
    assert explained_variance(returns - torch.tensor([0.5, -0.5, 0.5, -0.5]), returns) == pytest.approx(0.8, rel=1e-6)
    assert explained_variance(-returns, returns) == pytest.approx(1 - 5.0 / 1.25, rel=1e-6)  # worse than a constant
    assert explained_variance(torch.tensor([0.0, 1.0]), torch.tensor([3.0, 3.0])) == 0.0  # constant returns
