"""PassAtK / AccuracyAtK against hand-computed values."""

from math import comb

import pytest
import torch

from collab.evaluation.metrics import AccuracyAtK, PassAtK, pass_at_k


def exact(n, c, k):
    return 1.0 - comb(n - c, k) / comb(n, k)


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (5, 0, 1, 0.0),
        (5, 5, 1, 1.0),
        (10, 10, 5, 1.0),
        (5, 2, 1, 0.4),
        (10, 3, 5, 1 - 21 / 252),
        (10, 0, 10, 0.0),
        (10, 1, 10, 1.0),
        (7, 4, 4, 1.0),  # n - c = 3 < k
        (200, 13, 10, exact(200, 13, 10)),
        (3, 1, 3, 1.0),
    ],
)
def test_pass_at_k_single_problem(n, c, k, expected):
    assert expected == pytest.approx(exact(n, c, k))
    m = PassAtK(k)
    m.update(torch.tensor([n]), torch.tensor([c]))
    assert m.compute().item() == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_averages_problems_and_sums_across_updates():
    m = PassAtK(3)
    m.update(torch.tensor([10, 5]), torch.tensor([3, 0]))
    m.update(torch.tensor([4]), torch.tensor([2]))
    want = (exact(10, 3, 3) + 0.0 + exact(4, 2, 3)) / 3
    assert m.compute().item() == pytest.approx(want, abs=1e-12)
    assert m.count.item() == 3
    direct = pass_at_k(torch.tensor([10, 5, 4]), torch.tensor([3, 0, 2]), 3)
    assert direct.tolist() == pytest.approx([exact(10, 3, 3), 0.0, exact(4, 2, 3)])


def test_pass_at_k_reset():
    m = PassAtK(1)
    m.update(torch.tensor([5]), torch.tensor([5]))
    assert m.compute().item() == 1.0
    m.reset()
    m.update(torch.tensor([5]), torch.tensor([2]))
    assert m.compute().item() == pytest.approx(0.4)


def test_pass_at_k_rejects_too_few_samples_and_bad_counts():
    m = PassAtK(5)
    with pytest.raises(ValueError):
        m.update(torch.tensor([10, 4]), torch.tensor([1, 1]))
    with pytest.raises(ValueError):
        m.update(torch.tensor([10]), torch.tensor([11]))
    with pytest.raises(ValueError):
        PassAtK(0)


def test_accuracy_at_k_best_of_first_k():
    m = AccuracyAtK(2)
    m.update([torch.tensor([0.2, 0.5, 1.0]), torch.tensor([0.0, 0.0, 0.9])])
    # best of the first two samples: 0.5 and 0.0 (the later 1.0 and 0.9 are not among the first k)
    assert m.compute().item() == pytest.approx(0.25)
    m.update([torch.tensor([0.75])])  # fewer than k samples: all of them
    assert m.compute().item() == pytest.approx((0.5 + 0.0 + 0.75) / 3)
    m.reset()
    m.update([torch.tensor([1.0, 0.0])])
    assert m.compute().item() == 1.0
    k1 = AccuracyAtK(1)
    k1.update([torch.tensor([0.3, 1.0]), torch.tensor([0.6, 0.0])])
    assert k1.compute().item() == pytest.approx(0.45)


@pytest.mark.parametrize("metric", [PassAtK(2), AccuracyAtK(2)])
def test_states_sum_across_processes(metric):
    assert set(metric._reductions) == {"total", "count"}
    for name, fx in metric._reductions.items():
        assert fx is not None and fx.__name__ in ("dim_zero_sum", "sum"), (name, fx)
