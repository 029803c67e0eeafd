"""MAPoRL (paper 003, Section 3): the per-token rewards and the answer rewards by hand, GAE over a response's
tokens, the KL to the reference, per-(turn, agent) parameters, training from turn 2, and learning in a debate."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from collab.algos.maporl import MAPoRL, debate_rewards, token_rewards
from collab.envs.debate.env import DebateEnv
from collab.errors import UserError
from collab.models import BaseConfig
from collab.objectives import majority_of_others_table
from collab.rollout.episodes import play
from collab.team import AgentSpec, SamplingSpec
from tests.test_actor_critic import train

TINY = BaseConfig(name="tiny", device="cpu")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def seven(tmp_path):
    """A debate whose answer is the one-token "7": agents restricted to the tokens 7 and 3 answer right or wrong."""
    path = tmp_path / "seven.json"
    path.write_text(json.dumps([{"problem": f"Question {i}: say 7.", "answer": "7"} for i in range(4)]))
    return str(path)


def seven_env(path, agents=2, horizon=2):
    return DebateEnv(dataset=path, agents=agents, horizon=horizon, train_split="[0:4]", eval_split="[0:4]")


def one_token(n):
    return [AgentSpec(choices=["7", "3"]) for _ in range(n)]


# -- the rewards by hand ---------------------------------------------------------------------------------------
def test_token_rewards_by_hand():
    old = torch.tensor([-1.0, -0.5, -2.0])
    ref = torch.tensor([-1.5, -0.5, -1.0])
    # -0.1 (old - ref) = [-0.05, 0, +0.1]; the answer's reward 0.75 is added at the last token
    assert torch.allclose(token_rewards(0.75, old, ref, 0.1), torch.tensor([-0.05, 0.0, 0.85]))
    assert torch.allclose(token_rewards(1.0, old, ref, 0.0), torch.tensor([0.0, 0.0, 1.0]))


def test_debate_rewards_add_definition_1_and_both_tables():
    """A = 2, T = 2. Turn 1: agent 1 right ("5"), agent 2 wrong ("4"). Turn 2: both right.

    gamma = 0.5, so Definition 1 divides by 1 + 0.5 at turn 1 and by 1 at turn 2:
      R[1,1] = (1 + 0.5 * (1 + 1) / 2) / 1.5 = 1,   R[1,2] = (0 + 0.5 * 1) / 1.5 = 1/3,   R[2,a] = 1.
    Table 1 (applied at turn 2): agent 2 went W -> R while the other (agent 1) was right at turn 1: +alpha1.
    Table 2 (applied at turn 1): agent 1's others' majority (agent 2) went W -> R and agent 1 was right: +beta1;
    agent 2's others (agent 1) stayed right: 0."""
    answers = [["5", "4"], ["5", "5"]]
    correct = [[True, False], [True, True]]
    majority = majority_of_others_table(answers, correct)
    assert majority.tolist() == [[0.0, 1.0], [1.0, 1.0]]
    scores = torch.tensor(correct, dtype=torch.float32)
    plain = debate_rewards(scores, torch.tensor(correct), majority, 0.5)
    assert torch.allclose(plain, torch.tensor([[1.0, 1 / 3], [1.0, 1.0]]))
    shaped = debate_rewards(scores, torch.tensor(correct), majority, 0.5, alpha0=0.1, alpha1=0.2, beta0=0.3, beta1=0.4)
    assert torch.allclose(shaped - plain, torch.tensor([[0.4, 0.0], [0.0, 0.2]]))


# -- the rollout -------------------------------------------------------------------------------------------------
def test_fresh_module_gives_every_token_its_answers_reward(seven):
    """Before any update the adapters are zero, so pi_old = pi_ref and the KL rewards vanish; the value heads
    start at zero. With gae_gamma = lambda = 1 every token's advantage is then the sum of the rewards after
    it, i.e. the answer's reward R: the advantages and returns are R at every token."""
    torch.manual_seed(0)
    env = seven_env(seven)
    module = MAPoRL(base=TINY, agents=[AgentSpec(sampling=SamplingSpec(max_new_tokens=5)) for _ in range(2)],
                    gae_gamma=1.0, gae_lambda=1.0, kl_coef=0.5)
    module.build(env)
    batch = module.rollout(env, env.tasks("train")[:2])
    responses = batch.buffer.items
    assert len(responses) == 2 * 2 * 2  # 2 problems x 2 turns x 2 agents
    assert batch.stats["train/kl_ref"] == pytest.approx(0.0, abs=1e-5)
    for r in responses:
        n = len(r.completion_ids)
        assert r.extras["values"].shape == (n,) and torch.all(r.extras["values"] == 0)
        assert torch.allclose(r.extras["advantages"], torch.full((n,), r.reward), atol=1e-5)
        assert torch.allclose(r.extras["returns"], torch.full((n,), r.reward), atol=1e-5)
        assert r.extras["features"].shape == (n, module.team.model_of(0).config.hidden_size)
    # the rewards are Definition 1 of the episode's verifier scores (gamma 0.5): turn-2 answers get their own score
    for r in responses:
        if r.turn == 1:
            assert r.reward in (0.0, 1.0)


def test_gae_over_tokens_with_values_and_kl():
    """GAE of one 3-token response, by hand: rewards r = [-0.1, 0, 1.2], values V = [0.5, 0.2, 0.4], terminal at
    the last token, gamma 1, lambda 0.5.
      delta_3 = 1.2 - 0.4 = 0.8;          A_3 = 0.8
      delta_2 = 0 + 0.4 - 0.2 = 0.2;      A_2 = 0.2 + 0.5 * 0.8 = 0.6
      delta_1 = -0.1 + 0.2 - 0.5 = -0.4;  A_1 = -0.4 + 0.5 * 0.6 = -0.1
    returns = A + V = [0.4, 0.8, 1.2]."""
    from collab.objectives import gae

    rewards = token_rewards(1.2, torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-2.0, -2.0, -3.0]), 0.1)
    assert torch.allclose(rewards, torch.tensor([-0.1, 0.0, 1.2]))
    advantages, returns = gae(rewards, torch.tensor([0.5, 0.2, 0.4]), torch.tensor([0.0, 0.0, 1.0]), 1.0, 0.5)
    assert torch.allclose(advantages, torch.tensor([-0.1, 0.6, 0.8]))
    assert torch.allclose(returns, torch.tensor([0.4, 0.8, 1.2]))


def adapters(module, member):
    return [p.detach().clone() for p in module.team.adapter_parameters(member)]


def moved(before, module, member):
    return any(not torch.equal(a, b) for a, b in zip(before, module.team.adapter_parameters(member)))


def test_per_turn_parameters_and_training_from_turn_2(seven):
    """theta_ta: 2 agents x 2 turns = 4 adapters and 4 value heads; role a at turn t is member 2t + a. With
    train_from_turn = 2 only the turn-2 members learn; the turn-1 adapters stay as they were."""
    env = seven_env(seven)
    module = MAPoRL(base=TINY, agents=one_token(2), per_turn=True, train_from_turn=2, agent_lr=1e-2)
    module.build(env)
    assert len(module.team) == 4 and len(module.value_heads) == 4
    assert [[module.team.acting(t, a) for a in range(2)] for t in range(3)] == [[0, 1], [2, 3], [2, 3]]
    batch = module.rollout(env, env.tasks("train")[:2])
    assert {(r.turn, r.member) for r in batch.buffer.items} == {(1, 2), (1, 3)}
    episodes = [eps[0] for eps in play(module.team, env, env.tasks("train")[:1], 1, 4)]
    assert len(episodes[0].completions) == 2

    before = [adapters(module, m) for m in range(4)]
    train(module, env=env, seed=0, steps=2, batch_size=2)
    assert [moved(before[m], module, m) for m in range(4)] == [False, False, True, True]


def test_kl_to_the_reference_grows_once_the_adapters_move(seven):
    env = seven_env(seven)
    module = MAPoRL(base=TINY, agents=one_token(2), agent_lr=5e-2, num_epochs=2)
    module.build(env)
    logged = []
    original = module.rollout
    module.rollout = lambda e, tasks: logged.append(original(e, tasks)) or logged[-1]
    train(module, env=env, seed=0, steps=6, batch_size=4)
    assert logged[0].stats["train/kl_ref"] == pytest.approx(0.0, abs=1e-5)
    assert logged[-1].stats["train/kl_ref"] > 1e-3


def test_maporl_needs_a_debate():
    from collab.envs.matrix import MatrixEnv

    with pytest.raises(UserError, match="use --data.env debate"):
        MAPoRL(base=TINY).build(MatrixEnv())


def test_bad_options_are_one_line_errors():
    with pytest.raises(UserError, match="model.gamma must be in"):
        MAPoRL(base=TINY, gamma=1.5)
    with pytest.raises(UserError, match="model.train_from_turn must be >= 1"):
        MAPoRL(base=TINY, train_from_turn=0)
    with pytest.raises(UserError, match="model.alpha1 must be >= 0"):
        MAPoRL(base=TINY, alpha1=-0.1)


# -- learning ----------------------------------------------------------------------------------------------------
def test_maporl_debaters_learn_the_right_answer(seven):
    """Two one-token debaters (7 is right, 3 wrong) over two turns, 8 debates per rollout, 20 rollouts. The
    return is the sum over both turns of the agents' mean score (at most 2).

    Seeds 0-4: mean return of the first 5 rollouts 1.38-1.50, of the last 5 1.68-1.84."""
    module = MAPoRL(base=BaseConfig(name="tiny", device="cpu", seed=0), agents=one_token(2), agent_lr=2e-2,
                    num_epochs=2, kl_coef=0.0)
    returns, _ = train(module, env=seven_env(seven), seed=0, steps=40, batch_size=8)
    assert statistics.mean(returns[-5:]) > statistics.mean(returns[:5]) + 0.15, returns
    assert statistics.mean(returns[-5:]) > 1.65, returns


def test_evaluation_reports_the_majority_vote_of_every_turn(seven):
    """``eval/majority@t`` is MajorityVoteAccuracy over the episodes' votes at turn t, and matches the env's own
    tie-expected ``majority@t`` info (the same rule, computed twice: by the env per episode, by the metric)."""
    from collab.evaluation import evaluate
    from collab.objectives import majority_vote

    env = seven_env(seven, agents=3, horizon=2)
    module = MAPoRL(base=TINY, agents=[AgentSpec(choices=["7", "3", "5"]) for _ in range(3)])
    module.build(env)
    torch.manual_seed(0)
    metrics, episodes = evaluate(module.team, env, env.tasks("eval"), num_samples=3, ks=[1], max_new_tokens=1)
    flat = [ep for eps in episodes for ep in eps]
    for t in (1, 2):
        by_hand = statistics.mean(majority_vote(ep.state.memory["answers"][t - 1], ep.state.memory["correct"][t - 1])
                                  for ep in flat)
        assert metrics[f"eval/majority@{t}"] == pytest.approx(by_hand)
        assert metrics[f"eval/majority@{t}"] == pytest.approx(statistics.mean(ep.info[f"majority@{t}"] for ep in flat))
    assert 0 < metrics["eval/majority@1"] < 1


def test_qlora_base_rollout_and_update(seven):
    """Section 4.2's setting on the CPU: a 4-bit (NF4, bitsandbytes) base with LoRA agents; the reference is the
    quantized base with adapters off, the value heads read its features, and one update moves the adapters."""
    env = seven_env(seven)
    module = MAPoRL(base=BaseConfig(name="tiny", device="cpu", quantization="4bit"), agents=one_token(2), agent_lr=1e-2)
    module.build(env)
    assert any("4bit" in type(m).__name__ for m in module.team.model_of(0).modules())
    before = [adapters(module, m) for m in range(2)]
    train(module, env=env, seed=0, steps=1, batch_size=2)
    assert all(moved(before[m], module, m) for m in range(2))


def test_micro_batches_accumulate_the_same_gradient(seven):
    """The update's backward in micro-batches of 1 response gives the gradient of one pass over all of them."""
    env = seven_env(seven)
    module = MAPoRL(base=TINY, agents=[AgentSpec(sampling=SamplingSpec(max_new_tokens=4)) for _ in range(2)],
                    entropy_coef=0.01)
    module.build(env)
    torch.manual_seed(0)
    responses = module.rollout(env, env.tasks("train")[:2]).buffer.items
    params = [p for group in module.param_groups() for p in group["params"]]
    grads = []
    for size in (None, 1):
        module.micro_batch_size = size
        for p in params:
            p.grad = None
        stats = module.accumulate(responses, lambda loss: loss.backward())
        grads.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params])
    assert any(g.abs().sum() > 0 for g in grads[0])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
    assert set(stats) >= {"train/actor_loss", "train/value_loss", "train/clip_frac"}
