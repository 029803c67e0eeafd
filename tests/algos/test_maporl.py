"""MAPoRL (MAPoRL, Section 3): the per-token rewards and the answer rewards by hand, GAE over a response's
tokens, the KL to the reference, per-(turn, agent) parameters, training from turn 2, and learning in a debate."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from collab.algos import from_config
from collab.envs.debate.env import DebateEnv
from collab.envs.debate.penalties import malformed, repetitive
from collab.errors import UserError
from collab.objectives import absorb, debate_rewards, episode_rewards, majority_of_others_table, token_rewards
from collab.policy.models import BaseConfig
from collab.policy.team import AgentSpec, SamplingSpec
from collab.rollout.episodes import play
from tests.support import minibatch_gradient, train

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
    """``n`` debaters answering 7 or 3, sampling from the policy they train (the learning figures below are its)."""
    return [AgentSpec(choices=["7", "3"], sampling=SamplingSpec(temperature=1.0, top_p=1.0)) for _ in range(n)]


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
    start at zero. With token_gamma = lambda = 1 every token's advantage is then the sum of the rewards after
    it, i.e. the answer's reward R: the advantages and returns are R at every token."""
    torch.manual_seed(0)
    env = seven_env(seven)
    module = from_config(
        "maporl",
        base=TINY,
        agents=[AgentSpec(sampling=SamplingSpec(max_new_tokens=5)) for _ in range(2)],
        token_gamma=1.0,
        gae_lambda=1.0,
        kl_coef=0.5,
        train_from_turn=1,
    )
    module.build(env)
    batch = module.prepare(module.rollout(env.tasks("train")[:2]))
    responses = batch.items
    assert len(responses) == 2 * 2 * 2  # 2 problems x 2 turns x 2 agents
    # pi_old and pi_ref come from two code paths (cached decoding, teacher forcing): float32 noise relative to the
    # log-probs' size (about 1e-8 of it, at any thread count), so the tolerance is relative to that size
    tol = 1e-6 * float(torch.cat([r.old_logprobs for r in responses]).abs().mean())
    assert abs(batch.metrics["train/kl_ref"]) <= tol
    for r in responses:
        n = len(r.completion_ids)
        assert r.values.shape == (n,) and torch.all(r.values == 0)
        assert torch.allclose(r.advantages, torch.full((n,), r.reward), atol=tol, rtol=1e-5)
        assert torch.allclose(r.returns, torch.full((n,), r.reward), atol=tol, rtol=1e-5)
        assert r.features.shape == (n, module.team.model_of(0).config.hidden_size)
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
    module = from_config("maporl", base=TINY, agents=one_token(2), per_turn=True, train_from_turn=2, agent_lr=1e-2)
    module.build(env)
    assert len(module.team) == 4 and len(module.value_heads) == 4
    assert [[module.team.acting(t, a) for a in range(2)] for t in range(3)] == [[0, 1], [2, 3], [2, 3]]
    batch = module.prepare(module.rollout(env.tasks("train")[:2]))
    assert {(r.turn, r.member) for r in batch.items} == {(1, 2), (1, 3)}
    episodes = [eps[0] for eps in play(module.team, env, env.tasks("train")[:1], 1, 4)]
    assert len(episodes[0].completions) == 2

    # the turn-1 members are frozen at build: no gradient (nothing for DDP to synchronise), not in the optimizer
    def trainable(m):
        return {p.requires_grad for p in [*module.team.adapter_parameters(m), *module.value_heads[m].parameters()]}

    assert [trainable(m) for m in range(4)] == [{False}, {False}, {True}, {True}]
    optimized = {id(p) for g in module.param_groups() for p in g["params"]}
    assert all(
        id(p) not in optimized
        for m in (0, 1)
        for p in [*module.team.adapter_parameters(m), *module.value_heads[m].parameters()]
    )
    # the auto micro-batch probe runs through a trained member (a frozen one's forward saves nothing for a backward)
    from collab.runtime.memory import bytes_per_token

    shared = from_config("maporl", base=TINY, agents=one_token(2), per_turn=False, train_from_turn=2)
    shared.build(env)
    assert bytes_per_token(module.team) == pytest.approx(bytes_per_token(shared.team), rel=1e-9)
    assert bytes_per_token(module.team) > 0
    before = [adapters(module, m) for m in range(4)]
    train(module, env=env, seed=0, steps=2, batch_size=2)
    assert [moved(before[m], module, m) for m in range(4)] == [False, False, True, True]
    assert [trainable(m) for m in range(4)] == [{False}, {False}, {True}, {True}]  # still, after the adapter switches


def test_kl_to_the_reference_grows_once_the_adapters_move(seven):
    env = seven_env(seven)
    module = from_config(
        "maporl", base=TINY, agents=one_token(2), agent_lr=5e-2, ppo={"num_epochs": 2}, train_from_turn=1
    )
    module.build(env)
    logged = []
    original = module.prepare
    module.prepare = lambda experience: logged.append(original(experience)) or logged[-1]
    train(module, env=env, seed=0, steps=6, batch_size=4)
    assert (
        abs(logged[0].metrics["train/kl_ref"]) < 1e-3 * logged[-1].metrics["train/kl_ref"]
    )  # float noise against the learned KL
    assert logged[-1].metrics["train/kl_ref"] > 1e-3


def test_maporl_needs_a_debate():
    from collab.envs.matrix import MatrixEnv

    with pytest.raises(UserError, match="use --data.env debate"):
        from_config("maporl", agents=None, base=TINY).build(MatrixEnv())


def test_bad_options_are_one_line_errors():
    with pytest.raises(UserError, match="model.ppo.gamma must be in"):
        from_config("maporl", agents=None, base=TINY, ppo={"gamma": 1.5})
    with pytest.raises(UserError, match="model.train_from_turn must be >= 1"):
        from_config("maporl", agents=None, base=TINY, train_from_turn=0)
    with pytest.raises(UserError, match="model.alpha1 must be >= 0"):
        from_config("maporl", agents=None, base=TINY, alpha1=-0.1)


# -- learning ----------------------------------------------------------------------------------------------------
def test_maporl_debaters_learn_the_right_answer(seven):
    """Two one-token debaters (7 is right, 3 wrong) over two turns, 8 debates per rollout, 20 rollouts. The
    return is the sum over both turns of the agents' mean score (at most 2).

    Seeds 0-4: mean return of the first 5 rollouts 1.38-1.50, of the last 5 1.68-1.84."""
    module = from_config(
        "maporl",
        base=BaseConfig(name="tiny", device="cpu", seed=0),
        agents=one_token(2),
        agent_lr=2e-2,
        ppo={"num_epochs": 2},
        kl_coef=0.0,
        per_turn=False,
        train_from_turn=1,
    )
    returns, _ = train(module, env=seven_env(seven), seed=0, steps=40, batch_size=8)
    assert statistics.mean(returns[-5:]) > statistics.mean(returns[:5]) + 0.15, returns
    assert statistics.mean(returns[-5:]) > 1.65, returns


def test_evaluation_reports_the_majority_vote_of_every_turn(seven):
    """``eval/majority@t`` is MajorityVoteAccuracy over the episodes' votes at turn t, and matches the env's own
    tie-expected ``majority@t`` info (the same rule, computed twice: by the env per episode, by the metric)."""
    from collab.evaluation.heldout import evaluate
    from collab.objectives import majority_vote

    env = seven_env(seven, agents=3, horizon=2)
    module = from_config("maporl", base=TINY, agents=[AgentSpec(choices=["7", "3", "5"]) for _ in range(3)])
    module.build(env)
    torch.manual_seed(0)
    metrics, episodes = evaluate(module.team, env, env.tasks("eval"), num_samples=3, ks=[1], max_new_tokens=1)
    flat = [ep for eps in episodes for ep in eps]
    for t in (1, 2):
        by_hand = statistics.mean(
            majority_vote(ep.state.memory["answers"][t - 1], ep.state.memory["correct"][t - 1]) for ep in flat
        )
        assert metrics[f"eval/majority@{t}"] == pytest.approx(by_hand)
        assert metrics[f"eval/majority@{t}"] == pytest.approx(statistics.mean(ep.info[f"majority@{t}"] for ep in flat))
    assert 0 < metrics["eval/majority@1"] < 1


def test_qlora_base_rollout_and_update(seven):
    """Section 4.2's setting on the CPU: a 4-bit (NF4, bitsandbytes) base with LoRA agents; the reference is the
    quantized base with adapters off, the value heads read its features, and one update moves the adapters."""
    env = seven_env(seven)
    module = from_config(
        "maporl",
        base=BaseConfig(name="tiny", device="cpu", quantization="4bit"),
        agents=one_token(2),
        agent_lr=1e-2,
        per_turn=False,
        train_from_turn=1,
    )
    module.build(env)
    assert any("4bit" in type(m).__name__ for m in module.team.model_of(0).modules())
    before = [adapters(module, m) for m in range(2)]
    train(module, env=env, seed=0, steps=1, batch_size=2)
    assert all(moved(before[m], module, m) for m in range(2))


def test_micro_batches_accumulate_the_same_gradient(seven):
    """The update's backward in micro-batches of 1 response gives the gradient of one pass over all of them."""
    env = seven_env(seven)
    module = from_config(
        "maporl",
        base=TINY,
        agents=[AgentSpec(sampling=SamplingSpec(max_new_tokens=4)) for _ in range(2)],
        entropy_coef=0.01,
    )
    module.build(env)
    torch.manual_seed(0)
    batch = module.prepare(module.rollout(env.tasks("train")[:2]))
    params = [p for group in module.param_groups() for p in group["params"]]
    grads = []
    for size in (None, 1):
        module.micro_batch_tokens = size
        for p in params:
            p.grad = None
        stats = minibatch_gradient(module, batch)
        grads.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params])
    assert any(g.abs().sum() > 0 for g in grads[0])
    for a, b in zip(*grads):  # another summation order: float32 noise relative to each tensor's scale (~1e-6 of it)
        assert torch.allclose(a, b, atol=1e-4 * float(a.abs().max()), rtol=1e-4)
    assert set(stats) >= {"train/actor_loss", "train/value_loss", "train/clip_frac"}


# -- early stop on consensus: the absorbing state ----------------------------------------------------------------
def test_absorb_repeats_the_last_played_turn():
    assert torch.equal(
        absorb(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), 2),
        torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]),
    )
    assert absorb([("5", "4"), ("5", "5")], 1) == [("5", "4"), ("5", "5"), ("5", "5")]
    assert absorb([(True,)], 0) == [(True,)]
    with pytest.raises(ValueError):
        absorb([(True,)], -1)


def test_episode_rewards_of_an_early_consensus_by_hand():
    """A = 2, T = 3, gamma 0.5; turn 1: R, W; turn 2: both right (consensus), the debate stops (turns_left 1).
    Extended: turn 3 = turn 2, means m = (0.5, 1, 1):
      R[1] = (s + 0.5 * 1 + 0.25 * 1) / 1.75 -> agent1 1.75/1.75 = 1, agent2 0.75/1.75 = 3/7
      R[2] = (1 + 0.5 * 1) / 1.5 = 1,  R[3] = 1 (the absorbing turn, not trained).
    Cutting Definition 1 at the stop instead (the reference code) would give R[1] = (s + 0.5) / 1.5: 1 and 1/3.
    Table 1 adds +alpha1 at turn 2 for agent 2 (W -> R, the other right); the absorbing turn adds nothing."""
    scores = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    answers, correct = [("5", "4"), ("5", "5")], [(True, False), (True, True)]
    rewards = episode_rewards(scores, answers, correct, 1, 0.5)
    torch.testing.assert_close(rewards, torch.tensor([[1.0, 3 / 7], [1.0, 1.0], [1.0, 1.0]]))
    shaped = episode_rewards(scores, answers, correct, 1, 0.5, alpha1=0.2)
    torch.testing.assert_close(shaped - rewards, torch.tensor([[0.0, 0.0], [0.0, 0.2], [0.0, 0.0]]))
    torch.testing.assert_close(
        episode_rewards(scores, answers, correct, 0, 0.5),
        debate_rewards(scores, torch.tensor(correct), majority_of_others_table(answers, correct), 0.5),
    )


def test_an_earlier_right_consensus_never_lowers_a_reward_by_hand():
    """A = 3, T = 3, gamma 1, the same wrong turn-1 answer of agent 1 (W, R, R at turn 1).
    Early: all right at turn 2 (stop).  Extended means (2/3, 1, 1): R[1, agent1] = (0 + 1 + 1) / 3 = 2/3.
    Late: two of three right at turn 2, all right at turn 3. Means (2/3, 2/3, 1):
    R[1, agent1] = (0 + 2/3 + 1) / 3 = 5/9.
    Cut at the stop (the reference code), the early debate would give (0 + 1) / 2 = 1/2 < 5/9: the rule would fail."""
    w, r = ("4", False), ("5", True)

    def tables(rows):
        return (
            torch.tensor([[float(c) for _, c in row] for row in rows]),
            [tuple(a for a, _ in row) for row in rows],
            [tuple(c for _, c in row) for row in rows],
        )

    early = episode_rewards(*tables([[w, r, r], [r, r, r]]), 1, 1.0)
    late = episode_rewards(*tables([[w, r, r], [w, r, r], [r, r, r]]), 0, 1.0)
    assert float(early[0, 0]) == pytest.approx(2 / 3, rel=1e-6) and float(late[0, 0]) == pytest.approx(5 / 9, rel=1e-6)
    cut = episode_rewards(*tables([[w, r, r], [r, r, r]]), 0, 1.0)  # Definition 1 on the played turns only
    assert float(cut[0, 0]) == pytest.approx(1 / 2, rel=1e-6) and float(cut[0, 0]) < float(late[0, 0])


@pytest.mark.parametrize("agents,wrong", [(2, ("4", "3")), (3, ("4",))])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0])
def test_an_earlier_right_consensus_never_lowers_a_reward_exhaustively(gamma, agents, wrong):
    """Every debate over T = 3 turns (answers right "5" or wrong, rule scores; A = 2 with two wrong answers, A = 3
    with one): the same played prefix followed by the right consensus at turn k gives every answer of the prefix,
    and the turn-k answers, at least the reward they get when turn k is instead any non-consensus row and the right
    consensus comes later (or never). (With A = 3, Definition 1 cut at the stop, as the reference code does, fails
    this at gamma 1.)"""
    import itertools

    options = [("5", True)] + [(w, False) for w in wrong]
    rows = list(itertools.product(options, repeat=agents))
    right = (("5", True),) * agents
    open_rows = [row for row in rows if len({a for a, _ in row}) > 1]

    def rewards(turns):
        scores = torch.tensor([[float(c) for _, c in row] for row in turns])
        return episode_rewards(
            scores,
            [tuple(a for a, _ in row) for row in turns],
            [tuple(c for _, c in row) for row in turns],
            3 - len(turns),
            gamma,
        )

    checked = 0
    for k in range(3):  # early: the prefix (k open rows), then the right consensus at turn k + 1
        for prefix in itertools.product(open_rows, repeat=k):
            early = rewards(list(prefix) + [right])
            lates = []  # late: an open row at turn k + 1, then the right consensus at a later turn j, or never
            for j in range(k + 1, 3):
                lates += [list(prefix) + list(rest) + [right] for rest in itertools.product(open_rows, repeat=j - k)]
            lates += [list(prefix) + list(rest) for rest in itertools.product(open_rows, repeat=3 - k)]
            for late in lates:
                assert torch.all(early[: k + 1] >= rewards(late)[: k + 1] - 1e-6), (prefix, late, early)
                checked += 1
    assert checked > 100


# -- the format penalty --------------------------------------------------------------------------------------
def test_repetitive_and_malformed_by_hand():
    assert not repetitive([1, 2, 1, 2, 1, 2], 3)  # a run repeated 3 times: allowed
    assert repetitive([1, 2, 1, 2, 1, 2, 1, 2], 3)  # 4 times: more than 3
    assert repetitive([9, 5, 5, 5, 5, 8], 3) and not repetitive([9, 5, 5, 5, 8], 3)
    assert not repetitive([9, 5, 5, 5, 5, 8], 3, exempt=lambda run: run == [5])  # digits are exempt
    assert not repetitive(list(range(30)) * 3, 3)  # a 30-token run is longer than 20
    assert repetitive([7] * 21 * 4, 3, exempt=lambda run: len(run) < 21) is False
    assert malformed(None, [1, 2, 3])  # unparsable
    assert malformed(None, [])  # empty
    assert malformed("5", [1, 2], min_tokens=3) and not malformed("5", [1, 2, 3], min_tokens=3)
    assert not malformed("5", [4] * 10) and malformed("5", [4] * 10, max_repeats=3)
    # a tool's result inside a response is not the agent's: its length and repeats are the agent's tokens'
    from types import SimpleNamespace

    from collab.envs.debate.penalties import own_ids, penalise

    with_result = SimpleNamespace(completion_ids=[1, 7, 7, 7, 7, 2], own=[True, False, False, False, False, True])
    assert own_ids(with_result) == [1, 2] and own_ids(SimpleNamespace(completion_ids=[3, 4], own=None)) == [3, 4]
    scores = torch.tensor([[1.0]])
    _, flags = penalise(scores, [["5"]], [[with_result]], -10.0, min_tokens=3)
    assert flags.tolist() == [[True]]  # 2 own tokens of 6: too short
    _, flags = penalise(scores, [["5"]], [[with_result]], -10.0, max_repeats=3)
    assert flags.tolist() == [[False]]  # the result's repeated token is not the agent's


def test_format_penalty_replaces_the_score_before_definition_1(seven):
    """One-token answers are shorter than 2 tokens: with min_response_tokens = 2 every answer is malformed and scores
    -10, so every Definition 1 reward is -10; without the penalty the rewards stay in [0, 1]."""
    env = seven_env(seven)
    torch.manual_seed(0)
    module = from_config(
        "maporl", base=TINY, agents=one_token(2), format_penalty=-10.0, min_response_tokens=2, train_from_turn=1
    )
    module.build(env)
    experience = module.rollout(env.tasks("train")[:2])
    assert [r.reward for r in experience.items] == [pytest.approx(-10.0)] * 8
    assert experience.stats["train/malformed"] == 1.0
    plain = from_config(
        "maporl", base=TINY, agents=one_token(2), format_penalty=-10.0, train_from_turn=1
    )  # "7" and "3" both parse: no penalty
    plain.build(env)
    experience = plain.rollout(env.tasks("train")[:2])
    assert experience.stats["train/malformed"] == 0.0 and all(0.0 <= r.reward <= 1.0 for r in experience.items)
    with pytest.raises(UserError, match="model.max_repeats"):
        from_config("maporl", agents=None, base=TINY, max_repeats=0)


def test_rollout_trains_only_the_played_turns(seven):
    """With the env's stop_on_consensus, a debate whose turn-1 answers agree has one played turn: only its 2 answers
    are trained, with the rewards of the extended table (agreement on 7: 1 each; on 3: 0 each)."""
    env = DebateEnv(dataset=seven, agents=2, horizon=2, train_split="[0:4]", eval_split="[0:4]", stop_on_consensus=True)
    module = from_config("maporl", base=TINY, agents=one_token(2), train_from_turn=1)
    module.build(env)
    for seed in range(10):  # the first seed whose draws give both kinds of debate: some stop, some do not
        torch.manual_seed(seed)
        episodes = [eps[0] for eps in play(module.team, env, env.tasks("train"), 1, 4)]
        if {len(ep.completions) for ep in episodes} == {1, 2}:
            break
    assert {len(ep.completions) for ep in episodes} == {1, 2}, "ten seeds drew one kind of debate only"
    responses, rewards, _ = module.responses(episodes)
    assert len(responses) == sum(2 * len(ep.completions) for ep in episodes)
    for ep, table in zip(episodes, rewards):
        assert table.shape == (2, 2)
        if len(ep.completions) == 1:
            agreed = ep.state.memory["consensus"][0]
            assert torch.equal(table, torch.full((2, 2), 1.0 if agreed == "7" else 0.0))
