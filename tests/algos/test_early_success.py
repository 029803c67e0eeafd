"""An episode that succeeds earlier is never worth less than one that succeeds later.

An early end (the environment terminates, or MAGRPO's early termination) is an absorbing state that
repeats its reward until the horizon (``objectives.absorbing_reward``); every algorithm's returns go
through it: the MAGRPO tree, CoLLM's TD targets and IPPO's GAE (``Transition.returned_rewards``),
MARFT's chain (the same, on the last agent's team reward) and MAPoRL's Definition 1 (tests/algos/test_maporl*).
"""

import pytest
import torch

from collab.algos.magrpo import set_group_advantages
from collab.objectives import absorbing_reward, chain, discounted_returns, gae
from collab.rollout.episodes import play
from collab.rollout.experience import transitions
from collab.rollout.tree import (
    TreeNode,
    backup_returns,
    early_ends,
    expand_tree,
    joint_indices,
    sample_values,
    tree_batch,
)
from tests.support import EarlySolveEnv, ScriptedTeam


def test_absorbing_reward_by_hand():
    assert float(absorbing_reward(4.0, 0, 1.0)) == 4.0
    assert float(absorbing_reward(4.0, 1, 1.0)) == 8.0
    assert float(absorbing_reward(4.0, 2, 1.0)) == 12.0
    # 4 (1 + 0.9 + 0.81) = 10.84
    assert float(absorbing_reward(4.0, 2, 0.9)) == pytest.approx(10.84, rel=1e-12)
    # gamma 0: only the turn itself counts
    assert float(absorbing_reward(4.0, 3, 0.0)) == 4.0
    t = absorbing_reward(torch.tensor([1.0, -2.0]), torch.tensor([1, 0]), 0.5)
    assert torch.equal(t, torch.tensor([1.5, -2.0]))
    with pytest.raises(ValueError, match="turns_left"):
        absorbing_reward(1.0, -1, 1.0)


def first_turn_scripted(first_answers):
    """Agents answer ``first_answers[j]`` in their j-th sample at turn 1 and always A afterwards."""
    counters = {}

    def respond(agent, messages):
        turn = sum(m["role"] == "assistant" for m in messages)
        if turn:
            return "A"
        j = counters.get(agent, 0)
        counters[agent] = j + 1
        return first_answers[j % len(first_answers)]

    return ScriptedTeam(respond)


def test_magrpo_tree_turn_1_solve_beats_turn_2_solve():
    """An early solve against a later one: K = 2, H = 2, gamma 1; sibling 0 solves at turn 1 (4.0), sibling 1 earns
    2.5 and solves at turn 2 (4.0). Absorbing end: G0 = 4 + 4 = 8, G1 = 2.5 + 4 = 6.5, advantages +0.75 / -0.75
    (the reference: +0.75). Keeping only the rewards so far would give G0 = 4 and advantage -1.25."""
    env = EarlySolveEnv(n_agents=2, horizon=2, solve=4.0, partial=2.5)
    batch = tree_batch(first_turn_scripted(["A", "B"]), env, env.tasks("train"), k=2, gamma=1.0)
    set_group_advantages(batch.items, "mean")
    root = [s for s in batch.items if s.turn == 0]
    assert [s.returns for s in root] == [8.0, 6.5, 8.0, 6.5]
    assert [s.advantages for s in root] == [0.75, -0.75, 0.75, -0.75]


def test_magrpo_tree_discounted_absorbing_return():
    """gamma 0.9, H = 3: a turn-1 solve is 4 (1 + 0.9 + 0.81) = 10.84; the sibling: 2.5 + 0.9 * 4 (1 + 0.9) = 9.34."""
    env = EarlySolveEnv(n_agents=2, horizon=3, solve=4.0, partial=2.5)
    batch = tree_batch(first_turn_scripted(["A", "B"]), env, env.tasks("train"), k=2, gamma=0.9)
    root = [s.returns for s in batch.items if s.turn == 0 and s.agent == 0]
    assert root == pytest.approx([10.84, 9.34], rel=1e-12)


def test_node_termination_follows_the_reference_rule():
    """``node``: all children end when the mean of the node's team rewards exceeds the threshold (strictly)."""
    node = TreeNode(state=None, depth=0, joints=[(0,), (1,)], rewards=[(1.0,), (3.0,)], children=["a", "b"])
    assert early_ends(node, 1.99, "node") == [0, 1]
    assert early_ends(node, 2.0, "node") == []  # mean 2.0 is not > 2.0
    assert early_ends(node, 2.0, "branch") == [1]  # branch: each child on its own, >=
    assert early_ends(node, None, "node") == []
    # in a tree: a node whose two children score A,A -> 4.0 and A,B -> 2.5 (mean 3.25) ends whole at 3.0
    env = EarlySolveEnv(n_agents=2, horizon=3, solve=4.0, partial=2.5)
    roots = expand_tree(
        first_turn_scripted(["A", "B"]), env, env.tasks("train"), 2, termination_threshold=3.0, termination="node"
    )
    assert roots[0].children == [None, None] and roots[0].turns_left == [2, 2]
    backup_returns(roots[0], 1.0)
    assert roots[0].returns[:, 0].tolist() == [12.0, 7.5]  # both repeat their reward for the 2 skipped turns


def test_cross_reduction_sum_is_the_reference_scale():
    node = TreeNode(
        state=None,
        depth=0,
        joints=joint_indices(2, 2, "cross"),
        rewards=[(10.0, 10.0), (7.0, 7.0), (7.0, 7.0), (0.0, 0.0)],
        children=[None] * 4,
    )
    backup_returns(node, 1.0)
    assert sample_values(node, 0, 2, "sum").tolist() == [17.0, 7.0]
    assert sample_values(node, 0, 2, "mean").tolist() == [8.5, 3.5]
    with pytest.raises(ValueError, match="valid: mean, sum"):
        sample_values(node, 0, 2, "max")


def episodes_of(first_answers, horizon=2, solve=4.0, partial=2.5):
    env = EarlySolveEnv(n_agents=2, horizon=horizon, solve=solve, partial=partial)
    return [eps for eps in play(first_turn_scripted(first_answers), env, env.tasks("train"), len(first_answers))][0]


def test_transitions_carry_the_skipped_turns():
    early, late = episodes_of(["A", "B"])
    assert len(early.steps) == 1 and early.steps[0].turns_left == 1
    assert [s.turns_left for s in late.steps] == [0, 0]
    tr = transitions([early])[0]
    assert tr.done and tr.returned_rewards(1.0) == (8.0, 8.0) and tr.returned_rewards(0.5) == (6.0, 6.0)


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.5])
def test_every_return_estimate_prefers_the_earlier_success(gamma):
    """The rule, through each algorithm's return computation with zero values (pure Monte Carlo):
    CoLLM's TD target at the end, IPPO's GAE over turns, MARFT-A's GAE along the agent chain."""
    early, late = episodes_of(["A", "B"])
    tr_early, tr_late = transitions([early]), transitions([late])
    # CoLLM / IPPO: per-agent returns over turns
    g_early = discounted_returns(torch.tensor([t.returned_rewards(gamma)[0] for t in tr_early]), gamma)[0]
    g_late = discounted_returns(torch.tensor([t.returned_rewards(gamma)[0] for t in tr_late]), gamma)[0]
    assert g_early > g_late
    for trs, g in ((tr_early, g_early), (tr_late, g_late)):
        r = torch.tensor([[t.returned_rewards(gamma)[0] for t in trs]])
        _, ret = gae(r, torch.zeros_like(r), torch.tensor([[float(t.done) for t in trs]]), gamma, 1.0)
        assert float(ret[0, 0]) == pytest.approx(float(g), rel=1e-6)
    # MARFT-A: the team reward on the last of n = 2 agents, GAE along the chain (gamma per agent step)
    chain_returns = []
    for trs in (tr_early, tr_late):
        step = torch.tensor([sum(t.returned_rewards(gamma)) / 2 for t in trs])
        rewards, dones = chain(step, [2] * len(trs), terminated=trs[-1].done)
        _, ret = gae(rewards, torch.zeros_like(rewards), dones, gamma, 1.0)
        chain_returns.append(float(ret[0]))
    assert chain_returns[0] > chain_returns[1]


def test_without_the_absorbing_end_the_early_solve_would_lose():
    """Guards the test above: with the plain rewards the turn-1 solve (4) is worth less than 2.5 + 4."""
    early, late = episodes_of(["A", "B"])
    assert sum(s.rewards[0] for s in early.steps) < sum(s.rewards[0] for s in late.steps)


def test_reward_shift_is_added_to_every_turn_and_repeats_in_the_absorbing_end():
    from collab.envs import make_env
    from collab.errors import UserError

    env = make_env("matrix", preset="table1", reward_shift=-10.0)
    step = env.step(env.reset(env.tasks("train")[0]), ["A", "B"])
    assert step.rewards == (-3.0, -3.0)  # 7 - 10
    assert env.reset({}).memory == {} and step.state.memory["last_reward"] == 7.0  # m_t shows the env's own reward
    with pytest.raises(UserError, match="reward_shift must be a number"):
        make_env("matrix", reward_shift="minus four")
    # the reference configs' shift by the maximum: a turn-1 solve 0 + 0 = 0, a turn-2 solve -1.5 + 0
    shifted = EarlySolveEnv(n_agents=2, horizon=2, solve=4.0, partial=2.5)
    shifted.reward_shift = -4.0
    batch = tree_batch(first_turn_scripted(["A", "B"]), shifted, shifted.tasks("train"), k=2, gamma=1.0)
    assert [s.returns for s in batch.items if s.turn == 0 and s.agent == 0] == [0.0, -1.5]
