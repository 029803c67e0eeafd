"""MARLHF (collab.algos.marlhf) against CoMLRL's rules (comlrl/trainers/preference/marlhf.py at 2b7d29f): the reward
model's Bradley-Terry loss -log sigmoid(r_w - r_l) (its mean over a batch of pairs), MADPO's pairs ranked by the joint
return, the policy phase's rewards the reward model's scores, and each phase moving only its own parameters."""

from __future__ import annotations

import math
import random

import pytest
import torch

from collab.objectives import bradley_terry_loss
from collab.policy.sampling import Completion
from collab.rollout.tree import TreeNode
from tests.algos.test_known_optimum import make
from tests.support import EarlySolveEnv, datamodule_for, minibatch_gradient, quiet_fit


def reference_bt(chosen: float, rejected: float) -> float:
    """The library's per-pair loss, -log sigmoid(d) = log(1 + exp(-d)), in float64 Python arithmetic (stable form for
    large |d|)."""
    d = chosen - rejected
    return math.log1p(math.exp(-d)) if d > 0 else -d + math.log1p(math.exp(d))


def test_the_bradley_terry_loss_is_the_references_on_120_pairs():
    rng = random.Random(0)
    pairs = [(rng.uniform(-5, 5), rng.uniform(-5, 5)) for _ in range(100)]
    pairs += [(rng.gauss(0, 1) * 40, rng.gauss(0, 1) * 40) for _ in range(14)]  # saturated sigmoids
    pairs += [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (30.0, -30.0), (-30.0, 30.0), (2.5, 2.5)]
    chosen = torch.tensor([w for w, _ in pairs], dtype=torch.float64)
    rejected = torch.tensor([lo for _, lo in pairs], dtype=torch.float64)
    losses = bradley_terry_loss(chosen, rejected)
    expected = torch.tensor([reference_bt(w, lo) for w, lo in pairs], dtype=torch.float64)
    assert torch.allclose(losses, expected, rtol=1e-12, atol=1e-300)
    assert float(losses.mean()) == pytest.approx(float(expected.mean()), rel=1e-12)
    # by hand: a tie costs log 2; a margin of 1, log(1 + e^-1); the wrong order by 60, 60
    assert float(losses[-6]) == pytest.approx(math.log(2), rel=1e-12)
    assert float(losses[-5]) == pytest.approx(0.31326168751822286, rel=1e-12)
    assert float(losses[-2]) == pytest.approx(60.0, rel=1e-12)


def completion(agent: int, text: str, prompt: int = 3) -> Completion:
    return Completion(agent, list(range(prompt)), [7] * len(text), text, [0.0] * len(text))


def node(rewards: list[tuple[float, float]], depth: int = 0) -> TreeNode:
    """A node of a 2-agent aligned tree: child c is (agent 0's c-th, agent 1's c-th), rewarded ``rewards[c]``."""
    k = len(rewards)
    return TreeNode(
        state=None,
        depth=depth,
        samples=[[completion(i, f"a{i}-{c}-d{depth}") for c in range(k)] for i in range(2)],
        joints=[(c, c) for c in range(k)],
        rewards=list(rewards),
        infos=[{} for _ in range(k)],
        children=[None] * k,
        turns_left=[0] * k,
    )


def test_pairs_rank_a_trees_joint_actions_by_their_team_return():
    from collab.algos.marlhf import tree_pairs

    # one turn: team returns 0.5, 0, 1 (the mean over the agents); candidates by gap, largest first (a stable sort)
    root = node([(1.0, 0.0), (0.0, 0.0), (1.0, 1.0)])
    pairs = tree_pairs(root, 1.0, "reward_gap", 2)
    assert [(p.winners, p.losers, p.gap) for p in pairs] == [
        (["a0-2-d0", "a1-2-d0"], ["a0-1-d0", "a1-1-d0"], 1.0),
        (["a0-0-d0", "a1-0-d0"], ["a0-1-d0", "a1-1-d0"], 0.5),
    ]
    assert pairs[0].tokens == 2 * (3 + 7) * 2  # both agents' prompt and response in both joint actions
    assert len(tree_pairs(root, 1.0, "all", None)) == 3
    assert tree_pairs(node([(0.3, 0.3)] * 3), 1.0, "reward_gap", None) == []  # ties: no preference

    # two turns: child 0 goes on; its return is its reward plus gamma times its children's mean
    root = node([(0.0, 0.0), (0.5, 0.5)])
    root.children[0] = node([(1.0, 1.0), (0.0, 0.0)], depth=1)
    pairs = tree_pairs(root, 0.5, "reward_gap", None)
    # root: G(0) = 0 + 0.5 * 0.5 = 0.25 < G(1) = 0.5 (with gamma 1, 0.5 = 0.5: a tie); depth 1: child 0 preferred
    assert [(p.winners[0], p.losers[0], p.gap) for p in pairs] == [
        ("a0-1-d0", "a0-0-d0", 0.25),
        ("a0-0-d1", "a0-1-d1", 1.0),
    ]
    assert tree_pairs(root, 1.0, "reward_gap", None)[0].winners[0] == "a0-0-d1"


def scored(**options):
    """MARLHF on the one-turn game (tiny model, ``options`` over :func:`make`'s) with its reward model's head drawn at
    random, as a trained head: the joint actions' scores differ."""
    env = EarlySolveEnv(n_agents=2, horizon=1)
    torch.manual_seed(0)  # the adapters' initial A: drawn when the module is built
    module = make("marlhf", seed=0, **options)
    module.build(env)
    torch.manual_seed(1)
    torch.nn.init.normal_(module.reward_model.heads[0].linear.weight, std=1.0)
    return env, module


def test_the_policy_phase_rewards_every_joint_action_with_the_reward_models_score(one_thread):
    env, module = scored()
    module.rollouts = module.reward_rollouts + 1
    torch.manual_seed(0)
    task = env.tasks("train")[0]
    experience = module.rollout([task])
    samples = experience.items
    k = module.k
    assert len(samples) == 2 * k and {s.group for s in samples} == {0, 1}
    state = env.reset(task)
    texts = [[s.text for s in samples if s.agent == i] for i in range(2)]
    chats = [module.reward_model.inputs(state, [texts[0][c], texts[1][c]])[0][1] for c in range(k)]
    with torch.no_grad():
        scores = module.reward_model.values([0] * k, chats).tolist()
    for s in samples:  # one turn: a sample's return is its joint action's reward, the score, for every agent
        j = [x for x in samples if x.agent == s.agent].index(s)
        assert s.returns == pytest.approx(scores[j], rel=1e-5, abs=1e-6)
    assert len(set(round(x, 6) for x in scores)) > 1
    solved = [float(all(texts[i][c].strip() == "A" for i in range(2))) for c in range(k)]
    assert experience.stats["env/task_reward"] == pytest.approx(sum(1.0 if x else 0.6 for x in solved) / k)


@pytest.mark.parametrize("normalize_std", [True, False])
def test_the_policy_phase_advantages_are_the_scores_less_their_group_mean(normalize_std, one_thread):
    """Each agent's K samples form a group: A = score - mean of the K scores, divided by their std (unbiased, plus
    1e-6: ``group_advantages``) only under ``normalize_std`` (the MAGRPO authors' library divides over its update's
    batch, a node's K samples at its batch size 1)."""
    env, module = scored(normalize_std=normalize_std)
    module.rollouts = module.reward_rollouts + 1
    torch.manual_seed(0)
    experience = module.rollout([env.tasks("train")[0]])
    samples = experience.items
    batch = module.prepare(experience)
    for agent in range(2):
        group = [s for s in samples if s.agent == agent]
        scores = [s.returns for s in group]
        mean = sum(scores) / len(scores)
        std = (sum((x - mean) ** 2 for x in scores) / (len(scores) - 1)) ** 0.5
        for s in group:
            expected = (s.returns - mean) / (std + 1e-6) if normalize_std else s.returns - mean
            assert s.advantages == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert batch.items and batch.metrics["train/adv_abs_max"] > 0  # the scores differ: a signal to learn from


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_the_kl_penalty_weighs_on_the_policy_phase_only(kl_coef, one_thread):
    """With ``kl_coef`` > 0 the policy phase's loss adds kl_coef x the k3 KL of every sample to the initial policy
    (MAGRPO's term; its KL is 0 where the agents have not moved, here nudged off their start), so the agents'
    gradient on the same batch differs from the one without the term; the reward model's phase computes no KL either
    way."""
    env, module = scored(kl_coef=kl_coef)
    with torch.no_grad():  # the agents a step from their start, so that their KL to it is not 0
        for name, weight in module.team.named_parameters():
            if "lora_B" in name:
                weight.normal_(std=0.05)
    torch.manual_seed(0)
    module.rollouts = 1  # the reward model's phase: its pairs (four draws of the task: some joint actions differ)
    stats = minibatch_gradient(module, module.prepare(module.rollout([env.tasks("train")[0]] * 4)))
    assert "train/kl_ref" not in stats and "train/reward_model_loss" in stats
    module.rollouts = module.reward_rollouts + 1  # the policy's
    module.zero_grad()
    batch = module.prepare(module.rollout([env.tasks("train")[0]]))
    stats = minibatch_gradient(module, batch)
    assert ("train/kl_ref" in stats) == (kl_coef > 0)
    if kl_coef:
        assert stats["train/kl_ref"] > 0
        moved = [p for n, p in module.team.named_parameters() if "lora_B" in n and p.grad is not None]
        with_kl = [p.grad.clone() for p in moved]
        module.zero_grad()
        module.kl_coef = 0.0  # the same batch without the term
        minibatch_gradient(module, batch)
        without = [torch.zeros_like(p) if p.grad is None else p.grad for p in moved]
        assert moved and any(not torch.allclose(a, b) for a, b in zip(with_kl, without))


def snapshot(module) -> dict[str, dict[str, torch.Tensor]]:
    groups = module.param_groups()
    return {g["name"]: [p.detach().clone() for p in g["params"]] for g in groups}


def moved(before, after) -> set[str]:
    return {name for name in before if any(not torch.equal(a, b) for a, b in zip(before[name], after[name]))}


def test_the_reward_model_phase_moves_the_reward_model_and_the_policy_phase_the_agents(one_thread):
    import lightning as L

    env = EarlySolveEnv(n_agents=2, horizon=1)
    module = make("marlhf", seed=0)
    module.reward_rollouts = 2
    module.build(env)
    seen = [snapshot(module)]

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            seen.append(snapshot(pl_module))

    L.seed_everything(0, verbose=False)
    quiet_fit(module, datamodule_for(env, batch_size=4, seed=0), 4, callbacks=[Record()])
    agents = set(module.team.names)
    assert [moved(a, b) for a, b in zip(seen, seen[1:])] == [{"reward_model"}] * 2 + [agents] * 2


def test_the_reward_model_learns_the_tasks_preference_and_the_team_then_solves(one_thread):
    """The known optimum of tests/algos/test_known_optimum.py at one turn (every agent answers A): the first rollouts
    fit the reward model to the task's pairs without moving an agent, and the solve then scores highest; MAGRPO on its
    scores alone (the task's reward never reaches the policy's update) then reaches the solve."""
    import lightning as L

    from tests.algos.test_known_optimum import solve_at_turn_1

    env = EarlySolveEnv(n_agents=2, horizon=1)
    state = env.reset(env.tasks("train")[0])
    joints = (["A", "A"], ["A", "B"], ["B", "A"], ["B", "B"])
    seen = {}

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer, module, *args):
            if trainer.global_step == module.reward_rollouts:
                chats = [module.reward_model.inputs(state, joint)[0][1] for joint in joints]
                with torch.no_grad():
                    seen["scores"] = module.reward_model.values([0] * 4, chats).tolist()
                seen["solve"] = solve_at_turn_1(module, env)

    L.seed_everything(0, verbose=False)
    module = make("marlhf", seed=0)
    module.reward_rollouts = REWARD_ROLLOUTS
    module.build(env)
    before = solve_at_turn_1(module, env)
    quiet_fit(module, datamodule_for(env, batch_size=2, seed=0), REWARD_ROLLOUTS + POLICY_ROLLOUTS, callbacks=[Probe()])
    assert seen["solve"] == pytest.approx(before, rel=1e-6)  # the reward model's phase moves no agent
    assert seen["scores"][0] > max(seen["scores"][1:]), seen  # the solve scores highest
    assert solve_at_turn_1(module, env) > 0.6, (before, seen)


REWARD_ROLLOUTS, POLICY_ROLLOUTS = 10, 10


@pytest.mark.parametrize(
    "option,value,message",
    [
        ("reward_rollouts", 0, "model.reward_rollouts must be >= 1"),
        ("reward_model", {"kind": "v"}, "its kind must be q"),
        ("reward_model", {"lr": None}, "model.reward_model.lr must be > 0"),
        ("reward_model", {"context": 4}, "model.reward_model.context must be >= 8"),
        ("pairs_per_node", 0, "model.pairs_per_node must be >= 1 or null"),
        ("pair_selection", "best", "reward_gap, all, random"),
        ("num_generations", 1, "num_generations >= 2"),
    ],
)
def test_bad_options_end_in_one_line(option, value, message):
    from collab.algos import from_config
    from collab.errors import UserError

    with pytest.raises(UserError, match=message):
        from_config("marlhf", base={"name": "tiny"}, **{option: value})
    with pytest.raises(UserError, match="pairs_per_node null"):
        from_config("marlhf", base={"name": "tiny"}, pair_selection="all", pairs_per_node=2)
