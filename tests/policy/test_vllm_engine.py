"""The vLLM rollout engine, on vLLM's CPU build: runs where ``vllm`` imports (``.venv-vllm``,
made by ``bash scripts/setup.sh --with-vllm``; ``tests/policy/test_engines.py`` runs this file there from the
main environment).

The model is a random 2-layer Llama with vLLM-supported attention heads (head size 32; collab's ``tiny``
has 16, which vLLM's CPU attention does not take) and embeddings of standard deviation 1, so that one
LoRA adapter can force a token: embedding dimension 0 is the same for every token, which makes a
rank-1 LoRA on layer 0's ``v_proj`` add the same vector to every value, hence to every attention output,
and a rank-1 LoRA on ``o_proj`` turns it into a large multiple of token T's embedding (without
dimension 0) in the residual stream; the tied output layer then ranks T first by a margin of about 30
logits. An agent with that adapter says T and nothing else; an agent without it never says T.

vLLM's sampler ranks each sampled token with a ``torch.compile``d function (``batched_count_greater_than``),
which on the CPU recompiles for new batch shapes at seconds each; collab reads the log-probs, never the ranks,
so here it runs eager (:func:`eager_sampler`), in this process and in the runs' processes alike.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from collab.errors import UserError  # noqa: E402
from collab.policy.models import BaseConfig, load_tokenizer  # noqa: E402
from collab.policy.sampling import GenerationRequest  # noqa: E402
from collab.policy.team import AgentSpec, AgentTeam, LoraSpec, SamplingSpec  # noqa: E402
from collab.policy.vllm_engine import VllmEngine, VllmOptions, export_base  # noqa: E402
from collab.policy.vllm_logprobs import logprob_gap  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FORCED = 1234
"""The token the forcing adapter makes its agent say (absent from the chat prompts below)."""


def build_model(folder: Path, forcing: bool) -> str:
    """The test model (see the module docstring). ``forcing``: embeddings of standard deviation 1, tied output
    layer (an adapter can force a token, and the base repeats its input's last token). Otherwise: small
    embeddings whose dimension 0 dominates the residual stream and an untied output layer that reads only
    that dimension for the end token, so that responses are random tokens (every one below 1e-4) ending
    with probability about 0.2 per step."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer("tiny")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=forcing,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            embed = model.get_input_embeddings().weight
            embed.normal_(0.0, 1.0 if forcing else 0.02)
            embed[:, 0] = 3.0 if forcing else 1.0
            if not forcing:
                head = model.get_output_embeddings().weight
                head.normal_(0.0, 0.02)
                head[:, 0] = 0.0
                head[tokenizer.eos_token_id, 0] = 1.2
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module", autouse=True)
def eager_sampler():
    """No ``torch.compile`` (see the module docstring): collab compiles nothing, and the values vLLM returns are the
    same eager."""
    import torch._dynamo

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch._dynamo.config, "disable", True)
        patch.setenv("TORCH_COMPILE_DISABLE", "1")  # read by the runs' processes (fit below)
        yield


@pytest.fixture(scope="session")
def engine_model(tmp_path_factory) -> str:
    return build_model(tmp_path_factory.mktemp("forcing-model"), forcing=True)


@pytest.fixture(scope="session")
def sampling_model(tmp_path_factory) -> str:
    return build_model(tmp_path_factory.mktemp("sampling-model"), forcing=False)


def team_of(model: str, agents: list[AgentSpec] | None = None) -> AgentTeam:
    torch.manual_seed(0)
    specs = agents or [
        AgentSpec(lora=LoraSpec(r=8, alpha=16), sampling=SamplingSpec(max_new_tokens=6, temperature=1.0, top_p=1.0)),
        AgentSpec(lora=LoraSpec(r=8, alpha=16), sampling=SamplingSpec(max_new_tokens=8, temperature=0.7, top_p=0.9)),
    ]
    return AgentTeam(specs, BaseConfig(name=model))


def team_with_engine(model: str):
    team = team_of(model)
    team.engine = VllmEngine(team, VllmOptions(max_model_len=512))
    return team


@pytest.fixture(scope="module")
def team(engine_model):
    """Two agents on the forcing model, with a vLLM engine (one per module: starting one takes seconds)."""
    team = team_with_engine(engine_model)
    yield team
    team.engine.close()


@pytest.fixture(scope="module")
def sampling_team(sampling_model):
    """Two agents on the sampling model, with a vLLM engine."""
    team = team_with_engine(sampling_model)
    yield team
    team.engine.close()


def prompts(team) -> list[list[int]]:
    return [team.encode(0, [{"role": "user", "content": text}]) for text in ("Add 2 and 3.", "Name a colour.")]


def requests(team) -> list[GenerationRequest]:
    a, b = prompts(team)
    return [
        GenerationRequest(0, a, 3),
        GenerationRequest(1, a, 2),
        GenerationRequest(0, b, 1),
        GenerationRequest(1, b, 2),
    ]


def lora(team, agent: int, layer: int, module: str, part: str) -> torch.Tensor:
    name = f"layers.{layer}.self_attn.{module}.{part}.{team.names[agent]}.weight"
    (p,) = [p for n, p in team.model_of(agent).named_parameters() if n.endswith(name)]
    return p


@torch.no_grad()
def set_forcing(team, agent: int, on: bool) -> None:
    """Give ``agent`` the adapter that forces :data:`FORCED` (``on``) or a zero update (B = 0), in place."""
    tag = f".{team.names[agent]}."
    for name, p in team.model_of(agent).named_parameters():
        if "lora_B" in name and tag in name:
            p.zero_()
    if not on:
        return
    embed = team.model_of(agent).get_input_embeddings().weight
    v_a, v_b = lora(team, agent, 0, "v_proj", "lora_A"), lora(team, agent, 0, "v_proj", "lora_B")
    o_a, o_b = lora(team, agent, 0, "o_proj", "lora_A"), lora(team, agent, 0, "o_proj", "lora_B")
    u = torch.zeros(v_b.shape[0])
    u[0] = 1.0
    v_a.zero_()
    v_a[0, 0] = 1.0  # reads embedding dimension 0, the same for every token
    v_b[:, 0] = 10.0 * u
    o_a.zero_()
    o_a[0] = torch.cat([u, u]) / math.sqrt(2)  # both heads share the one key-value head
    target = embed[FORCED].clone()
    target[0] = 0.0
    o_b[:, 0] = 100.0 * target


def flat(outs):
    return [c for out in outs for c in out]


def generate(team, engine: bool, seed: int = 0):
    saved, team.engine = team.engine, (team.engine if engine else None)
    try:
        torch.manual_seed(seed)
        return team.generate(requests(team), max_new_tokens=16)
    finally:
        team.engine = saved


@pytest.mark.parametrize("engine", [False, True], ids=["torch", "vllm"])
def test_both_engines_give_well_formed_completions_whose_logprobs_are_the_training_models(sampling_team, engine):
    team = sampling_team
    reqs = requests(team)
    outs = generate(team, engine)
    tokenizer = team.tokenizer_of(0)
    eos = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    assert [len(out) for out in outs] == [r.n for r in reqs]
    for r, out in zip(reqs, outs):
        limit = team.specs[r.agent].sampling.max_new_tokens
        for c in out:
            assert c.agent == r.agent and c.prompt_ids == r.prompt_ids
            assert 1 <= len(c.completion_ids) <= limit
            assert c.finished == (c.completion_ids[-1] in eos)
            assert not any(t in eos for t in c.completion_ids[:-1])  # generation stops at the end token
            assert c.text == tokenizer.decode(c.completion_ids, skip_special_tokens=True)
            assert len(c.logprobs) == len(c.completion_ids) and all(lp <= 0 for lp in c.logprobs)
    assert any(c.finished for out in outs for c in out)  # the end token (p about 0.2 per step) stops a row
    # the behaviour log-probs are the teacher-forced log-probs of the training model: ratio 1 before an update
    cs = flat(outs)
    with torch.no_grad():
        again = team.logprobs([c.agent for c in cs], [c.prompt_ids for c in cs], [c.completion_ids for c in cs])
    for c, lp in zip(cs, again):
        torch.testing.assert_close(torch.tensor(c.logprobs), lp.float(), rtol=1e-4, atol=1e-4 * lp.abs().max().item())
    if engine:  # vLLM's own log-probs are kept where comparable: agent 1 samples with top-p 0.9
        assert all((c.engine_logprobs is None) == (c.agent == 1) for c in cs)


def test_vllm_sampling_is_repeatable_under_a_seed_and_varies_across_seeds(sampling_team):
    team = sampling_team
    ids = lambda seed: [c.completion_ids for c in flat(generate(team, True, seed))]  # noqa: E731
    first = ids(0)
    assert ids(0) == first
    assert ids(1) != first
    assert len({tuple(x) for x in first}) > 1  # the n samples of one prompt differ


@pytest.mark.parametrize("engine", [False, True], ids=["torch", "vllm"])
def test_a_forcing_adapter_shows_up_only_in_its_agents_rows(team, engine):
    set_forcing(team, 0, False)
    set_forcing(team, 1, True)
    try:
        for c in flat(generate(team, engine)):
            if c.agent == 1:
                assert c.completion_ids == [FORCED] * 8, c.completion_ids
            else:
                assert FORCED not in c.completion_ids
    finally:
        set_forcing(team, 1, False)


@pytest.mark.parametrize("engine", [False, True], ids=["torch", "vllm"])
def test_a_turn_with_a_call_decodes_in_rounds(team, engine, monkeypatch):
    """Tool rounds (collab.tools.turns) through each engine: a stop text, a request's own length, a row prefilled
    again with inserted tokens. Agent 1 says FORCED and nothing else; with FORCED's text as the closing tag, its turn
    is the inserted opening of a calculator call, FORCED (round 0 ends there: a call never closed, whose error is
    inserted as its result), then FORCED again (round 1: a closing tag alone is the answer). collab's engine goes on
    from the KV cache round 0 kept (only the inserted tokens and FORCED are prefilled); vLLM prefills again."""
    import collab.policy.sampling as sampling
    import collab.tools.turns as turns
    from collab.tools import make_tool
    from collab.tools.calls import call_opening
    from collab.tools.team import ToolTeam
    from collab.tools.turns import insertion_ids

    tokenizer = team.tokenizer_of(1)
    monkeypatch.setattr(turns, "CALL_CLOSE", tokenizer.decode([FORCED]))
    calculator = make_tool("calculator")
    tooled = ToolTeam(team, {1: {"calculator": calculator}}, choice={1: "calculator"})
    prompt = prompts(team)[0]
    resumed = []
    resume_prefill = sampling.resume_prefill
    monkeypatch.setattr(
        sampling, "resume_prefill", lambda *a, **k: resumed.append([len(t) for t in a[2]]) or resume_prefill(*a, **k)
    )
    set_forcing(team, 1, True)
    saved, team.engine = team.engine, (team.engine if engine else None)
    try:
        torch.manual_seed(0)
        (c,) = tooled.generate([GenerationRequest(1, prompt, 1)], max_new_tokens=16)[0]
    finally:
        team.engine = saved
        set_forcing(team, 1, False)
    opening = tokenizer(call_opening(calculator), add_special_tokens=False)["input_ids"]
    (use,) = c.tool_calls
    assert use.result == "error: the call was not closed with </tool_call>"
    inserted = insertion_ids(tokenizer, use.result)
    assert resumed == ([] if engine else [[1 + len(inserted)]])  # round 1 prefilled FORCED and the result only
    assert c.completion_ids == opening + [FORCED] + inserted + [FORCED]
    assert c.own == [False] * len(opening) + [True] + [False] * len(inserted) + [True]
    assert len(c.logprobs) == 2 and all(-1e-3 < lp <= 0.0 for lp in c.logprobs)  # the forced token, ~certain


def test_updated_adapters_reach_vllm_before_the_next_rollout(team):
    engine = team.engine
    set_forcing(team, 0, False)
    set_forcing(team, 1, False)
    generate(team, True)
    assert all(FORCED not in c.completion_ids for c in flat(generate(team, True)))
    assert engine.sync(team) == []  # nothing changed: nothing exported

    set_forcing(team, 1, True)  # an in-place change, as an optimizer step makes
    syncs = engine.syncs
    assert engine.sync(team) == [1] and engine.syncs == syncs + 1  # only the changed adapter is exported
    outs = flat(generate(team, True))
    assert all((c.completion_ids == [FORCED] * 8) == (c.agent == 1) for c in outs)

    set_forcing(team, 1, False)
    set_forcing(team, 0, True)
    outs = flat(generate(team, True))  # generate() exports both changed adapters itself
    assert all((c.completion_ids == [FORCED] * 6) == (c.agent == 0) for c in outs)
    assert all(FORCED not in c.completion_ids for c in outs if c.agent == 1)
    set_forcing(team, 0, False)

    # an optimizer step changes an agent's fingerprint; its old adapter id leaves the engine
    optimizer = torch.optim.AdamW(team.adapter_parameters(0), lr=1e-3)
    for p in team.adapter_parameters(0):
        p.grad = torch.ones_like(p)
    engine.sync(team)
    old = engine.synced[0]
    optimizer.step()
    assert engine.sync(team) == [0]
    llm = engine.llms[team.agents[0].base]
    new = engine.synced[0]
    assert old.lora_id not in llm.llm_engine.list_loras() and not old.folder.exists()
    assert new.version == old.version + 1 and new.lora_id in llm.llm_engine.list_loras()


def test_closed_action_vocabularies_become_allowed_tokens(sampling_model):
    whole = SamplingSpec(temperature=1.0, top_p=1.0, top_k=0)  # untruncated: vLLM's log-probs are comparable
    specs = [AgentSpec(choices=["A", "B"], sampling=whole), AgentSpec(choices=[" yes", " no"], sampling=whole)]
    team = team_of(sampling_model, specs)
    engine = team.engine = VllmEngine(team, VllmOptions(max_model_len=512))
    try:
        prompt = prompts(team)[0]
        torch.manual_seed(0)
        outs = team.generate([GenerationRequest(0, prompt, 8), GenerationRequest(1, prompt, 8)])
        for agent, out in enumerate(outs):
            allowed = team.choice_ids[agent].tolist()
            assert all(len(c.completion_ids) == 1 and c.completion_ids[0] in allowed and c.finished for c in out)
            assert len({c.completion_ids[0] for c in out}) == 2  # both actions sampled (8 draws, p about 1/2)
            # the log-probs are under the closed vocabulary: the two actions' probabilities sum to 1
            with torch.no_grad():
                pair = team.logprobs([agent, agent], [prompt, prompt], [[allowed[0]], [allowed[1]]])
            assert math.isclose(sum(math.exp(float(lp[0])) for lp in pair), 1.0, rel_tol=1e-5)
            for c in out:
                assert math.isclose(c.logprobs[0], float(pair[allowed.index(c.completion_ids[0])][0]), rel_tol=1e-4)
                assert (
                    logprob_gap(c.engine_logprobs, c.logprobs) <= AGREEMENT
                )  # vLLM's: also under the closed vocabulary
    finally:
        engine.close()


def test_an_engine_dropped_and_collected_leaves_the_others_working(sampling_team, sampling_model):
    """In-process vLLM engines share vLLM's parallel state; a collected one used to tear it down under the
    rest ("pipeline model parallel group is not initialized")."""
    import gc

    other = team_of(sampling_model)
    other.engine = VllmEngine(other, VllmOptions(max_model_len=512))
    other.engine.close()
    del other
    gc.collect()
    torch.manual_seed(0)
    assert all(out for out in sampling_team.generate(requests(sampling_team), max_new_tokens=4))


def test_export_base_writes_the_training_base_without_adapters(engine_model, tmp_path):
    from transformers import AutoModelForCausalLM

    team = team_of(engine_model)
    set_forcing(team, 0, True)  # adapters must not leak into the exported base
    export_base(team.model_of(0), team.tokenizer_of(0), tmp_path)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path)
    original = AutoModelForCausalLM.from_pretrained(engine_model)
    ids = torch.tensor([prompts(team)[0]])
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, original(ids).logits)


# -- adapter versions and vLLM's log-probs against the trainer's ----------------------------------------------

AGREEMENT = 1e-5
"""Largest :func:`logprob_gap` allowed between vLLM's log-probs and the trainer's (float32 on both sides; measured
in docs/engines.md). Adapters that differ, and each update below, move the log-probs by far more than this."""


@pytest.fixture(scope="module")
def agreement_team(sampling_model):
    """Two agents that sample untruncated (temperatures 1 and 0.7, so vLLM's log-probs are comparable) with
    different random nonzero LoRA B, and a vLLM engine."""
    specs = [
        AgentSpec(lora=LoraSpec(r=8, alpha=16), sampling=SamplingSpec(max_new_tokens=8, temperature=1.0, top_p=1.0)),
        AgentSpec(lora=LoraSpec(r=8, alpha=16), sampling=SamplingSpec(max_new_tokens=8, temperature=0.7, top_p=1.0)),
    ]
    team = team_of(sampling_model, specs)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in (p for agent in range(len(team)) for p in team.adapter_parameters(agent)):
            if p.shape[1] == 8:  # LoRA B: (out, r); zero at init
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    team.engine = VllmEngine(team, VllmOptions(max_model_len=512))
    yield team
    team.engine.close()


def trainer_logprobs(team, completions, agents=None, reference=False) -> list[list[float]]:
    with torch.no_grad():
        lps = team.logprobs(
            agents or [c.agent for c in completions],
            [c.prompt_ids for c in completions],
            [c.completion_ids for c in completions],
            reference=reference,
        )
    return [lp.float().tolist() for lp in lps]


def update(team, completions, lr: float = 0.05) -> None:
    """One AdamW step of every agent on a REINFORCE-like loss (raise the log-probs of its samples)."""
    params = [p for agent in range(len(team)) for p in team.adapter_parameters(agent)]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    lps = team.logprobs(
        [c.agent for c in completions], [c.prompt_ids for c in completions], [c.completion_ids for c in completions]
    )
    (-torch.stack([lp.sum() for lp in lps]).mean()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def test_vllm_logprobs_agree_with_the_trainers_per_agent_after_every_adapter_sync(agreement_team):
    team, engine = agreement_team, agreement_team.engine
    gaps, apart = [], []  # agreement; distances of what a stale or wrong adapter would give
    for version in range(3):  # the initial adapters, then after each of two updates
        torch.manual_seed(version)
        cs = [c for c in flat(team.generate(requests(team), max_new_tokens=8)) if c.completion_ids]
        assert {c.agent for c in cs} == {0, 1}
        assert all(c.adapter_version == version for c in cs)
        assert {a: held.version for a, held in engine.synced.items()} == {0: version, 1: version}
        again = trainer_logprobs(team, cs)  # recomputed here, independently of the engine's rescoring
        base = trainer_logprobs(team, cs, reference=True)
        swapped = trainer_logprobs(team, cs, agents=[1 - c.agent for c in cs])
        for agent in (0, 1):
            mine = [j for j, c in enumerate(cs) if c.agent == agent]
            gap = max(logprob_gap(cs[j].engine_logprobs, again[j]) for j in mine)
            gaps.append(gap)
            assert gap <= AGREEMENT, (version, agent, gap)
            # the test can fail: the base's and the other agent's log-probs of the same tokens are far off
            for other in (base, swapped):
                apart.append(max(logprob_gap(cs[j].engine_logprobs, other[j]) for j in mine))
                assert apart[-1] > 100 * AGREEMENT
        metrics = engine.metrics()
        assert metrics["engine/adapter_version/agent0"] == metrics["engine/adapter_version/agent1"] == version
        assert metrics["engine/logprob_gap"] <= AGREEMENT
        if version < 2:
            update(team, cs)
            moved = trainer_logprobs(team, cs)  # so does an adapter one update old
            for a in (0, 1):
                apart.append(max(logprob_gap(c.logprobs, m) for c, m in zip(cs, moved) if c.agent == a))
                assert apart[-1] > 100 * AGREEMENT
    print(
        f"\nvLLM-trainer log-prob gap per (sync, agent): {', '.join(f'{g:.1e}' for g in gaps)}; "
        f"base, other agent, one update older: {min(apart):.1e} at least"
    )


def test_a_stale_adapter_is_an_error_until_it_is_synced(agreement_team):
    team, engine = agreement_team, agreement_team.engine
    engine.sync(team)
    before = {a: held.version for a, held in engine.synced.items()}
    engine.auto_sync = False
    try:
        with torch.no_grad():
            team.adapter_parameters(0)[0].data.add_(0.1)  # a write the version counters do not see: the norms do
        with pytest.raises(
            RuntimeError, match=f"vLLM holds version {before[0]} of agent0's adapter, but agent0's weights changed"
        ):
            team.generate(requests(team), max_new_tokens=4)
        with pytest.raises(RuntimeError, match="agent0"):  # only agent 0 asked for: still stale
            team.generate([GenerationRequest(0, prompts(team)[0])], max_new_tokens=4)
        outs = team.generate([GenerationRequest(1, prompts(team)[0], 2)], max_new_tokens=4)  # agent 1 is current
        assert all(c.adapter_version == before[1] for c in outs[0])
        assert engine.sync(team) == [0]
        cs = flat(team.generate(requests(team), max_new_tokens=4))
        assert {(c.agent, c.adapter_version) for c in cs} == {(0, before[0] + 1), (1, before[1])}
    finally:
        engine.auto_sync = True


def test_an_adapter_missing_from_vllm_is_an_error_never_the_base(agreement_team):
    team, engine = agreement_team, agreement_team.engine
    engine.sync(team)
    held = engine.synced[1]
    llm = engine.llms[team.agents[1].base].llm_engine
    with pytest.raises(UserError, match="names agent 2; the team's agents are 0-1"):
        team.generate([GenerationRequest(2, prompts(team)[0])], max_new_tokens=4)
    engine.auto_sync = False
    try:
        llm.remove_lora(held.lora_id)  # vLLM lost it behind the engine's back
        with pytest.raises(RuntimeError, match=f"vLLM no longer holds version {held.version} of agent1's adapter"):
            team.generate(requests(team), max_new_tokens=4)
    finally:
        engine.auto_sync = True
    cs = flat(team.generate(requests(team), max_new_tokens=4))  # with auto_sync, reloaded as the next version
    assert {c.adapter_version for c in cs if c.agent == 1} == {held.version + 1}
    assert engine.synced[1].lora_id in llm.list_loras()


def test_rollouts_record_the_adapter_version_that_sampled_them(agreement_team):
    from collab.envs import make_env
    from collab.rollout.episodes import play
    from collab.rollout.experience import decisions, transitions
    from collab.rollout.tree import tree_batch

    team, engine = agreement_team, agreement_team.engine
    env = make_env("writing")
    tasks = env.tasks("train")[:1]
    engine.sync(team)
    versions = {a: held.version for a, held in engine.synced.items()}
    episodes = [ep for eps in play(team, env, tasks, num_samples=2, max_new_tokens=4) for ep in eps]
    recorded = [c.adapter_version for tr in transitions(episodes) for c in tr.actions]
    assert recorded == [versions[0], versions[1]] * 2
    rewards = [torch.zeros(len(ep.steps), env.n_agents) for ep in episodes]
    assert {(d.member, d.adapter_version) for d in decisions(episodes, rewards)} <= set(versions.items())
    with torch.no_grad():
        p = team.adapter_parameters(1)[0]
        p.add_(0.1)  # an update of agent 1: its next rollout is sampled by the next version
    experience = tree_batch(team, env, tasks, k=2, max_new_tokens=4)
    assert {(d.member, d.adapter_version) for d in experience.items} == {(0, versions[0]), (1, versions[1] + 1)}


# -- full agents: their own engine, their trained weights loaded in place ---------------------------------------

GREEDY = SamplingSpec(max_new_tokens=6, temperature=0.0, top_p=1.0)


@pytest.fixture(scope="module")
def full_team(engine_model):
    """Agent 0 trains whole (finetune: full), agent 1 is a LoRA agent on the same base, both greedy; a vLLM engine
    (two: the full agent's own and the base's). The forcing model ties its output layer to the embedding, which
    the CPU build packs separately: an update that moves the embedding must reach the head too."""
    team = team_of(engine_model, [AgentSpec(finetune="full", sampling=GREEDY), AgentSpec(sampling=GREEDY)])
    team.engine = VllmEngine(team, VllmOptions(max_model_len=512))
    yield team
    team.engine.close()


def greedy_tokens(team, engine: bool) -> tuple[list[list[int]], set]:
    """Each agent's greedy response to each prompt, from vLLM or collab's loop, and the versions that sampled them."""
    saved, team.engine = team.engine, (team.engine if engine else None)
    try:
        reqs = [GenerationRequest(agent, p, 1) for p in prompts(team) for agent in (0, 1)]
        cs = flat(team.generate(reqs, max_new_tokens=6))
    finally:
        team.engine = saved
    return [c.completion_ids for c in cs], {(c.agent, c.adapter_version) for c in cs}


def first_token_logprobs(team, prompt: list[int]) -> tuple[dict[int, float], dict[int, float]]:
    """The 20 likeliest first tokens of agent 0 (the full agent) after ``prompt`` with their log-probs, from its vLLM
    engine, and the trainer's log-probs of the same tokens."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    team.engine.sync(team)
    llm = team.engine.llms[team.agents[0].base]
    params = SamplingParams(temperature=1.0, max_tokens=1, logprobs=20, seed=0)
    (out,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
    engine = {t: lp.logprob for t, lp in out.outputs[0].logprobs[0].items()}
    with torch.no_grad():
        logps = team.model_of(0)(torch.tensor([prompt])).logits[0, -1].float().log_softmax(-1)
    return engine, {t: float(logps[t]) for t in engine}


def test_a_full_agents_engine_samples_its_trained_weights_after_each_update(full_team):
    """Greedy tokens, and the first token's log-probs after a prompt whose first blocks vLLM's prefix cache holds
    from before the update (stale blocks, or the CPU build's stale packed copy of the tied head, would show there)."""
    team, engine = full_team, full_team.engine
    long = team.encode(0, [{"role": "user", "content": "Count the words in this sentence. " * 40}])
    assert len(long) > 2 * engine.llms[team.agents[0].base].llm_engine.vllm_config.cache_config.block_size
    before, versions = greedy_tokens(team, True)
    assert before == greedy_tokens(team, False)[0]
    vllm_lp, trainer_lp = first_token_logprobs(team, long)
    assert max(abs(vllm_lp[t] - trainer_lp[t]) for t in vllm_lp) < 1e-3
    assert versions == {(0, 0), (1, 0)} and engine.weight_syncs == 1  # the first rollout loads the weights
    assert FORCED not in before[0] + before[2]
    # a few SGD steps on every weight of agent 0 that make FORCED its greedy token (the tied embedding moves too)
    optimizer = torch.optim.SGD(team.adapter_parameters(0), lr=0.1)
    for _ in range(3):
        lps = team.logprobs([0, 0], prompts(team), [[FORCED] * 3] * 2)
        (-torch.stack([lp.sum() for lp in lps]).mean()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    after, versions = greedy_tokens(team, True)  # the same prompts: their cached prefixes were computed before
    assert after == greedy_tokens(team, False)[0]
    assert after[0] == after[2] == [FORCED] * 6 and after[1::2] == before[1::2]  # agent 1's adapter did not move
    assert versions == {(0, 1), (1, 0)}
    vllm_lp, trainer_lp = first_token_logprobs(team, long)
    assert max(abs(vllm_lp[t] - trainer_lp[t]) for t in vllm_lp) < 1e-3
    metrics = engine.metrics()
    assert metrics["engine/weights_version/agent0"] == 1 and metrics["engine/adapter_version/agent1"] == 0
    assert metrics["engine/weight_syncs"] == 2 and metrics["engine/adapter_syncs"] == 1
    assert engine.sync(team) == []  # nothing changed since: nothing loaded


def test_stale_full_weights_are_an_error_until_they_are_loaded(full_team):
    team, engine = full_team, full_team.engine
    engine.sync(team)
    held = engine.synced[0].version
    engine.auto_sync = False
    try:
        with torch.no_grad():
            team.adapter_parameters(0)[-1].data.mul_(1.5)  # a write the version counters miss: the norms see it
        with pytest.raises(RuntimeError, match=f"vLLM holds version {held} of agent0's weights, but agent0's weights"):
            team.generate([GenerationRequest(0, prompts(team)[0])], max_new_tokens=4)
        assert engine.sync(team) == [0] and engine.synced[0].version == held + 1
        assert greedy_tokens(team, True)[0] == greedy_tokens(team, False)[0]
    finally:
        engine.auto_sync = True


def fit_args(tmp: Path, algo: str, extra: list[str]) -> list[str]:
    return [
        "--algo",
        algo,
        "--model.engine",
        "vllm",
        "--model.engine_options",
        "{max_model_len: 1024}",
        "--trainer.accelerator",
        "cpu",
        "--trainer.logger.init_args.save_dir",
        str(tmp / "runs"),
        *extra,
    ]


def run_folder(tmp: Path, algo: str) -> Path:
    (run,) = (tmp / "runs" / algo).glob("version_*")
    return run


def scalars(run: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


# each agent's callbacks: checkpoints only (the configs' held-out evaluations would dominate the time)
CALLBACKS = json.dumps([{"class_path": "collab.training.callbacks.ModelCheckpoint", "init_args": {"save_last": True}}])


# One process (MARFT-A, in this process, as a notebook calls it) and two (MAGRPO under fsdp, a command: an engine per
# process, gloo, a team of a full agent and a LoRA agent, both sharded by FSDP2 and gathered whole into each process's
# engines at the start and after each update); each run's second rollout follows an update. Top-p 1 in both: vLLM's
# log-probs are compared with the trainer's at every rollout, so a weight loaded wrong shows.
RUNS = {
    "marft_a": [
        "--data.env",
        "math",
        "--data.env_options",
        "{dataset: addition, profile: duo}",
        "--data.batch_size",
        "2",  # top-p 1 (the config's is 0.9): vLLM's log-probs are compared at every rollout
        "--model.agents",
        json.dumps([{"sampling": {"max_new_tokens": 6, "top_p": 1.0}}] * 2),
    ],
    "magrpo_fsdp": [
        "--data.env",
        "matrix",
        "--data.env_options",
        "{}",
        "--data.batch_size",
        "2",
        "--trainer.strategy",
        "fsdp",
        "--trainer.devices",
        "2",
        "--model.agents",  # agent 0 trains whole: its own engine, its weights loaded in place after each update
        json.dumps([{"finetune": "full", "sampling": {"top_p": 1.0}}, {"sampling": {"top_p": 1.0}}]),
    ],
}


def run_argv(case: str, model: str, tmp: Path) -> list[str]:
    extra = ["--model.base.name", model, "--trainer.max_steps", "2", "--trainer.callbacks", CALLBACKS, *RUNS[case]]
    return fit_args(tmp, case.removesuffix("_fsdp"), extra)


@pytest.fixture(scope="module", autouse=True)
def fsdp_run(eager_sampler, sampling_model, tmp_path_factory):
    """The fsdp run, started as a command when the module starts (its two processes wait on each other's
    collectives about half of the time, which the module's other tests fill) and awaited by its test; its
    output goes to files (a pipe nobody reads until the end could fill and stop it)."""
    tmp = tmp_path_factory.mktemp("fsdp-run")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}"}
    command = [sys.executable, "-m", "collab.fit", *run_argv("magrpo_fsdp", sampling_model, tmp)]
    with open(tmp / "stdout.txt", "w") as out, open(tmp / "stderr.txt", "w") as err:
        # its own process group: Lightning starts rank 1 as a child, which killing the launcher alone would orphan
        proc = subprocess.Popen(command, cwd=tmp, env=env, stdout=out, stderr=err, start_new_session=True)
    yield tmp, proc
    if proc.poll() is None:  # its test did not wait for it (deselected)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("case", sorted(RUNS))
def test_two_agent_runs_train_with_the_vllm_engine(case, fsdp_run, sampling_model, tmp_path, monkeypatch):
    if case == "magrpo_fsdp":
        tmp, proc = fsdp_run
        assert proc.wait(timeout=900) == 0, (tmp / "stderr.txt").read_text()[-3000:]
    else:
        from collab.fit import main

        tmp = tmp_path
        monkeypatch.chdir(tmp)
        assert main(run_argv(case, sampling_model, tmp)) == 0
    algo = case.removesuffix("_fsdp")
    run = run_folder(tmp, algo)
    assert (run / "checkpoints" / "last.ckpt").is_file()
    s = scalars(run)
    assert len(s["reward/return"]) >= 2
    if algo == "marft_a":
        # the first rollout exported both adapters; each later rollout re-exported those the updates changed
        assert s["engine/adapter_syncs"][0] == 2
        assert s["engine/adapter_syncs"][-1] > 2
        # each agent's adapter version: 0 at the first rollout, bumped by the syncs after updates
        assert s["engine/adapter_version/agent0"][0] == s["engine/adapter_version/agent1"][0] == 0
        assert s["engine/adapter_version/agent0"][-1] + s["engine/adapter_version/agent1"][-1] >= 1
    else:  # the full agent's weights: version 0 at the first rollout, loaded again after the update; the adapter too
        assert s["engine/weights_version/agent0"] == [0.0, 1.0] and s["engine/weight_syncs"] == [1.0, 2.0]
        assert s["engine/adapter_version/agent1"] == [0.0, 1.0] and s["engine/adapter_syncs"] == [1.0, 2.0]
        assert "engine/adapter_version/agent0" not in s
    # untruncated agents: vLLM's log-probs agreed with the trainer's at every rollout (under fsdp: the weights
    # gathered from the shards are the trained ones)
    assert len(s["engine/logprob_gap"]) == len(s["reward/return"]) and max(s["engine/logprob_gap"]) <= AGREEMENT


def test_prompts_beyond_one_scheduler_step_are_sampled_whole(sampling_team):
    """More prompt tokens than vLLM schedules in one step (4096 on the CPU): with chunked prefill a seeded
    request's partial prefill rewinds its generator's offset, which CPU generators do not have
    (``RuntimeError: CPU Generator does not use offset``); the engine turns chunked prefill off on the CPU."""
    team = sampling_team
    prompt = team.encode(0, [{"role": "user", "content": "Count the words in this sentence. " * 12}])
    assert len(prompt) * 64 > 4096
    torch.manual_seed(0)
    outs = team.generate([GenerationRequest(i % 2, prompt, 1) for i in range(64)], max_new_tokens=4)
    assert [len(out) for out in outs] == [1] * 64 and all(1 <= len(out[0].completion_ids) <= 8 for out in outs)
