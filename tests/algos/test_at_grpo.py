"""AT-GRPO (PettingLLMs, arXiv 2510.11062): its tree keeps the best candidate of each turn, its groups are one agent's
K candidates at one turn of one task, the lowest-mean share of the groups is dropped and the rest get GRPO's
std-normalised advantages. The cross-check replays the reference's rules (``multi_agents_ppo_trainer.py``'s
``_assign_consistent_uids`` with ``filter_method: mean``, verl's ``compute_grpo_outcome_advantage``, the engine's
``np.argmax`` selection) on 120 hand-made rollouts, written here from their code's rules, not from collab's."""

import random
from collections import defaultdict

import numpy as np
import pytest
import torch

from collab.algos import from_config
from collab.algos.at_grpo import filter_groups
from collab.algos.magrpo import set_group_advantages
from collab.errors import UserError
from collab.objectives import best_joint, low_mean_groups
from collab.policy.models import BaseConfig
from collab.rollout.experience import Decision
from collab.rollout.tree import expand_tree
from tests.rollout.test_tree import team_for
from tests.support import CountingEnv, TwoTurnEnv


def test_low_mean_groups_by_hand():
    means = [0.5, 0.1, 0.1, 0.9]
    assert low_mean_groups(means, 0.5) == [1, 2]  # int(4 x 0.5) = 2 lowest
    assert low_mean_groups(means, 0.3) == [1]  # int(1.2) = 1; of the equal means the earlier group
    assert low_mean_groups(means, 0.0) == []
    assert low_mean_groups([1.0, 1.0, 1.0], 0.7) == [0, 1]  # int(2.1) = 2, ties in order


def test_best_joint_by_hand():
    assert best_joint([(1.0, 0.0), (0.0, 1.0), (1.0, 1.0), (0.5, 0.5)]) == 2  # team means 0.5, 0.5, 1, 0.5
    assert best_joint([(1.0, 1.0), (0.0, 2.0)]) == 0  # equal means: the first
    assert best_joint([(-2.0,), (-0.1,), (-0.1,)]) == 1


@pytest.mark.parametrize("n,k,h", [(2, 3, 3), (3, 2, 2)])
def test_the_tree_keeps_one_child_a_turn(n, k, h):
    """n K H generations an episode (no early end), one child expanded per node: the best joint action's, whose
    choices the next turn's state holds (TwoTurnEnv's memory)."""
    torch.manual_seed(0)
    env = TwoTurnEnv(horizon=h) if n == 2 else CountingEnv(n, h)
    roots = expand_tree(team_for(env), env, env.tasks("train"), k, keep="best")
    for root in roots:
        nodes = list(root.nodes())
        assert [node.depth for node in nodes] == list(range(h))
        assert sum(len(s) for node in nodes for s in node.samples) == n * k * h
        for node, child in zip(nodes, nodes[1:]):
            kept = [c for c, ch in enumerate(node.children) if ch is not None]
            assert kept == [best_joint(node.rewards)]
            if n == 2:
                chosen = tuple(node.samples[i][kept[0]].text for i in range(n))
                assert child.state.memory["choices"][-1] == chosen
    with pytest.raises(ValueError, match="unknown keep 'first'; valid: all, best"):
        expand_tree(team_for(env), env, env.tasks("train"), k, keep="first")


def test_a_rollout_gives_a_group_per_task_turn_and_agent():
    torch.manual_seed(0)
    env = CountingEnv(2, 2)
    module = from_config("at_grpo", base=BaseConfig(name="tiny", seed=0), agents=None, num_generations=3)
    module.build(env)
    tasks = env.tasks("train") * 2
    experience = module.rollout(tasks)
    keys = {s.group: (s.turn, s.agent) for s in experience.items}
    assert len(experience.items) == len(tasks) * 2 * 3 * 2 and len(keys) == len(tasks) * 2 * 2
    per_group = defaultdict(list)
    for s in experience.items:
        per_group[s.group].append(s)
        assert s.returns in (0.0, 1.0, 2.0)  # the turn's own reward: its A's
    assert all(len(m) == 3 for m in per_group.values())
    batch = module.prepare(experience)
    kept = {s.group for s in batch.items}
    assert len(kept) == len(keys) - int(len(keys) * 0.5)
    for g in kept:
        r = torch.tensor([float(s.returns) for s in per_group[g]], dtype=torch.float64)
        expected = (r - r.mean()) / (r.std() + 1e-6)
        assert [s.advantages for s in per_group[g]] == pytest.approx(expected.tolist(), rel=1e-12, abs=1e-12)


# -- the reference's rules, on hand-made rollouts ----------------------------------------------------------------
def reference_groups(records: list[dict], ratio: float) -> tuple[list[int], dict[int, float]]:
    """``_assign_consistent_uids`` (mode mean) then verl's GRPO advantage, on records in the batch's order
    (problem, turn, agent, K candidates): the kept record indices and each one's advantage. The group key is (problem,
    turn, agent); the reference divides the problem index by K a second time, which merges K problems' groups (a bug:
    its maintainers dropped the division in a later mode)."""
    uids: dict[tuple, list[tuple[int, float]]] = {}
    for i, r in enumerate(records):
        uids.setdefault((r["problem"], r["turn"], r["agent"]), []).append((i, r["reward"]))
    means = {uid: (float(np.mean([x for _, x in m])) if len(m) > 1 else 0.0) for uid, m in uids.items()}
    remove = int(len(means) * ratio)
    dropped = {uid for uid, _ in sorted(means.items(), key=lambda item: item[1])[:remove]} if remove else set()
    kept = [i for uid, m in uids.items() if uid not in dropped for i, _ in m]
    advantages = {}
    for uid, members in uids.items():
        if uid in dropped:
            continue
        scores = np.array([x for _, x in members], dtype=np.float64)
        mean, std = scores.mean(), scores.std(ddof=1)  # torch.std: unbiased
        for (i, _), s in zip(members, scores):
            advantages[i] = (s - mean) / (std + 1e-6)
    return sorted(kept), advantages


def hand_made(rng: random.Random) -> tuple[list[dict], int]:
    """A rollout's records: 1-4 problems, each 1-4 turns long, 1-3 agents, K = 2-6 candidates, rewards from the games'
    values (ties likely) or continuous."""
    agents, k = rng.randint(1, 3), rng.randint(2, 6)
    discrete = rng.random() < 0.6
    records = []
    for problem in range(rng.randint(1, 4)):
        for turn in range(rng.randint(1, 4)):
            for agent in range(agents):
                for _ in range(k):
                    x = rng.choice([-2.0, -0.1, 0.0, 0.5, 1.0, 1.5]) if discrete else rng.uniform(-2, 2)
                    records.append({"problem": problem, "turn": turn, "agent": agent, "reward": x})
    return records, k


def test_filter_and_advantages_equal_the_references_rules_on_120_rollouts():
    rng = random.Random(0)
    checked = 0
    for case in range(120):
        records, _ = hand_made(rng)
        ratio = rng.choice([0.0, 0.25, 0.5, 0.75])
        group_of: dict[tuple, int] = {}
        samples = [
            Decision(
                r["agent"],
                r["agent"],
                r["turn"],
                [],
                [],
                torch.zeros(0),
                returns=r["reward"],
                group=group_of.setdefault((r["problem"], r["turn"], r["agent"]), len(group_of)),
                text=str(i),
            )
            for i, r in enumerate(records)
        ]
        kept = filter_groups(samples, ratio)
        set_group_advantages(kept, "mean", normalize_std=True)
        expected_kept, expected = reference_groups(records, ratio)
        assert sorted(int(s.text) for s in kept) == expected_kept, case
        for s in kept:
            assert s.advantages == pytest.approx(expected[int(s.text)], rel=1e-9, abs=1e-9), case
        checked += len(kept)
    assert checked > 1000


def test_the_continuing_candidate_is_the_references_argmax_on_120_turns():
    """One agent: the reference's per-agent ``np.argmax`` over its K candidates' rewards (the first of equals); a
    team: the same over the candidates' mean reward (collab's joint-action turn, docs/fidelity.md)."""
    rng = random.Random(1)
    for case in range(120):
        agents, k = rng.randint(1, 3), rng.randint(2, 8)
        rewards = [tuple(rng.choice([-2.0, -0.1, 0.0, 0.5, 1.0]) for _ in range(agents)) for _ in range(k)]
        assert best_joint(rewards) == int(np.argmax([np.mean(r) for r in rewards])), case
        if agents == 1:
            assert best_joint(rewards) == int(np.argmax([r[0] for r in rewards])), case


@pytest.mark.parametrize(
    "options,message",
    [
        ({"ppo": {"gamma": 0.9}}, "model.ppo.gamma must be 0"),
        ({"filter_ratio": 1.0}, r"model.filter_ratio must be in \[0, 1\)"),
        ({"num_generations": 1}, "num_generations >= 2"),
        ({"entropy_coef": -0.1}, "model.entropy_coef must be a number >= 0"),
    ],
)
def test_bad_options_are_one_line(options, message):
    with pytest.raises(UserError, match=message):
        from_config("at_grpo", base=BaseConfig(name="tiny", seed=0), **options)


@pytest.mark.parametrize("coef", [0.0, 0.5])
def test_the_entropy_bonus_is_each_agents_token_mean_entropy_of_its_moves(coef):
    """With every advantage 0 the loss is the bonus alone: -c x (each agent's mean over its samples of the entropy of
    its four-move choice), the choice's probabilities read one move at a time (Plan-Path's ``one_move``)."""
    from collab.envs import make_env

    torch.manual_seed(0)
    env = make_env("plan_path", one_move=True, horizon=1, num_train=2, num_eval=1)
    module = from_config("at_grpo", base=BaseConfig(name="tiny", seed=0), num_generations=3, entropy_coef=coef)
    module.build(env)
    samples = module.rollout(env.tasks("train")).items
    for s in samples:
        s.advantages = 0.0
    scale = module.normalizers(samples, None, 0)
    loss, _ = module.policy_loss(samples, scale)
    per_agent = defaultdict(list)
    with torch.no_grad():
        for s in samples:
            choices = module.team.choice_ids[s.agent]
            p = torch.tensor(
                [float(module.team.logprobs(s.agent, [s.prompt_ids], [[int(t)]])[0].exp()) for t in choices],
                dtype=torch.float64,
            )
            assert float(p.sum()) == pytest.approx(1.0, rel=1e-4)
            per_agent[s.agent].append(float(-(p * p.log()).sum()))
    assert len(per_agent) == 2 and all(len(h) == 2 * 3 for h in per_agent.values())
    expected = -coef * sum(sum(h) / len(h) for h in per_agent.values())
    assert float(loss) == pytest.approx(expected, rel=1e-4, abs=1e-9)
