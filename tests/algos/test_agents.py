"""A team's agents from the environment's roles (``collab.algos.agents.resolve_agents``): the team's size
follows the environment, the roles past the last configured agent repeating its settings, and what an agent leaves
out is ``model.agent_defaults``' (conf/base.yaml's when no run's block is given)."""

from dataclasses import asdict

import pytest

from collab.algos.agents import resolve_agents
from collab.envs import make_env
from collab.errors import UserError
from collab.policy.specs import AgentDefaults, AgentSpec, LoraSpec, SamplingSpec, packaged_defaults


def two_agents() -> list[AgentSpec]:
    return [
        AgentSpec(lr=1e-4, sampling=SamplingSpec(temperature=0.7, max_new_tokens=32)),
        AgentSpec(
            role="critic",
            system_prompt="Check the answer.",
            finetune="full",
            lr=3e-6,
            lora=LoraSpec(r=4, alpha=8),
            sampling=SamplingSpec(temperature=0.5, top_p=0.8, max_new_tokens=24),
        ),
    ]


def test_a_debate_of_four_under_a_config_of_two_repeats_the_last_agents_settings_in_its_own_roles():
    env = make_env("debate", agents=4)
    given = two_agents()
    specs = resolve_agents(env, given)
    names = [r.name for r in env.roles]
    assert [s.role for s in specs] == [names[0], "critic", names[2], names[3]]
    assert specs[0].lr == 1e-4 and specs[0].system_prompt == env.roles[0].system_prompt
    # the given agents keep what they set (agent 1's role and prompt included)
    assert specs[1].role == "critic" and specs[1].system_prompt == "Check the answer."
    block = packaged_defaults()  # what the agents leave out (dropout, target_modules, top_k)
    for i in (2, 3):
        assert (specs[i].finetune, specs[i].lr, specs[i].lora, specs[i].sampling) == (
            "full",
            3e-6,
            LoraSpec(**{**asdict(block.lora), "r": 4, "alpha": 8}),
            SamplingSpec(**{**asdict(block.sampling), "temperature": 0.5, "top_p": 0.8, "max_new_tokens": 24}),
        )
        # and their own role's name and prompt, not the copied agent's
        assert (specs[i].role, specs[i].system_prompt) == (env.roles[i].name, env.roles[i].system_prompt)
    assert specs[2].sampling is not specs[1].sampling and specs[2].lora is not specs[3].lora  # copies
    assert given == two_agents()  # the config is not changed


def test_the_math_trio_grows_its_verifier_from_a_duo_config_and_too_many_agents_are_refused():
    trio = make_env("math", profile="trio")
    duo = [AgentSpec(lr=1e-4), AgentSpec(lr=3e-4, sampling=SamplingSpec(max_new_tokens=24))]
    specs = resolve_agents(trio, duo)
    assert [s.role for s in specs] == ["reasoner", "actor", "verifier"]
    assert (specs[2].lr, specs[2].sampling.max_new_tokens) == (3e-4, 24)
    assert specs[2].system_prompt == trio.roles[2].system_prompt != specs[1].system_prompt
    assert specs[2].sampling.temperature == packaged_defaults().sampling.temperature
    # no agents given: every role is the block (a run's own, else conf/base.yaml's), with the role's length
    assert [s.lr for s in resolve_agents(trio, None)] == [None, None, None]
    block = AgentDefaults(
        finetune="full", sampling=SamplingSpec(temperature=1.0, top_p=1.0, top_k=0), lora=LoraSpec(r=4)
    )
    for spec, role in zip(resolve_agents(trio, None, block), trio.roles):
        assert (spec.finetune, spec.lora.r, spec.sampling.temperature) == ("full", 4, 1.0)
        assert spec.sampling.max_new_tokens == role.max_new_tokens
    with pytest.raises(UserError, match=r"^2 agents configured but env 'math' has 1 role \(actor\); give at most 1"):
        resolve_agents(make_env("math", profile="solo"), duo)
