"""MARFT-A / MARFT-T (MARFT): the decision chain's GAE and token-level backup by hand, the PPO clip
objective per agent, the central critic head (frozen features, head-only optimizer), the Flex-MG
dependency in the agents' prompts, and learning through the agent chain."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from collab.algos import from_config
from collab.envs.base import AgentRole, Env, Score
from collab.errors import UserError
from collab.objectives import bellman_targets, chain, clipped_surrogate, gae, value_loss
from collab.policy.mlp_head import CriticHead, base_features
from collab.policy.models import BaseConfig
from collab.policy.team import AgentSpec, AgentTeam
from collab.rollout.episodes import play
from collab.rollout.experience import Experience, transitions
from collab.rollout.protocol import Dependency, fuse
from tests.support import TwoTurnEnv, train

TINY = BaseConfig(name="tiny", device="cpu")


pytestmark = pytest.mark.usefixtures("one_thread")


# -- the decision chain by hand ------------------------------------------------------------------------
def test_chain_puts_each_steps_reward_on_its_last_element():
    rewards, dones = chain(torch.tensor([0.5, 1.0]), [3, 2])
    assert rewards.tolist() == [0, 0, 0.5, 0, 1.0]
    assert dones.tolist() == [0, 0, 0, 0, 1]
    _, open_ended = chain(torch.tensor([0.5]), [2], terminated=False)
    assert open_ended.tolist() == [0, 0]


def test_gae_along_the_chain_of_three_agents_over_two_steps():
    """Chain (t0,a1) (t0,a2) (t0,a3) (t1,a1) (t1,a2) (t1,a3); r_0 = 1 on (t0,a3), r_1 = 2 on (t1,a3), done at the end.

    gamma = 0.9, lambda = 0.5, V = 0.1 .. 0.6. Deltas d_k = r_k + 0.9 V_{k+1} - V_k (V_6 = 0, terminal):
      d5 = 2 - 0.6 = 1.4                 d4 = 0.9*0.6 - 0.5 = 0.04        d3 = 0.9*0.5 - 0.4 = 0.05
      d2 = 1 + 0.9*0.4 - 0.3 = 1.06      d1 = 0.9*0.3 - 0.2 = 0.07        d0 = 0.9*0.2 - 0.1 = 0.08
    A_k = d_k + 0.45 A_{k+1}:
      A5 = 1.4   A4 = 0.04 + 0.63 = 0.67   A3 = 0.05 + 0.3015 = 0.3515   A2 = 1.06 + 0.158175 = 1.218175
      A1 = 0.07 + 0.54817875 = 0.61817875   A0 = 0.08 + 0.2781804375 = 0.3581804375
    """
    rewards, dones = chain(torch.tensor([1.0, 2.0]), [3, 3])
    values = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    advantages, returns = gae(rewards, values, dones, gamma=0.9, lam=0.5)
    expected = [0.3581804375, 0.61817875, 1.218175, 0.3515, 0.67, 1.4]
    assert advantages.tolist() == pytest.approx(expected, abs=1e-6)
    assert returns.tolist() == pytest.approx([a + v for a, v in zip(expected, values.tolist())], abs=1e-6)


def test_marft_a_prepare_runs_gae_across_agents_and_steps():
    """MARFTA.prepare on a played 2-agent, 2-turn episode equals gae() on the hand-built chain."""
    module = from_config("marft_a", agents=None, base=TINY, ppo={"gamma": 0.9}, gae_lambda=0.5)
    env = TwoTurnEnv()
    module.build(env)
    torch.manual_seed(0)
    episodes = [eps[0] for eps in play(module.team, env, env.tasks("train"), 1, dependency=module.protocol)]
    items = transitions(episodes)
    with torch.no_grad():
        torch.nn.init.normal_(module.critic.net[-1].weight)  # a non-zero critic
        module.prepare(Experience(items, episodes=episodes))
    values = torch.stack([tr.values for tr in items]).reshape(-1)  # (t0,a1) (t0,a2) (t1,a1) (t1,a2)
    step_rewards = torch.tensor([tr.rewards[0] for tr in items])
    rewards = torch.tensor([0, step_rewards[0], 0, step_rewards[1]])
    dones = torch.tensor([0.0, 0, 0, 1])
    advantages, returns = gae(rewards, values, dones, 0.9, 0.5)
    assert torch.cat([tr.advantages for tr in items]).tolist() == pytest.approx(advantages.tolist(), abs=1e-6)
    assert torch.cat([tr.returns for tr in items]).tolist() == pytest.approx(returns.tolist(), abs=1e-6)
    assert len(set(values.tolist())) == 4  # every decision point has its own value


def test_token_level_backup_over_two_short_responses():
    """Agent 1 says 2 tokens, agent 2 says 3, then the team reward R = 1 (terminal). gamma = 0.5.

    Token chain V = [0.2, 0.4 | 0.1, 0.3, 0.6]; the backup (Section 4):
      token 1 of agent 1:  0 + 0.5 * 0.4 = 0.2       (next token)
      token 2 of agent 1:  0 + 0.5 * 0.1 = 0.05      (agent 2's first decision)
      agent 2's tokens:    0.5 * 0.3 = 0.15, 0.5 * 0.6 = 0.3
      its last token:      R + 0.5 * 0 = 1.0         (terminal: no successor)
    """
    rewards, dones = chain(torch.tensor([1.0]), [2 + 3])
    values = torch.tensor([0.2, 0.4, 0.1, 0.3, 0.6])
    targets = bellman_targets(rewards, values, dones, gamma=0.5)
    assert targets.tolist() == pytest.approx([0.2, 0.05, 0.15, 0.3, 1.0])
    # the same backup is GAE's return at lambda = 0
    assert gae(rewards, values, dones, 0.5, 0.0)[1].tolist() == pytest.approx(targets.tolist())
    # not terminal: the last token bootstraps from the next step's first decision
    assert bellman_targets(rewards, values, torch.zeros(5), 0.5, last_value=0.8)[-1] == pytest.approx(1.4)


def test_marft_t_with_one_token_actions_is_marft_a():
    """When every response is one token, the token chain is the agent chain: identical advantages."""
    env = TwoTurnEnv()
    results, values, head = [], [], None
    for algo in ("marft_a", "marft_t"):
        module = from_config(algo, agents=None, base=TINY, ppo={"gamma": 0.9}, gae_lambda=0.7)
        module.build(env)
        if head is None:
            with torch.no_grad():
                torch.nn.init.normal_(module.critic.net[-1].weight, generator=torch.Generator().manual_seed(3))
            head = module.critic.state_dict()
        module.critic.load_state_dict(head)
        torch.manual_seed(0)
        episodes = [eps[0] for eps in play(module.team, env, env.tasks("train") * 3, 1, dependency=module.protocol)]
        items = transitions(episodes)
        with torch.no_grad():
            module.prepare(Experience(items, episodes=episodes))
        results.append(torch.cat([tr.advantages for tr in items]))
        values.append(torch.cat([tr.values.reshape(-1) for tr in items]))
    # The critic reads the features of two code paths (agent-level prompts vs token-level responses), so the
    # values, hence the advantages, differ by float32 noise relative to the values' size (~3e-6 of it): the
    # tolerance follows that scale, far below what a wrong chain or backup would change.
    scale = max(float(values[0].abs().max()), float(results[0].abs().max()))
    assert results[0].tolist() == pytest.approx(results[1].tolist(), rel=1e-4, abs=1e-4 * scale)


# -- the PPO clip objective per agent ------------------------------------------------------------------
def test_clipped_surrogate_by_hand():
    """eps = 0.2: ratio 1.5 with A = 2 is clipped to 1.2 (-2.4); ratio 0.5 with A = -1 to 0.8 (0.8);
    ratio 0.7 with A = 2 stays (-1.4, the min picks the unclipped side); ratio 1.5 with A = -1 stays (1.5)."""
    ratios = torch.tensor([1.5, 0.5, 0.7, 1.5])
    adv = torch.tensor([2.0, -1.0, 2.0, -1.0])
    loss = clipped_surrogate(ratios.log(), torch.zeros(4), adv, 0.2)
    assert loss.tolist() == pytest.approx([-2.4, 0.8, -1.4, 1.5])


def test_marft_a_actor_loss_is_eq2_mean_over_agents_and_steps():
    """Two turns x two agents: old log-probs set so the ratios are 1.5, 0.7, 0.5, 1.5 and advantages 2, 2, -1, -1;
    Eq. 2's loss is -(1/nT) sum min(r A, clip(r) A) = (-2.4 - 1.4 + 0.8 + 1.5) / 4 = -0.375."""
    module = from_config("marft_a", agents=None, base=TINY)
    env = TwoTurnEnv()
    module.build(env)
    torch.manual_seed(0)
    episodes = [eps[0] for eps in play(module.team, env, env.tasks("train"), 1, dependency=module.protocol)]
    items = transitions(episodes)
    ratios = [[1.5, 0.7], [0.5, 1.5]]
    for tr, rs, adv in zip(items, ratios, [2.0, -1.0]):
        with torch.no_grad():
            now = [
                float(module.team.logprobs(i, [c.prompt_ids], [c.completion_ids])[0].sum())
                for i, c in enumerate(tr.actions)
            ]
        for c, lp, r in zip(tr.actions, now, rs):
            c.logprobs = [lp - math.log(r)]
        tr.advantages = torch.tensor([adv, adv])
    loss, entropy, stats = module.actor_loss(
        items, [0, 1], torch.cat([module.agent_advantages(tr, i) for tr in items for i in (0, 1)])
    )
    assert float(loss.detach()) == pytest.approx(-0.375, abs=1e-5)
    assert stats["train/clip_frac"] == pytest.approx(1.0)  # every ratio is outside [0.8, 1.2]
    assert 0 < float(entropy.detach()) <= math.log(2) + 1e-6  # two allowed tokens
    # one agent at a time: agent 1's rows only, (-1.4 + 1.5) / 2
    loss1, _, _ = module.actor_loss(items, [1], torch.cat([module.agent_advantages(tr, 1) for tr in items]))
    assert float(loss1.detach()) == pytest.approx(0.05, abs=1e-5)


def test_huber_value_loss_by_hand():
    values, targets = torch.tensor([0.0, 0.0]), torch.tensor([0.5, 3.0])
    # squared: (0.25 + 9) / 2; Huber delta 1: 2 * (0.125, 1 * (3 - 0.5)) -> (0.25 + 5) / 2
    assert float(value_loss(values, targets)) == pytest.approx(4.625)
    assert float(value_loss(values, targets, huber_delta=1.0)) == pytest.approx(2.625)


# -- the central critic --------------------------------------------------------------------------------
def test_critic_features_ignore_the_agents_adapters_and_only_the_head_trains():
    module = from_config("marft_a", agents=None, base=TINY)
    env = TwoTurnEnv()
    module.build(env)
    team = module.team
    prompt = team.encode(0, env.reset(env.tasks("train")[0]).histories[0])
    before = module.features([prompt])[0]
    logprob_before = team.logprobs(0, [prompt], [[team.choice_ids[0][0].item()]])[0].detach()
    with torch.no_grad():
        for p in team.adapter_parameters(0) + team.adapter_parameters(1):
            p.add_(torch.randn_like(p))
    after = module.features([prompt])[0]
    logprob_after = team.logprobs(0, [prompt], [[team.choice_ids[0][0].item()]])[0].detach()
    assert torch.equal(before, after)
    assert not torch.allclose(logprob_before, logprob_after)  # the change did reach the policy
    assert all(p.requires_grad for i in (0, 1) for p in team.adapter_parameters(i))  # still trainable
    groups = {g["name"]: g["params"] for g in module.param_groups()}
    assert {id(p) for p in groups["critic"]} == {id(p) for p in module.critic.parameters()}
    base_params = {id(p) for p in team.model_of(0).parameters() if "lora_" not in str(p)}
    assert not ({id(p) for p in groups["critic"]} & base_params)
    optimizer = module.configure_optimizers()
    assert sum(len(g["params"]) for g in optimizer.param_groups if g["name"] == "critic") == 6  # 3 linear layers


def test_critic_head_shape_and_zero_start():
    head = CriticHead(64)
    assert [m.out_features for m in head.net if isinstance(m, torch.nn.Linear)] == [1024, 512, 1]
    assert head(torch.randn(5, 64)).tolist() == [0.0] * 5


def test_token_features_sit_where_each_token_is_chosen():
    """Feature j of a response is the hidden state at prompt + first j tokens: a prompt extended by
    the first token gives, at its last position, the response's second feature."""
    team = AgentTeam([AgentSpec(role="a")], TINY)
    model, pad = team.model_of(0), team.tokenizer_of(0).pad_token_id
    prompt, response = [1, 5, 9, 14], [20, 21, 22]
    token_level = base_features(model, pad, [prompt], [response])[0]
    assert token_level.shape[0] == 3
    shifted = base_features(model, pad, [prompt + response[:1], prompt, prompt + response[:2]])
    # other sequence lengths and padding: float32 noise relative to the hidden states' size
    tol = dict(rtol=1e-4, atol=1e-4 * float(token_level.abs().max()))
    assert torch.allclose(token_level[0], shifted[1], **tol)
    assert torch.allclose(token_level[1], shifted[0], **tol)
    assert torch.allclose(token_level[2], shifted[2], **tol)


# -- Flex-MG dependencies ------------------------------------------------------------------------------
class ThreeAgents(Env):
    name = "three"

    def __init__(self, horizon: int = 2) -> None:
        super().__init__(horizon)
        self.roles = tuple(AgentRole(f"r{i}", f"You are agent {i}.", 1, ("A", "B")) for i in range(3))

    def tasks(self, split):
        return [{"id": 0}, {"id": 1}]

    def observe(self, task):
        return [f"Agent {i}: pick A or B." for i in range(3)]

    def score(self, state, actions):
        return Score((0.0,) * 3)


@pytest.mark.parametrize("spec", ["chain", "none", "previous", [[], [], [0]], [[[], [0], [0, 1]], [[], [], [1]]]])
def test_each_agent_sees_exactly_the_actions_d_says(spec):
    env = ThreeAgents()
    team = AgentTeam(
        [AgentSpec(role=r.name, system_prompt=r.system_prompt, choices=["A", "B"]) for r in env.roles], TINY
    )
    dep = Dependency(spec, 3)
    torch.manual_seed(0)
    for eps in play(team, env, env.tasks("train"), 2, dependency=dep):
        for ep in eps:
            for t, (obs, joint) in enumerate(zip(ep.observations, ep.completions)):
                state = ep.state_at(t)
                for i in range(3):
                    seen = [(f"r{p}", joint[p].text) for p in dep.parents(t)[i]]
                    assert obs[i] == fuse(state.histories[i], seen)
                    text = obs[i][-1]["content"]
                    for j in range(3):
                        assert (f"r{j}: " in text) == (j in dep.parents(t)[i])
                    assert joint[i].prompt_ids == team.encode(i, obs[i])


def test_dependency_levels_matrix_and_bad_input():
    dep = Dependency("chain", 3)
    assert dep.levels(0) == [[0], [1], [2]]
    assert dep.matrix(0) == [[0, 1, 1], [0, 0, 1], [0, 0, 0]]  # D[i][j] = 1: j depends on i
    assert Dependency("none", 3).levels(0) == [[0, 1, 2]]
    assert Dependency([[], [], [0, 1]], 3).levels(0) == [[0, 1], [2]]
    per_step = Dependency([[[], [0]], [[], []]], 2)
    assert per_step.parents(0) == [[], [0]] and per_step.parents(5) == [[], []]
    with pytest.raises(UserError, match="valid: chain, none, previous"):
        Dependency("tree", 2)
    with pytest.raises(UserError, match="agent 0 cannot depend on 1"):
        Dependency([[1], []], 2)
    with pytest.raises(UserError, match="expected 3 parent lists"):
        Dependency([[], [0]], 3)


# -- the update ----------------------------------------------------------------------------------------
def adapters(module, i):
    return [p.detach().clone() for p in module.team.adapter_parameters(i)]


def changed(before, module, i):
    return any(not torch.equal(a, b) for a, b in zip(before, module.team.adapter_parameters(i)))


def test_critic_warmup_round_robin_and_early_stop():
    env = TwoTurnEnv()
    module = from_config(
        "marft_a",
        agents=None,
        base=TINY,
        critic_warmup=1,
        agent_schedule="round_robin",
        agent_lr=1e-2,
        value_head={"lr": 1e-2},
    )
    train_steps = []

    original = module.update

    def recording(batch):
        before = [adapters(module, i) for i in range(2)]
        head = [p.detach().clone() for p in module.critic.parameters()]
        out = original(batch)
        train_steps.append(
            (
                [changed(before[i], module, i) for i in range(2)],
                any(not torch.equal(a, b) for a, b in zip(head, module.critic.parameters())),
            )
        )
        return out

    module.update = recording
    train(module, env=env, seed=0, steps=3, batch_size=4)
    assert train_steps == [([False, False], True), ([True, False], True), ([False, True], True)]

    stopper = from_config(
        "marft_a", agents=None, base=TINY, target_kl=1e-9, ppo={"num_epochs": 3, "minibatch_size": 1}, agent_lr=5e-2
    )
    logged = []
    original_stop = stopper.update
    stopper.update = lambda batch: logged.append(original_stop(batch)) or logged[-1]
    train(stopper, env=env, seed=0, rollouts=2, batch_size=4)
    assert all(out["train/early_stop"] == 1.0 for out in logged)
    # one update per rollout (every later minibatch is past KL 1e-9): without the stop, each rollout would give
    # 3 epochs x 8 minibatches of updates
    assert len(logged) == 2 and stopper.global_step == 2


# -- learning through the chain ------------------------------------------------------------------------
class SenderEnv(Env):
    """Agent 1 picks A or B; agent 2 acts after it; the team is paid 1 when agent 1 said A.

    The reward sits on agent 2 (the last of the chain), so agent 1 learns only through the backup
    V(s, a^1) of agent 2's decision point, which the critic can tell apart only if agent 2's
    observation holds agent 1's action: under the chain dependency it does."""

    name = "sender"
    reward_max = 1.0

    def __init__(self) -> None:
        super().__init__(1)
        self.roles = (
            AgentRole("first", "You act first.", 1, ("A", "B")),
            AgentRole("second", "You act second.", 1, ("A", "B")),
        )

    def tasks(self, split):
        return [{"id": 0}]

    def observe(self, task):
        return ["Pick A or B.", "Pick A or B."]

    def score(self, state, actions):
        r = float(actions[0] == "A")
        return Score((r, r))


def test_marft_a_credits_the_first_agent_through_the_chain():
    """lambda = 0, so agent 1's advantage is exactly gamma V(s, a^1) - V(s): 40 rollouts of 8 episodes.

    Seeds 0-4: mean return of the first 5 rollouts 0.25-0.73, of the last 5 0.80-0.90. With
    ``dependency: none`` agent 2's observation lacks a^1 and the same seeds end anywhere in 0.15-0.95
    (agent 1's advantages carry no information about its action), so that run is not asserted."""
    module = from_config(
        "marft_a",
        agents=None,
        base=BaseConfig(name="tiny", device="cpu", seed=0),
        agent_lr=1e-2,
        value_head={"lr": 3e-3},
        ppo={"num_epochs": 2, "gamma": 1.0},
        gae_lambda=0.0,
        entropy_coef=0.0,
    )
    returns, _ = train(module, env=SenderEnv(), seed=0, steps=80, batch_size=8)
    assert statistics.mean(returns[-5:]) > 0.75, returns
