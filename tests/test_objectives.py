"""The pure functions of collab.objectives against hand computations."""

import math

import pytest
import torch

from collab.objectives import clipped_surrogate, discounted_returns, group_advantages, kl_k3, num_inference_calls


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
