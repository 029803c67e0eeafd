"""MAPoRL's reward math (MAPoRL): Definition 1, Tables 1-2 and the Section 4.1 majority vote, against hand
computations."""

import math
import warnings

import pytest
import torch

from collab.evaluation.metrics import MajorityVoteAccuracy
from collab.objectives import (
    influence_incentives,
    influence_rewards,
    majority_of_others,
    majority_of_others_table,
    majority_vote,
    revision_incentives,
)

NAN = float("nan")

# -- Definition 1 --------------------------------------------------------------------------------------
#
# scores (T = 3 turns x A = 2 agents):      turn means m_t = mean_j s[t, j]:
#   t=1: [1.0, 0.0]                          m1 = 0.5
#   t=2: [0.5, 1.0]                          m2 = 0.75
#   t=3: [0.0, 0.6]                          m3 = 0.3
#
# R[t, a] = (s[t, a] + sum_{t'>t} g^(t'-t) m_t') / sum_{t'=t..3} g^(t'-t)
SCORES = torch.tensor([[1.0, 0.0], [0.5, 1.0], [0.0, 0.6]])


def test_influence_rewards_gamma_one():
    # g = 1:  t=1: (s + m2 + m3) / 3 = (s + 1.05) / 3 -> agent1 2.05/3, agent2 1.05/3 = 0.35
    #         t=2: (s + m3) / 2      = (s + 0.3) / 2  -> agent1 0.8/2 = 0.4, agent2 1.3/2 = 0.65
    #         t=3: s                                  -> 0.0, 0.6
    expected = torch.tensor([[2.05 / 3, 0.35], [0.4, 0.65], [0.0, 0.6]])
    torch.testing.assert_close(influence_rewards(SCORES, 1.0), expected)


def test_influence_rewards_gamma_half():
    # g = 0.5: t=1: (s + 0.5 m2 + 0.25 m3) / (1 + 0.5 + 0.25) = (s + 0.375 + 0.075) / 1.75 = (s + 0.45) / 1.75
    #               -> agent1 1.45/1.75, agent2 0.45/1.75
    #          t=2: (s + 0.5 m3) / 1.5 = (s + 0.15) / 1.5 -> agent1 0.65/1.5, agent2 1.15/1.5
    #          t=3: s -> 0.0, 0.6
    expected = torch.tensor([[1.45 / 1.75, 0.45 / 1.75], [0.65 / 1.5, 1.15 / 1.5], [0.0, 0.6]])
    torch.testing.assert_close(influence_rewards(SCORES, 0.5), expected)


def test_influence_rewards_gamma_zero_and_batches():
    # g = 0: only the own score remains (0^0 = 1), R = s.
    torch.testing.assert_close(influence_rewards(SCORES, 0.0), SCORES)
    batch = torch.stack([SCORES, SCORES.flip(-1)])  # leading dims are debates
    out = influence_rewards(batch, 0.5)
    torch.testing.assert_close(out[0], influence_rewards(SCORES, 0.5))
    torch.testing.assert_close(out[1], influence_rewards(SCORES.flip(-1), 0.5))
    with pytest.raises(ValueError):
        influence_rewards(torch.tensor([1.0, 0.0]), 1.0)


# -- majority vote (Section 4.1) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "answers,correct,expected",
    [
        (["5", "3"], [True, False], 0.5),  # two agents, one right: a tie, 1 of the 2 tied answers is right
        (["1", "2", "3"], [True, False, False], 1 / 3),  # 1-1-1 with one right
        (["5", "5", "3"], [True, True, False], 1.0),  # clear majority, right
        (["3", "3", "5"], [False, False, True], 0.0),  # clear majority, wrong
        (["5", "5", "3", "3"], [True, True, False, False], 0.5),  # 2-2 tie
        ([None, "3", "5"], [False, False, True], 0.5),  # None casts no vote: 1-1 tie between 3 and 5
        ([None, None, "5"], [False, False, True], 1.0),  # the only vote wins
        ([None, None], [False, False], 0.0),  # no votes
        (["4", "4", "4"], [True, True, True], 1.0),
    ],
)
def test_majority_vote(answers, correct, expected):
    assert majority_vote(answers, correct) == pytest.approx(expected)


def test_majority_vote_length_mismatch():
    with pytest.raises(ValueError):
        majority_vote(["5"], [True, False])


def test_majority_of_others():
    # Three agents, gold 5. For agent a, only the other two vote.
    answers, correct = ["5", "5", "3"], [True, True, False]
    assert majority_of_others(answers, correct, 2) == 1.0  # others 5, 5: R
    assert majority_of_others(answers, correct, 0) is None  # others 5, 3: a right/wrong tie, undetermined
    answers, correct = ["5", "3", "4"], [True, False, False]
    assert majority_of_others(answers, correct, 0) == 0.0  # others 3, 4: tied but both wrong, W
    assert majority_of_others(["5", None], [True, False], 0) is None  # the other cast no vote
    assert majority_of_others(["5", None], [True, False], 1) == 1.0
    assert majority_of_others(["5"], [True], 0) is None  # A = 1: no others


def test_majority_vote_accuracy_metric():
    # rows: 0.5 (1-1 tie), 1/3 (1-1-1), 1.0 (2-1 right), 0.0 (no votes); mean = (0.5 + 1/3 + 1 + 0) / 4 = 11/24
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics warns about compute() before update()
        assert MajorityVoteAccuracy().compute().item() == 0.0
    m = MajorityVoteAccuracy()
    m.update([["5", "3"], ["1", "2", "3"]], [[True, False], [True, False, False]])
    m.update([["5", "5", "3"], [None, None]], [[True, True, False], [False, False]])
    assert m.total.dtype == torch.float64 and int(m.count) == 4
    # DDP: the states are sums, so merging another worker's states gives the pooled mean
    other = MajorityVoteAccuracy()
    other.update([["7"]], [[True]])  # 1.0
    pooled = MajorityVoteAccuracy()
    pooled.merge_state(m)
    pooled.merge_state(other)
    assert m.compute().item() == pytest.approx(11 / 24)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # merged states, no update() of its own
        assert pooled.compute().item() == pytest.approx((11 / 24 * 4 + 1.0) / 5)


# -- Table 1: revision incentives --------------------------------------------------------------------
A0, A1, B0, B1 = 0.3, 0.7, 0.2, 0.9


@pytest.mark.parametrize(
    "before,after,majority,expected",
    [
        (True, False, 1.0, -A1),  # R -> W, majority R: -alpha1
        (True, False, 0.0, -A0),  # R -> W, majority W: -alpha0
        (False, True, 0.0, A0),  # W -> R, majority W: +alpha0
        (False, True, 1.0, A1),  # W -> R, majority R: +alpha1
        (True, True, 1.0, 0.0),  # unchanged answers: 0
        (True, True, 0.0, 0.0),
        (False, False, 1.0, 0.0),
        (False, False, 0.0, 0.0),
        (True, False, NAN, 0.0),  # undetermined majority: 0
        (False, True, NAN, 0.0),
    ],
)
def test_revision_incentive_rows(before, after, majority, expected):
    correct = torch.tensor([[before], [after]])  # T = 2, A = 1
    maj = torch.tensor([[majority], [NAN]])  # the majority at t+1 does not enter Table 1
    out = revision_incentives(correct, maj, A0, A1)
    assert out[0, 0].item() == 0.0  # applied to the answer at t+1: row 0 is 0
    assert out[1, 0].item() == pytest.approx(expected)


@pytest.mark.parametrize(
    "maj_before,maj_after,own,expected",
    [
        (1.0, 0.0, True, -B1),  # majority R -> W, agent R: -beta1
        (1.0, 0.0, False, -B0),  # majority R -> W, agent W: -beta0
        (0.0, 1.0, False, B0),  # majority W -> R, agent W: +beta0
        (0.0, 1.0, True, B1),  # majority W -> R, agent R: +beta1
        (1.0, 1.0, True, 0.0),  # majority unchanged: 0
        (0.0, 0.0, False, 0.0),
        (NAN, 1.0, True, 0.0),  # undetermined at t: 0
        (0.0, NAN, True, 0.0),  # undetermined at t+1: 0
    ],
)
def test_influence_incentive_rows(maj_before, maj_after, own, expected):
    correct = torch.tensor([[own], [not own]])  # the agent's answer at t+1 does not enter Table 2
    maj = torch.tensor([[maj_before], [maj_after]])
    out = influence_incentives(correct, maj, B0, B1)
    assert out[0, 0].item() == pytest.approx(expected)  # applied to the answer at t
    assert out[1, 0].item() == 0.0  # the last row is 0


def test_incentives_on_a_debate():
    # Two agents, three turns, gold "5":
    #   t1: agent1 "5" (R), agent2 "3" (W)
    #   t2: agent1 "5" (R), agent2 "5" (R)     agent2 was persuaded
    #   t3: agent1 "4" (W), agent2 "5" (R)     agent1 flipped to a wrong answer
    answers = [["5", "3"], ["5", "5"], ["4", "5"]]
    correct = [[True, False], [True, True], [False, True]]
    # With two agents the "majority of others" is the other agent's answer:
    #   t1: agent1 sees W (0), agent2 sees R (1);  t2: 1, 1;  t3: agent1 sees R (1), agent2 sees W (0)
    maj = majority_of_others_table(answers, correct)
    torch.testing.assert_close(maj, torch.tensor([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0]]))
    c = torch.tensor(correct)
    # Table 1, row t+1: t1->t2 agent2 W->R with majority(t1) R: +alpha1; t2->t3 agent1 R->W with majority(t2) R: -alpha1
    torch.testing.assert_close(revision_incentives(c, maj, A0, A1), torch.tensor([[0.0, 0.0], [0.0, A1], [-A1, 0.0]]))
    # Table 2, row t: t1->t2 agent1's others' majority W->R, agent1 R at t1: +beta1;
    #                 t2->t3 agent2's others' majority R->W, agent2 R at t2: -beta1
    torch.testing.assert_close(influence_incentives(c, maj, B0, B1), torch.tensor([[B1, 0.0], [0.0, -B1], [0.0, 0.0]]))


def test_majority_table_marks_undetermined_as_nan():
    # Three agents; t1: "5" R, "3" W, "3" W. agent1's others vote 3, 3 (W); agent2's and agent3's others tie 5-3.
    maj = majority_of_others_table([["5", "3", "3"]], [[True, False, False]])
    assert maj[0, 0].item() == 0.0 and math.isnan(maj[0, 1].item()) and math.isnan(maj[0, 2].item())


def test_incentive_shapes_must_match():
    with pytest.raises(ValueError):
        revision_incentives(torch.ones(2, 2, dtype=torch.bool), torch.ones(2, 3), A0, A1)
    with pytest.raises(ValueError):
        influence_incentives(torch.ones(2, dtype=torch.bool), torch.ones(2), B0, B1)
