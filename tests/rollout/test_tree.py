"""MAGRPO's rollout tree: Proposition 3.2 counts, returns through the tree, advantages, termination."""

import pytest
import torch

from collab.algos.magrpo import set_group_advantages
from collab.objectives import num_inference_calls
from collab.policy.models import BaseConfig
from collab.policy.team import AgentSpec, AgentTeam
from collab.rollout.tree import TreeNode, backup_returns, expand_tree, joint_indices, sample_values, tree_batch
from tests.support import CountingEnv


def team_for(env):
    return AgentTeam([AgentSpec(choices=list(r.choices)) for r in env.roles], BaseConfig(name="tiny"))


@pytest.mark.parametrize("n,k,h", [(2, 2, 2), (2, 4, 2), (3, 2, 3)])
def test_generations_equal_proposition_3_2(n, k, h):
    torch.manual_seed(0)
    env = CountingEnv(n, h)
    roots = expand_tree(team_for(env), env, env.tasks("train"), k)
    generations = sum(len(s) for root in roots for node in root.nodes() for s in node.samples)
    assert generations == num_inference_calls(n, k, h)
    leaves = sum(1 for root in roots for node in root.nodes() for c in node.children if c is None)
    assert leaves == k**h  # aligned mode: K^H rollouts


def test_early_termination_prunes_branches():
    torch.manual_seed(0)
    env = CountingEnv(2, 3)
    # threshold 0: every child terminates at once -> only the root is expanded
    roots = expand_tree(team_for(env), env, env.tasks("train"), 2, termination_threshold=0.0)
    assert sum(len(s) for node in roots[0].nodes() for s in node.samples) == 2 * 2


def hand_tree():
    """Root with two aligned children: c0 (reward 1) expands to rewards 2 and 4; c1 (reward 0) ends."""
    leaf = TreeNode(
        state=None, depth=1, joints=[(0, 0), (1, 1)], rewards=[(2.0, 2.0), (4.0, 4.0)], children=[None, None]
    )
    root = TreeNode(
        state=None, depth=0, joints=[(0, 0), (1, 1)], rewards=[(1.0, 1.0), (0.0, 0.0)], children=[leaf, None]
    )
    return root, leaf


def test_returns_through_the_tree_by_hand():
    root, leaf = hand_tree()
    backup_returns(root, gamma=0.5)
    # leaf children: 2 and 4; c0 = 1 + 0.5 * mean(2, 4) = 2.5; c1 = 0
    assert torch.allclose(leaf.returns[:, 0], torch.tensor([2.0, 4.0], dtype=torch.float64))
    assert torch.allclose(root.returns[:, 1], torch.tensor([2.5, 0.0], dtype=torch.float64))
    # group advantages (mean baseline) at the root: 2.5 - 1.25, 0 - 1.25
    from collab.objectives import group_advantages

    adv = group_advantages(sample_values(root, 0, 2))
    assert torch.allclose(adv, torch.tensor([1.25, -1.25], dtype=torch.float64))


def test_cross_mode_values_average_over_partners():
    node = TreeNode(
        state=None,
        depth=0,
        joints=joint_indices(2, 2, "cross"),
        rewards=[(10.0, 10.0), (7.0, 7.0), (7.0, 7.0), (0.0, 0.0)],
        children=[None] * 4,
    )
    assert node.joints == [(0, 0), (0, 1), (1, 0), (1, 1)]
    backup_returns(node, 1.0)
    # agent 0's sample 0 meets partner samples 0 and 1: (10 + 7)/2; its sample 1: (7 + 0)/2
    assert torch.allclose(sample_values(node, 0, 2), torch.tensor([8.5, 3.5], dtype=torch.float64))
    assert torch.allclose(sample_values(node, 1, 2), torch.tensor([8.5, 3.5], dtype=torch.float64))


def test_tree_batch_samples_and_groups():
    torch.manual_seed(0)
    env = CountingEnv(2, 2)
    batch = tree_batch(team_for(env), env, env.tasks("train"), k=2, gamma=1.0)
    set_group_advantages(batch.items, "mean")
    assert len(batch.items) == num_inference_calls(2, 2, 2)
    # within every (node, agent) group the mean-baseline advantages sum to zero
    groups = {}
    for s in batch.items:
        groups.setdefault(s.group, []).append(s.advantages)
    assert all(abs(sum(v)) < 1e-9 for v in groups.values())
    assert {s.turn for s in batch.items} == {0, 1}
    assert batch.stats["rollout/samples"] == len(batch.items)
