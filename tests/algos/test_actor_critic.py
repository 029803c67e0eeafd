"""The actor-critic family (CoLLM, Algorithm 1 CoLLM-CC, Appendix B Algorithm 2 CoLLM-DC; IPPO):
the rollout's transitions, TD(0) targets and GAE advantages checked by hand with a constant
critic, the optimizer's parameter groups, and learning on the matrix game and a 2-turn sparse-reward game.
"""

from __future__ import annotations

import functools
import math
import statistics

import pytest
import torch

from collab.algos import from_config
from collab.envs.base import Score
from collab.errors import UserError
from collab.policy.models import BaseConfig
from collab.policy.sampling import Completion
from collab.rollout.episodes import Episode, play
from collab.rollout.experience import Batch, Experience, epochs, minibatches, transitions
from tests.support import SAMPLE_THE_POLICY, TwoTurnEnv, backward_passes, prob_of_first_option, train

TINY = BaseConfig(name="tiny", device="cpu")


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: the tiny model's ops are too small to split, and on a busy machine two
    threads waiting on each other make a training run ~10x slower. Also one reduction order."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class StopEnv(TwoTurnEnv):
    """TwoTurnEnv over 3 turns that terminates at once when both agents answer B."""

    def __init__(self) -> None:
        super().__init__(horizon=3)

    def score(self, state, actions):
        s = super().score(state, actions)
        return Score(s.rewards, terminated=all(a == "B" for a in actions), memory=s.memory)


class FixedRewardEnv(TwoTurnEnv):
    """TwoTurnEnv with per-agent rewards fixed by the turn, whatever the agents answer."""

    REWARDS = {0: (1.0, 3.0), 1: (2.0, 6.0)}
    joint_reward = False

    def score(self, state, actions):
        s = super().score(state, actions)
        return Score(self.REWARDS[state.turn], memory=s.memory)


# -- the transitions -------------------------------------------------------------------------------------
def hand_episode(env, joint_actions, logprob=-0.5) -> Episode:
    """An episode played with the given joint actions; completion (t, i) has log-prob ``logprob - t - i/10``."""
    ep = Episode(task=0, start=env.reset(env.tasks("train")[0]))
    for t, joint in enumerate(joint_actions):
        assert not ep.done
        ep.steps.append(env.step(ep.state, list(joint)))
        ep.completions.append([Completion(i, [1, 2], [3], a, [logprob - t - i / 10]) for i, a in enumerate(joint)])
    assert ep.done
    return ep


def test_transitions_chain_histories_and_end_at_the_last_turn():
    env = StopEnv()
    long = hand_episode(env, [("A", "B"), ("A", "A"), ("B", "A")])
    short = hand_episode(env, [("B", "B")])  # terminated at turn 0
    items = transitions([long, short], first_episode=3)
    assert [(tr.episode, tr.turn) for tr in items] == [(3, 0), (3, 1), (3, 2), (4, 0)]
    assert [tr.done for tr in items] == [False, False, True, True]
    # h_t -> h_{t+1}: the next state of turn t is the state of turn t + 1
    assert items[0].state is long.start and items[3].state is short.start
    assert items[0].next_state is items[1].state and items[1].next_state is items[2].state
    assert items[2].next_state.done and items[2].next_state.turn == 3 and items[3].next_state.done
    assert [tr.state.turn for tr in items] == [0, 1, 2, 0]
    # m_t: the last-turn reward in the state's memory
    assert "last_reward" not in items[0].state.memory
    assert items[1].state.memory["last_reward"] == items[0].rewards[0] == 0.5
    # h_{t+1} holds a_t: each agent's history ends with its response and (unless done) the next prompt
    assert [h[-2]["content"] for h in items[0].next_state.histories] == ["A", "B"]
    assert [h[-1]["content"] for h in items[2].next_state.histories] == ["B", "A"]
    # the actions with their behaviour log-probs, the rewards, the next joint action (None at the end)
    assert [[c.text for c in tr.actions] for tr in items] == [["A", "B"], ["A", "A"], ["B", "A"], ["B", "B"]]
    assert items[1].actions[1].logprob == pytest.approx(-1.6)
    assert [tr.rewards for tr in items] == [(0.5, 0.5), (1.0, 1.0), (0.5, 0.5), (0.0, 0.0)]
    assert [tr.next_actions for tr in items] == [["A", "A"], ["B", "A"], None, None]
    assert all(tr.advantages is None and tr.returns is None and tr.values is None for tr in items)


def test_played_transitions_carry_the_behaviour_logprobs():
    env = TwoTurnEnv()
    torch.manual_seed(0)
    module = from_config("collm_cc", agents=None, base=TINY)
    module.build(env)
    episodes = [eps[0] for eps in play(module.team, env, env.tasks("train") * 2, 1, max_new_tokens=1)]
    items = transitions(episodes)
    assert [(tr.episode, tr.turn, tr.done) for tr in items] == [
        (0, 0, False),
        (0, 1, True),
        (1, 0, False),
        (1, 1, True),
    ]
    for k in (0, 2):
        assert items[k].next_state is items[k + 1].state
        assert items[k].next_actions == [c.text for c in items[k + 1].actions]
        assert items[k + 1].next_actions is None
    for tr in items:
        assert [c.text for c in tr.actions] == [h[-1 if tr.done else -2]["content"] for h in tr.next_state.histories]
        for i, c in enumerate(tr.actions):
            assert c.agent == i and c.text in ("A", "B") and len(c.logprobs) == 1
            assert c.prompt_ids == module.team.encode(i, tr.state.histories[i])  # pi_old(a_{i,t} | h_{i,t})
            teacher = module.team.logprobs(i, [c.prompt_ids], [c.completion_ids])[0].detach().sum()
            assert c.logprob < 0 and c.logprob == pytest.approx(float(teacher), abs=1e-4)


def test_minibatches_cover_every_transition_once_per_pass():
    env = StopEnv()
    items = transitions(
        [
            hand_episode(env, [("A", "B"), ("A", "A"), ("B", "A")]),
            hand_episode(env, [("B", "B")]),
            hand_episode(env, [("A", "A"), ("B", "B")]),
        ]
    )
    assert len(items) == 6

    def passes(size, seed, n=2):
        gen = torch.Generator().manual_seed(seed)
        return [[[id(tr) for tr in mb] for mb in minibatches(items, size, gen)] for _ in range(n)]

    everything = sorted(id(tr) for tr in items)
    for size, sizes in ((4, [4, 2]), (1, [1] * 6), (None, [6]), (10, [6])):
        for one_pass in passes(size, seed=0):
            assert [len(mb) for mb in one_pass] == sizes
            assert sorted(i for mb in one_pass for i in mb) == everything
    # seeded: the same seed draws the same order, and a generator that goes on draws a new one
    assert passes(4, seed=0) == passes(4, seed=0)
    first, second = passes(1, seed=0)
    assert first != second and passes(1, seed=0) != passes(1, seed=1)
    assert list(minibatches([], None, torch.Generator())) == []
    # epochs: the passes one after the other, from one generator
    assert [[id(tr) for tr in mb] for mb in epochs(items, 2, 1, torch.Generator().manual_seed(0))] == [
        mb for one_pass in passes(1, seed=0) for mb in one_pass
    ]


# -- the optimizer -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "critic,spec,names",
    [
        ("centralized", {}, ["agent0", "agent1", "critic0"]),
        ("decentralized", {"lr": 0.3}, ["agent0", "agent1", "critic0", "critic1"]),
        ("decentralized", {"share_agent_adapter": True}, ["agent0", "agent1", "critic0", "critic1"]),
    ],
)
def test_one_optimizer_moves_agents_and_critics_at_their_own_rates(critic, spec, names):
    torch.manual_seed(0)
    module = from_config(
        "collm_cc", agents=None, base=TINY, critic=critic, critic_spec=spec, agent_lr=0.1, critic_lr=0.2
    )
    module.build(TwoTurnEnv())
    groups = module.param_groups()
    assert [g["name"] for g in groups] == names
    assert [g["lr"] for g in groups] == [0.1, 0.1] + [spec.get("lr") or 0.2] * (len(names) - 2)
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids))  # no parameter in two groups
    trainable = {id(p) for p in module.parameters() if p.requires_grad}
    assert set(ids) == trainable  # every trainable parameter (adapters, heads) is optimized
    if spec.get("share_agent_adapter"):
        assert all(len(g["params"]) == 2 for g in groups[2:])  # a head: weight and bias
    module.configure_optimizers()  # AdamW accepts the groups


# -- TD(0) targets and GAE with a constant critic, by hand ----------------------------------------------
C = (1.5, -0.5)  # the critics' constant values (critic 0, critic 1)
GAMMA = 0.9


def loss_of(module, items):
    """The loss of ``items`` as one minibatch (its normalizers computed from it alone) and its statistics."""
    batch = Batch(items)
    return module.loss(items, module.normalizers(items, batch, 0))


def with_constant_critics(module, env):
    """Build ``module`` on ``env`` and make critic j output C[j] everywhere (zero weights, bias C[j])."""
    torch.manual_seed(0)
    module.build(env)
    with torch.no_grad():
        for j, head in enumerate(module.critics.heads):
            head.linear.bias.fill_(C[j])
    return module


def one_episode(module, env, count=1):
    torch.manual_seed(0)
    return transitions([eps[0] for eps in play(module.team, env, env.tasks("train") * count, 1, max_new_tokens=1)])


def test_collm_cc_actor_and_critic_use_td0_targets_of_the_team_reward():
    """CC: r_t is the team's mean reward, (1 + 3)/2 = 2 then (2 + 6)/2 = 4, and V = c = 1.5.

    turn 0: y = 2 + 0.9 * 1.5 = 3.35, delta = 1.85;  turn 1 (last, no bootstrap): y = 4, delta = 2.5.
    Every agent's actor is weighted by the team's delta: actor loss = -2 delta at rho = 1."""
    env = FixedRewardEnv()
    module = with_constant_critics(
        from_config("collm_cc", agents=None, base=TINY, critic="centralized", ppo={"gamma": GAMMA}), env
    )
    tr0, tr1 = one_episode(module, env)
    c = C[0]
    for tr, target in ((tr0, 2 + GAMMA * c), (tr1, 4.0)):
        _, stats = loss_of(module, [tr])
        assert stats["train/value_mean"] == pytest.approx(c)
        assert stats["train/td_error_mean"] + c == pytest.approx(target)
        assert stats["train/critic_loss"] == pytest.approx((target - c) ** 2)
        assert stats["train/actor_loss"] == pytest.approx(-2 * (target - c), abs=1e-3)
        assert stats["train/ratio"] == pytest.approx(1.0, abs=1e-4)
    loss, stats = loss_of(module, [tr0, tr1])
    assert stats["train/td_error_mean"] == pytest.approx((1.85 + 2.5) / 2)
    assert loss.requires_grad


def test_collm_dc_critic_i_uses_agent_is_reward_and_weighs_agent_i():
    """DC: critic i values agent i's own reward with its own constant: c = (1.5, -0.5).

    turn 0: delta = (1 + 0.9*1.5 - 1.5, 3 + 0.9*(-0.5) + 0.5) = (0.85, 3.05);
    turn 1: delta = (2 - 1.5, 6 + 0.5) = (0.5, 6.5). Actor loss = -(delta_1 + delta_2) at rho = 1."""
    env = FixedRewardEnv()
    module = with_constant_critics(
        from_config("collm_dc", agents=None, base=TINY, critic="decentralized", ppo={"gamma": GAMMA}), env
    )
    tr0, tr1 = one_episode(module, env)
    for tr, deltas in ((tr0, (0.85, 3.05)), (tr1, (0.5, 6.5))):
        _, stats = loss_of(module, [tr])
        assert stats["train/value_mean"] == pytest.approx(sum(C) / 2)
        assert stats["train/td_error_mean"] == pytest.approx(sum(deltas) / 2)
        assert stats["train/critic_loss"] == pytest.approx(sum(d * d for d in deltas) / 2)
        assert stats["train/actor_loss"] == pytest.approx(-sum(deltas), abs=1e-3)


def test_collm_q_critic_bootstraps_from_the_next_joint_action_and_weighs_actors_by_q():
    """kind q: y = r + gamma Q(h_{t+1}, a_{t+1}) (the same numbers with a constant Q), actor weight Q = c."""
    env = FixedRewardEnv()
    module = with_constant_critics(
        from_config(
            "collm_cc",
            agents=None,
            base=TINY,
            critic="centralized",
            ppo={"gamma": GAMMA},
            critic_spec={"kind": "q"},
        ),
        env,
    )
    tr0, tr1 = one_episode(module, env)
    for tr, target in ((tr0, 2 + GAMMA * C[0]), (tr1, 4.0)):
        _, stats = loss_of(module, [tr])
        assert stats["train/td_error_mean"] + C[0] == pytest.approx(target)
        assert stats["train/actor_loss"] == pytest.approx(-2 * C[0], abs=1e-3)


def test_ippo_gae_advantages_and_returns_by_hand():
    """IPPO, gamma 0.9, lambda 0.8, own-reward weight 1/2, V_i = c_i = (1.5, -0.5).

    Mixed rewards r_i = s_i/2 + mean(s)/2: turn 0 (1, 3) -> (1.5, 2.5); turn 1 (2, 6) -> (3, 5).
    agent 1: delta = (1.5 + 0.9*1.5 - 1.5, 3 - 1.5) = (1.35, 1.5); A = (1.35 + 0.72*1.5, 1.5) = (2.43, 1.5)
    agent 2: delta = (2.5 - 0.45 + 0.5, 5 + 0.5) = (2.55, 5.5);    A = (2.55 + 0.72*5.5, 5.5) = (6.51, 5.5)
    returns = A + V. Two episodes: each gets its own GAE (nothing leaks across the episode boundary)."""
    env = FixedRewardEnv()
    module = with_constant_critics(
        from_config("ippo", agents=None, base=TINY, ppo={"gamma": GAMMA}, gae_lambda=0.8), env
    )
    items = one_episode(module, env, count=2)
    assert len(items) == 4
    module.prepare(Experience(items))
    expected = {0: (2.43, 6.51), 1: (1.5, 5.5)}
    for tr in items:
        adv = torch.tensor(expected[tr.turn])
        assert torch.allclose(tr.advantages, adv, atol=1e-5), (tr.turn, tr.advantages)
        assert torch.allclose(tr.returns, adv + torch.tensor(C), atol=1e-5)
        assert torch.allclose(tr.values, torch.tensor(C))
        assert not tr.advantages.requires_grad
    _, stats = loss_of(module, items)
    assert stats["train/adv_mean"] == pytest.approx((2.43 + 6.51 + 1.5 + 5.5) / 4)
    assert stats["train/value_mean"] == pytest.approx(sum(C) / 2)


def test_ippo_refuses_a_q_critic():
    """IPPO's GAE needs state values V(h_{i,t}); a Q-critic would be read without its actions."""
    with pytest.raises(UserError, match="kind"):
        from_config("ippo", agents=None, base=TINY, critic_spec={"kind": "q"})


# -- learning ------------------------------------------------------------------------------------------


# Hyper-parameters of the learning tests (tiny model): one rollout of ``batch_size`` episodes, then
# ``ppo.num_epochs`` full-buffer updates (so max_steps = rollouts x epochs).
HP = dict(agent_lr=1e-2, critic_lr=5e-2, ppo={"num_epochs": 2}, agent_defaults=SAMPLE_THE_POLICY)
"""The learning tests' options: their probabilities are the policies' own, sampled at temperature 1."""


def test_collm_cc_reaches_the_joint_optimum_of_table_1():
    """Table 1 (joint reward 10/7/7/0): both agents come to prefer A, 20 rollouts of 4 episodes.

    The tiny model cannot put more than about 0.87 on A (seed 0): its final RMSNorm bounds the logit
    gap of A over B at sqrt(d) |(w_A - w_B) * g| = 1.93, so P(A) > 0.8 is close to that ceiling.
    Seeds 0-6 end at P(A) 0.84-0.89 for both agents (they start near 0.5)."""
    module = from_config(
        "collm_cc", agents=None, base=BaseConfig(name="tiny", device="cpu", seed=0), critic="centralized", **HP
    )
    returns, env = train(module, seed=0, steps=40)
    probs = prob_of_first_option(module, env)
    assert all(p > 0.8 for p in probs), (probs, returns)


def test_collm_dc_reaches_the_joint_optimum_of_table_1():
    """CoLLM-DC (one critic per agent, Appendix B): 30 rollouts; seeds 0-6 end at P(A) 0.84-0.89."""
    module = from_config(
        "collm_dc", agents=None, base=BaseConfig(name="tiny", device="cpu", seed=0), critic="decentralized", **HP
    )
    returns, env = train(module, seed=0, steps=60)
    probs = prob_of_first_option(module, env)
    assert all(p > 0.75 for p in probs), (probs, returns)


def test_ippo_reaches_the_joint_optimum_of_table_1():
    """IPPO (decentralized critics, mixed rewards, GAE): 30 rollouts; seeds 0-6 end at P(A) 0.83-0.89."""
    module = from_config("ippo", agents=None, base=BaseConfig(name="tiny", device="cpu", seed=0), **HP)
    returns, env = train(module, seed=0, steps=60)
    probs = prob_of_first_option(module, env)
    assert all(p > 0.75 for p in probs), (probs, returns)


def terminal_count(turn, choices):
    """Paid at the last turn only: the fraction of A's among both agents' answers on both turns."""
    return sum(a == "A" for joint in choices for a in joint) / 4 if turn == 1 else 0.0


def test_collm_cc_learns_a_sparse_terminal_reward_through_its_critic():
    """2 turns, reward 0 at turn 0: the turn-0 answers are credited only through the bootstrapped
    delta_0 = V(h_1) - V(h_0) (h_0 is the same for every episode, so without the critic's V(h_1)
    a turn-0 answer gets no signal). 60 rollouts of 8 episodes.

    Seeds 0-4 at 60 rollouts: mean return of the first 5 rollouts 0.39-0.54, of the last 5 0.83-0.88;
    P(A | h_0) 0.85-0.89 for both agents. 60 rollouts, not 40: float rounding moves the trajectory with the CPU,
    and at 40 an agent can still be below the threshold (docs/measurements.md)."""
    env = TwoTurnEnv(reward=terminal_count)
    module = from_config(
        "collm_cc",
        agents=None,
        base=BaseConfig(name="tiny", device="cpu", seed=0),
        critic="centralized",
        **{**HP, "ppo": {"num_epochs": 2, "gamma": 1.0}},
    )
    returns, env = train(module, env=env, seed=0, steps=60, batch_size=8)
    first, last = statistics.mean(returns[:5]), statistics.mean(returns[-5:])
    assert last > 0.75 and last - first > 0.25, returns
    probs = prob_of_first_option(module, env)  # the turn-0 policy, at h_0
    assert all(p > 0.75 for p in probs), (probs, returns)
    assert math.isfinite(sum(returns))


# -- each critic's and each actor's term a backward pass of its own ----------------------------------------
@pytest.mark.parametrize("algo", ["collm_cc", "collm_dc", "ippo", "marft_a", "marft_t"])
def test_separate_terms_give_the_gradient_of_the_one_pass_loss_with_one_forward_alive_at_a_time(algo, monkeypatch):
    """``parts`` runs each critic's term and each agent's actor term as separate backward passes (actor-critics:
    critic j, then the agents it advises; MARFT: its MLP critic, then agent by agent, weighted by the agent's
    share of the samples): the gradient of ``loss`` (one backward) and its statistics, while each LLM part
    saves for its backward one forward's activations, not the critic's and every agent's together.

    The episode's prompts are one pass each, not shared: its repeated 29-token prompts would share a prefill from
    ``MIN_REPEATED_PROMPT`` tokens, and then the bytes counted for the parts and for the one pass differed by
    1-10% from run to run and between CPUs (the same gradients: tests/algos/test_skeleton.py checks them shared)."""
    from collab.policy import prefixes
    from collab.runtime.memory import saved_for_backward

    unshared = functools.partial(prefixes.shared_prefixes, min_repeated=prefixes.MIN_SHARED_PREFIX)
    monkeypatch.setattr(prefixes, "shared_prefixes", unshared)

    env = FixedRewardEnv()
    module = from_config(algo, agents=None, base=TINY)
    module.build(env)
    module.micro_batch_tokens = None  # one micro-batch: the split is the terms' alone
    marft = algo.startswith("marft")
    if marft:  # train the actors on this rollout (past the critic's warm-up)
        module.critic_warmup, module.rollouts = 0, 1
    torch.manual_seed(0)
    items = one_episode(module, env, count=2)
    batch = module.prepare(Experience(items))
    scale = module.normalizers(batch.items, batch, 0)
    params = [p for group in module.param_groups() for p in group["params"]]

    def grads():
        out = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]
        for p in params:
            p.grad = None
        return out

    weights = {p.untyped_storage().data_ptr() for p in module.parameters()}
    saved_bytes = lambda seen: sum(n for ptr, n in seen.items() if ptr not in weights)  # noqa: E731
    seen, (loss, stats) = saved_for_backward(lambda: module.loss(batch.items, scale))
    stats = {**stats, "train/loss": float(loss.detach())}  # the skeleton adds it to the one pass's statistics
    whole_bytes = saved_bytes(seen)
    loss.backward()
    whole = grads()
    part_stats: dict[str, float] = {}
    parts = backward_passes(module, batch.items, scale, part_stats)
    critics = 1 if marft else len(module.critics)
    assert len(parts) == critics + len(module.team)  # critic 0 [, its agents], critic 1 ...
    part_bytes = []
    for part in parts:
        seen, part_loss = saved_for_backward(part)
        part_bytes.append(saved_bytes(seen))
        part_loss.backward()
    split = grads()
    assert any(g.abs().sum() > 0 for g in whole)
    for a, b in zip(whole, split):  # another summation order: float32 noise relative to each tensor's scale
        assert torch.allclose(a, b, atol=1e-5 * float(a.abs().max()) + 1e-12, rtol=1e-5)
    assert set(part_stats) == set(stats)
    for key, value in stats.items():
        assert part_stats[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert sum(part_bytes) == pytest.approx(whole_bytes, rel=0.05)  # the same activations, saved in turn
    llm_parts = part_bytes[1:] if marft else part_bytes  # MARFT's critic is an MLP on fixed features
    # each part carries one forward (a critic's or an agent's), none the others' too: measured on the tiny team,
    # collm_cc 7.8 (its critic reads the joint history) + 2.3 + 2.3 MB of one pass's 12.4 MB
    assert min(llm_parts) > 0.1 * whole_bytes and max(llm_parts) < 0.7 * whole_bytes, (part_bytes, whole_bytes)
