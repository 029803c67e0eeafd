"""LLM critics (CoLLM, Sections 3.2 and 4.1, Appendix B, E.3): what each critic reads, parameter
sharing, zero-initialised values, where a critic loss's gradients go, and how many critics there are.
"""

from __future__ import annotations

import pytest
import torch

from collab.algos.llm_critics import Critics, global_info, packaged_spec
from collab.envs.base import Env, EnvState
from collab.errors import UserError
from collab.objectives import value_loss
from collab.policy.models import BaseConfig, encode_chat
from collab.policy.team import AgentSpec, AgentTeam
from tests.support import TwoTurnEnv

TINY = BaseConfig(name="tiny", device="cpu")


def make_team(env: Env, seed: int = 0) -> AgentTeam:
    torch.manual_seed(seed)  # peft draws the LoRA A matrices from the global generator
    return AgentTeam(
        [AgentSpec(role=r.name, system_prompt=r.system_prompt, choices=list(r.choices)) for r in env.roles], TINY
    )


def make_critics(env: Env, mode: str, seed: int = 0, **spec) -> Critics:
    """Critics on a fresh team (a team holds one set of critic adapters)."""
    team = make_team(env, seed)
    torch.manual_seed(seed)
    return Critics(team, env, mode, packaged_spec(**{"context": None, **spec}))  # the whole input


def states(env: Env, actions=("A", "B")) -> tuple[EnvState, EnvState]:
    """h_0 and h_1 after the joint action ``actions`` (agent 1 answers A, agent 2 answers B)."""
    s0 = env.reset(env.tasks("train")[0])
    return s0, env.step(s0, list(actions)).state


def text_of(chat) -> str:
    return "\n".join(m["content"] for m in chat)


M0 = "You are at turn = 0 over a 2-turn episode.\nYour last-turn reward is none / 1."
M1 = "You are at turn = 1 over a 2-turn episode.\nYour last-turn reward is 0.500 / 1."  # one A of two


# -- inputs ------------------------------------------------------------------------------------------
def test_global_information_before_and_after_a_turn():
    env = TwoTurnEnv()
    s0, s1 = states(env)
    assert global_info(s0, env.horizon, env.reward_max) == M0
    assert global_info(s1, env.horizon, env.reward_max) == M1
    assert global_info(s1, 3, None).endswith(
        "turn = 1 over a 3-turn episode.\nYour last-turn reward is 0.500 / unknown."
    )


def test_centralized_input_holds_every_agents_history_and_the_global_information():
    env = TwoTurnEnv()
    critics = make_critics(env, "centralized")
    s0, s1 = states(env)
    [(j0, chat0)] = critics.inputs(s0)
    [(j1, chat1)] = critics.inputs(s1)
    assert j0 == j1 == 0
    assert chat0[0]["role"] == "system" and "critic" in chat0[0]["content"]
    text = chat0[-1]["content"]
    assert "Player 1: pick A or B." in text and "Player 2: pick A or B." in text
    assert text.endswith(M0)
    # after a turn: every agent's prompt, response and feedback, each in its own agent's block, then m_1
    text = chat1[-1]["content"]
    assert text.endswith(M1)
    first, second = text[: -len(M1)].split("## Agent 2 (p2)")
    assert first.startswith("## Agent 1 (p1)")
    assert "Player 1: pick A or B." in first and "[Response]\nA" in first and "Player 1, turn 1 is over" in first
    assert "Player 2: pick A or B." in second and "[Response]\nB" in second and "Player 2, turn 1 is over" in second
    assert "Player 2" not in first and "Player 1" not in second
    assert "You are player" not in text  # the agents' system prompts are left out
    # without global information: the same histories, no m_t
    bare = make_critics(env, "centralized", global_info=False).inputs(s1)[0][1][-1]["content"]
    assert bare == text[: -len(M1)].rstrip("\n")


def test_decentralized_input_holds_only_the_agents_own_history():
    env = TwoTurnEnv()
    critics = make_critics(env, "decentralized")
    s0, s1 = states(env)
    pairs = critics.inputs(s1)
    assert [j for j, _ in pairs] == [0, 1]
    for i, chat in pairs:
        own, other = f"Player {i + 1}", f"Player {2 - i}"
        history = s1.histories[i]
        # the agent's chat as it sees it (system prompt, prompt, its response, feedback) with m_t appended
        assert [m["role"] for m in chat] == [m["role"] for m in history] == ["system", "user", "assistant", "user"]
        assert list(chat[:-1]) == list(history[:-1])
        assert chat[-1]["content"] == history[-1]["content"] + "\n\n" + M1
        assert chat[2]["content"] == ("A", "B")[i]
        assert own in text_of(chat) and other not in text_of(chat)
    for i, chat in critics.inputs(s0):
        assert chat[-1]["content"] == f"Player {i + 1}: pick A or B.\n\n" + M0


def test_q_critic_input_holds_the_actions():
    env = TwoTurnEnv()
    s0, s1 = states(env)
    central = make_critics(env, "centralized", kind="q")
    text = central.inputs(s1, ["B", "A"])[0][1][-1]["content"]
    assert "## Agent 1 (p1) now responds\nB" in text and "## Agent 2 (p2) now responds\nA" in text
    assert text.endswith(M1)
    decentral = make_critics(env, "decentralized", kind="q")
    for i, chat in decentral.inputs(s1, ["B", "A"]):
        assert chat[-1]["content"] == s1.histories[i][-1]["content"] + f"\n\n[Your response]\n{'BA'[i]}\n\n" + M1
    # a V-critic ignores actions
    v = make_critics(env, "centralized")
    assert v.inputs(s1, ["B", "A"]) == v.inputs(s1)
    assert central.state_values([s0, s1], [["A", "A"], ["B", "A"]]).shape == (2, 1)


# -- structure and values ------------------------------------------------------------------------------
def test_one_centralized_critic_or_one_per_agent_valued_zero_at_initialisation():
    env = TwoTurnEnv()
    s0, s1 = states(env)
    central, decentral = make_critics(env, "centralized"), make_critics(env, "decentralized")
    assert len(central) == 1 and central.names == ["critic0"]
    assert len(decentral) == 2 and decentral.names == ["critic0", "critic1"]
    for critics in (central, decentral):
        values = critics.state_values([s0, s1, s0])
        assert values.shape == (3, len(critics)) and values.dtype == torch.float32
        assert torch.equal(values, torch.zeros_like(values))  # zero-initialised head
        assert values.requires_grad
    # the critic adapters live in the team's base model next to the agents'
    peft = central.team[0].models["base0"]
    assert set(peft.peft_config) == {"agent0", "agent1", "critic0"}


def test_value_head_reads_the_last_token_and_inputs_are_distinguished():
    """With a non-zero head, different histories get different values; a batch equals single calls
    (left padding does not leak into the last token's hidden state)."""
    env = TwoTurnEnv()
    s0, s1 = states(env)
    critics = make_critics(env, "decentralized")
    with torch.no_grad():
        for head in critics.heads:
            torch.nn.init.normal_(head.linear.weight, generator=torch.Generator().manual_seed(3))
        batch = critics.state_values([s0, s1])
        single = torch.cat([critics.state_values([s]) for s in (s0, s1)])
    # a padded batch vs single rows: float32 noise relative to the values' size
    assert torch.allclose(batch, single, rtol=1e-4, atol=1e-4 * float(single.abs().max()))
    assert not torch.allclose(batch[0], batch[1])


def test_shared_agent_adapter_reads_through_agent_i_and_trains_only_its_head():
    env = TwoTurnEnv()
    s0, s1 = states(env)
    critics = make_critics(env, "decentralized", share_agent_adapter=True)
    team = critics.team[0]
    assert critics.names == team.names == ["agent0", "agent1"]
    assert set(team.models["base0"].peft_config) == {"agent0", "agent1"}  # no critic adapter
    for j in range(2):
        assert [id(p) for p in critics.parameters_of(j)] == [id(p) for p in critics.heads[j].parameters()]
    # critic i's value moves with agent i's adapter, and only with it
    with torch.no_grad():
        for head in critics.heads:
            head.linear.weight.fill_(0.1)
        before = critics.state_values([s0, s1])
        for name, p in team.model_of(0).named_parameters():
            if "lora_B" in name and ".agent0." in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
        after = critics.state_values([s0, s1])
    assert not torch.allclose(before[:, 0], after[:, 0])
    assert torch.equal(before[:, 1], after[:, 1])


def test_shared_agent_adapter_is_refused_for_a_centralized_critic():
    env = TwoTurnEnv()
    with pytest.raises(UserError, match="decentralized"):
        make_critics(env, "centralized", share_agent_adapter=True)
    with pytest.raises(UserError, match="critic mode"):
        make_critics(env, "joint")
    with pytest.raises(UserError, match="critic kind"):
        make_critics(env, "centralized", kind="advantage")


@pytest.mark.parametrize("mode", ["centralized", "decentralized"])
def test_critic_loss_gradients_reach_the_critic_adapter_and_head_not_the_agents(mode):
    env = TwoTurnEnv()
    s0, s1 = states(env)
    critics = make_critics(env, mode)
    team = critics.team[0]
    with torch.no_grad():  # a non-zero head, else nothing flows below it
        for head in critics.heads:
            torch.nn.init.normal_(head.linear.weight, generator=torch.Generator().manual_seed(2))
    values = critics.state_values([s0, s1])
    targets = torch.ones_like(values)
    if mode == "decentralized":  # critic 0's loss only
        values, targets = values[:, :1], targets[:, :1]
    value_loss(values, targets).backward()

    def moved(params):
        return any(p.grad is not None and p.grad.abs().sum() > 0 for p in params)

    own = critics.parameters_of(0)
    lora = [p for n, p in team.models["base0"].named_parameters() if ".critic0." in n]
    assert lora and all(any(p is q for q in own) for p in lora)  # the adapter is critic 0's to train
    assert moved(critics.heads[0].parameters())
    assert moved([p for n, p in team.models["base0"].named_parameters() if ".critic0." in n and "lora_B" in n])
    for i in range(len(team)):
        assert not moved(team.adapter_parameters(i)), f"agent {i} got a critic gradient"
    if mode == "decentralized":
        assert not moved(critics.parameters_of(1))
    # the critics' parameters and the agents' are disjoint sets
    agents = {id(p) for i in range(len(team)) for p in team.adapter_parameters(i)}
    assert not agents & {id(p) for j in range(len(critics)) for p in critics.parameters_of(j)}


def test_global_info_shows_each_critic_its_reward_under_per_agent_rewards():
    from collab.envs.base import EnvState

    state = EnvState(task={}, histories=((), ()), turn=1, memory={"last_reward": 1.0, "last_rewards": (1.0, 3.0)})
    assert global_info(state, 2, 6.0).endswith("reward is 2.000 / 6.")  # centralized: the team mean
    assert global_info(state, 2, 6.0, agent=0).endswith("reward is 1.000 / 6.")  # decentralized critic 0
    assert global_info(state, 2, 6.0, agent=1).endswith("reward is 3.000 / 6.")  # decentralized critic 1


@pytest.mark.parametrize("finetune", [["full", "lora"], ["full", "full"]])
def test_critics_of_full_agents_read_the_untrained_base(finetune):
    """Decentralized critics of a team with full-parameter agents: critic i's adapter lies on agent i's untrained base
    (the shared ``PeftModel`` when a LoRA agent has one, else one copy of the base of the critics' own for both), so
    changing a full agent's weights leaves every critic's value as it was, and a critic's value equals its adapter
    and head on that base computed here by hand."""
    env = TwoTurnEnv()
    s0, s1 = states(env)
    torch.manual_seed(0)
    team = AgentTeam(
        [
            AgentSpec(role=r.name, system_prompt=r.system_prompt, choices=list(r.choices), finetune=f)
            for r, f in zip(env.roles, finetune)
        ],
        TINY,
    )
    critics = Critics(team, env, "decentralized", packaged_spec(context=None))
    shared = finetune[1] == "lora"
    assert critics.keys == (["base0", "base0"] if shared else ["critic_full0", "critic_full0"])
    assert list(critics.own) == ([] if shared else ["critic_full0"]) and critics.model(0) is critics.model(1)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in [p for j in range(2) for p in critics.parameters_of(j)]:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        before = critics.state_values([s0, s1])
        team.model_of(0).get_input_embeddings().weight.mul_(2.0)  # the full agent trained
        after = critics.state_values([s0, s1])
    assert torch.equal(before, after)
    model, tokenizer = critics.model(1), critics.tokenizer(1)
    ((_, chat),) = critics.inputs(s1, critic=1)
    with torch.no_grad():
        model.set_adapter("critic1")
        model.eval()
        hidden = model(input_ids=torch.tensor([encode_chat(tokenizer, chat)]), output_hidden_states=True).hidden_states
        expected = critics.heads[1](hidden[-1][0, -1])
    assert float(after[1, 1]) == pytest.approx(float(expected), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("mode", ["centralized", "decentralized"])
def test_a_critic_on_a_base_that_lora_agents_hold_joins_their_model(mode):
    """``critic_spec.base`` naming the model LoRA agents already hold (CoLLM's HouseBuild critic is its Qwen3-4B
    agent's model) puts the critics' adapters on that ``PeftModel``: no second copy of the base (8 GB for a 4B model
    in bfloat16). A team without a LoRA agent on that base gives the critics one copy of their own, as before."""
    env = TwoTurnEnv()
    critics = make_critics(env, mode, base="tiny")
    n = 1 if mode == "centralized" else 2
    assert critics.keys == ["base0"] * n and list(critics.own) == []
    assert all(critics.model(j) is critics.team[0].model_of(0) for j in range(n))
    assert torch.isfinite(critics.state_values(list(states(env)))).all()
    torch.manual_seed(0)
    specs = [AgentSpec(role=r.name, system_prompt=r.system_prompt, choices=list(r.choices)) for r in env.roles]
    full = AgentTeam([AgentSpec(**{**vars(s), "finetune": "full"}) for s in specs], TINY)
    alone = Critics(full, env, mode, packaged_spec(base="tiny", context=None))
    assert list(alone.own) == ["critic_base"] and alone.keys == ["critic_base"] * n
