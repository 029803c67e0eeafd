"""AgentTeam on the ``tiny`` base: behaviour vs teacher-forced log-probs, mixed-adapter batches,
training touches only adapters, the reference policy, adapter persistence, QLoRA, shared/heterogeneous bases.
"""

from __future__ import annotations

import pytest
import torch

from collab.errors import UserError
from collab.policy.models import BaseConfig
from collab.policy.sampling import GenerationRequest
from collab.policy.team import AgentSpec, AgentTeam, SamplingSpec

TINY = BaseConfig(name="tiny", device="cpu")
TOL = 1e-4
# Log-probs of two code paths (cached decoding vs teacher forcing, a batch vs one row) differ by float32 noise
# relative to their size (~1e-7 of it; a sequence's sum grows with its length): RTOL keeps the check
# relative, TOL is the floor for values near zero.
RTOL = 1e-5


# -- helpers -------------------------------------------------------------------------------------------
def make_team(*temperatures: float, base: BaseConfig = TINY, seed: int = 0, **spec_kwargs) -> AgentTeam:
    torch.manual_seed(seed)  # peft draws the LoRA A matrices from the global generator
    agents = [AgentSpec(sampling=SamplingSpec(temperature=t), **spec_kwargs) for t in temperatures]
    return AgentTeam(agents, base)


def prompt(team: AgentTeam, agent: int, text: str) -> list[int]:
    return team.encode(agent, [{"role": "user", "content": text}])


def perturb_lora_b(team: AgentTeam, seed: int = 1, std: float = 0.2) -> None:
    """Give every agent's LoRA B (zero at init) distinct random values, so the adapters differ."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for i in range(len(team)):
            tag = f".{team.names[i]}."
            for name, p in team.model_of(i).named_parameters():
                if "lora_B" in name and tag in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)


def lora_b_params(team: AgentTeam, agent: int) -> list[torch.nn.Parameter]:
    tag = f".{team.names[agent]}."
    return [p for n, p in team.model_of(agent).named_parameters() if "lora_B" in n and tag in n]


def base_state(team: AgentTeam) -> dict[str, torch.Tensor]:
    return {
        f"{key}/{n}": t.detach().clone()
        for key, model in team.models.items()
        for n, t in model.state_dict().items()
        if "lora_" not in n
    }


def completions_of(outputs) -> list:
    return [c for group in outputs for c in group]


def sequence_logprobs(team: AgentTeam, completions, reference: bool = False) -> list[torch.Tensor]:
    with torch.no_grad():
        return team.logprobs(
            [c.agent for c in completions],
            [c.prompt_ids for c in completions],
            [c.completion_ids for c in completions],
            reference=reference,
        )


# -- behaviour log-probs = teacher-forced log-probs ------------------------------------------------------
def test_teacher_forced_logprobs_match_behaviour_logprobs():
    team = make_team(0.7, 1.0)
    perturb_lora_b(team)
    torch.manual_seed(0)
    requests = [
        GenerationRequest(0, prompt(team, 0, "Write a haiku about rain."), n=2),
        GenerationRequest(1, prompt(team, 1, "Edit this: the cat sat."), n=3),
    ]
    outputs = team.generate(requests, max_new_tokens=6)
    assert [len(g) for g in outputs] == [2, 3]
    comps = completions_of(outputs)
    assert [c.agent for c in comps] == [0, 0, 1, 1, 1]
    lps = sequence_logprobs(team, comps)
    for c, lp in zip(comps, lps):
        assert 0 < len(c.completion_ids) <= 6
        assert len(c.logprobs) == len(c.completion_ids) == lp.shape[0]
        assert lp.sum().item() == pytest.approx(c.logprob, rel=RTOL, abs=TOL)
        torch.testing.assert_close(lp.double(), torch.tensor(c.logprobs, dtype=torch.double), atol=TOL, rtol=RTOL)
    # one agent at a time gives the same numbers as the mixed batch
    for c in comps:
        (lp,) = sequence_logprobs(team, [c])
        assert lp.sum().item() == pytest.approx(c.logprob, rel=RTOL, abs=TOL)


def test_temperature_enters_the_logprobs():
    team = make_team(0.7, 1.0)
    p = prompt(team, 0, "Hello")
    cont = [11, 12, 13]
    with torch.no_grad():
        cold, warm = team.logprobs([0, 1], [p, p], [cont, cont])
    # B is zero: both agents are the base model, seen at different temperatures
    assert not torch.allclose(cold, warm)


def test_closed_action_vocabulary():
    team = make_team(0.7, 1.0, choices=["A", "B"])
    ids = set(team.choice_ids[0].tolist())
    assert len(ids) == 2
    perturb_lora_b(team)
    torch.manual_seed(0)
    p = prompt(team, 0, "Answer A or B.")
    outputs = team.generate([GenerationRequest(0, p, n=8), GenerationRequest(1, p, n=8)], max_new_tokens=20)
    comps = completions_of(outputs)
    for c in comps:
        assert len(c.completion_ids) == 1
        assert c.completion_ids[0] in ids
        assert c.finished
        assert c.logprob <= 0
    lps = sequence_logprobs(team, comps)
    for c, lp in zip(comps, lps):
        assert lp.sum().item() == pytest.approx(c.logprob, rel=RTOL, abs=TOL)
    # the restricted policy is a distribution over the two choices
    with torch.no_grad():
        a, b = team.logprobs([0, 0], [p, p], [[int(team.choice_ids[0][0])], [int(team.choice_ids[0][1])]])
    assert (a.exp() + b.exp()).item() == pytest.approx(1.0, abs=1e-5)


# -- mixed-adapter batches -------------------------------------------------------------------------------
def test_mixed_adapter_batch_equals_each_adapter_alone():
    team = make_team(0.0, 0.0)
    perturb_lora_b(team)
    p0 = prompt(team, 0, "Write a short story about a lighthouse keeper.")
    p1 = prompt(team, 1, "Hi")  # a different length: the batch is left-padded
    assert len(p0) != len(p1)
    r0, r1 = GenerationRequest(0, p0, n=2), GenerationRequest(1, p1, n=1)
    together = team.generate([r0, r1], max_new_tokens=8)
    alone0 = team.generate([r0], max_new_tokens=8)[0]
    alone1 = team.generate([r1], max_new_tokens=8)[0]
    for mixed, single in ((together[0], alone0), (together[1], alone1)):
        for m in mixed:
            assert m.completion_ids == single[0].completion_ids
            assert m.logprobs == pytest.approx(single[0].logprobs, rel=RTOL, abs=TOL)
    # the adapters really differ: the same prompt gives the two agents different greedy outputs
    same = team.generate([GenerationRequest(0, p0), GenerationRequest(1, p0)], max_new_tokens=8)
    assert same[0][0].completion_ids == alone0[0].completion_ids
    assert same[0][0].completion_ids != same[1][0].completion_ids


def test_finished_rows_leave_the_batch_and_the_others_sample_as_if_they_were_there():
    """Agent 0 stops at 3 tokens, agent 1 runs to 10 in the same batch: from the 4th step on, only
    agent 1's rows are decoded (the model sees 3 rows, not 6: finished rows are not decoded on as
    padding until the last row ends), and they sample exactly the tokens they
    sample when agent 0 also runs to 10 (same seed: each row keeps its place's random draws)."""

    def run(limit0: int):
        team = make_team(1.0, 1.0)
        team.specs[0].sampling.max_new_tokens, team.specs[1].sampling.max_new_tokens = limit0, 10
        team.specs[0].sampling.top_p = team.specs[1].sampling.top_p = 0.9
        perturb_lora_b(team)
        heights = []
        hook = (
            team.model_of(0)
            .get_input_embeddings()
            .register_forward_hook(lambda module, args, out: heights.append(tuple(args[0].shape)))
        )
        torch.manual_seed(7)
        out = team.generate(
            [
                GenerationRequest(0, prompt(team, 0, "Count to ten."), n=3),
                GenerationRequest(1, prompt(team, 1, "Name ten birds."), n=3),
            ]
        )
        hook.remove()
        return out, [h[0] for h in heights if h[1] == 1]  # the decoding steps' batch heights

    short, steps_short = run(3)
    long, steps_long = run(10)
    assert all(len(c.completion_ids) == 10 for c in long[1]), "no row may end early for this comparison"
    assert [len(c.completion_ids) for c in short[0]] == [3, 3, 3]
    # 9 steps after the prefill: tokens 2 and 3 with all 6 rows, tokens 4-10 with agent 1's 3
    assert steps_short == [6, 6] + [3] * 7 and steps_long == [6] * 9
    for a, b in zip(short[1], long[1]):
        assert a.completion_ids == b.completion_ids
        assert a.logprobs == pytest.approx(b.logprobs, rel=RTOL, abs=TOL)
    assert len({tuple(c.completion_ids) for c in long[1]}) == 3  # sampled, not one greedy answer
    # the finished rows' own responses are the first 3 tokens of their 10-token runs
    for a, b in zip(short[0], long[0]):
        assert a.completion_ids == b.completion_ids[:3]


# -- decoding in parts (--model.decode_memory_gb) --------------------------------------------------------
def test_cache_bytes_per_token_by_hand():
    """The tiny Llama: 2 layers x 2 key/value heads x 16 dimensions (64 / 4 heads), keys and values, float32."""
    team = make_team(1.0)
    assert team.agents[0].base.cache_bytes_per_token() == 2 * 2 * 16 * 2 * 4


def test_decoding_in_parts_fits_the_budget_and_gives_the_one_batch_tokens(monkeypatch, capsys):
    """Six requests of two agents (histories sharing each agent's opening, n = 2, 5 new tokens) in a budget of
    6 samples of the longest prompt: every decoding batch's KV cache (samples x (longest prompt + 5) tokens x
    512 bytes) fits, each request's samples stay together and each agent's prompts are decoded together
    (ordered by agent and prompt), and greedy decoding gives every request the tokens and log-probs it gets
    in one batch; the first split prints one line."""
    import collab.policy.team as team_module

    team = make_team(0.0, 0.0)
    perturb_lora_b(team)
    head = [prompt(team, a, f"Agent {a}: build the house of the plan, one command a line.") for a in (0, 1)]
    tails = [
        prompt(team, 0, text)[-n:] for text, n in (("Red roof.", 4), ("A wide door and two windows.", 9), ("Stone.", 2))
    ]
    requests = [GenerationRequest(a, head[a] + tail, 2) for tail in tails for a in (0, 1)]  # agents interleaved
    one = team.generate(requests, max_new_tokens=5)

    batches = []
    decode = team_module.decode

    def recording(model, tokenizer, rows, adapters, settings, *stop):
        batches.append(rows)
        return decode(model, tokenizer, rows, adapters, settings, *stop)

    monkeypatch.setattr(team_module, "decode", recording)
    longest = max(len(r.prompt_ids) for r in requests) + 5
    team.decode_memory = 6 * longest * 512
    parts = team.generate(requests, max_new_tokens=5)
    team.generate(requests, max_new_tokens=5)
    assert len(batches) == 2 * 2  # 12 samples in parts of at most 6: two parts a call
    for rows in batches:
        samples, width = sum(r.n for r in rows), max(len(r.prompt_ids) for r in rows) + 5
        assert samples * width * 512 <= team.decode_memory
        assert len({r.agent for r in rows}) == 1  # one agent's prompts a part: their shared opening prefilled once
    for request, a, b in zip(requests, one, parts):
        assert [c.prompt_ids for c in b] == [request.prompt_ids] * 2
        assert [c.completion_ids for c in a] == [c.completion_ids for c in b]
        for x, y in zip(a, b):
            assert x.logprobs == pytest.approx(y.logprobs, rel=RTOL, abs=TOL)
    err = capsys.readouterr().err
    assert err.count("decoding in parts: 12 samples") == 1 and "--model.decode_memory_gb" in err
    assert team.decode_parts_seen == 2


def test_teacher_forcing_computes_each_shared_prompt_once_with_the_one_pass_values_and_gradients(monkeypatch):
    """K = 4 samples per agent under one long prompt each, as a MAGRPO group: the update's forward takes
    each agent's prompt once (its cache repeated for the K rows) and gives the log-probs and LoRA
    gradients of one left-padded pass over every row; the reference policy too."""
    import collab.policy.prefixes as sharing

    team = make_team(0.7, 0.7)
    perturb_lora_b(team, std=0.05)
    gen = torch.Generator().manual_seed(3)
    ids = lambda n: torch.randint(5, 500, (n,), generator=gen).tolist()  # noqa: E731
    prompts = {0: ids(90), 1: ids(120)}
    agents = [0, 0, 0, 0, 1, 1, 1, 1]
    completions = [ids(n) for n in (5, 9, 1, 7, 12, 3, 8, 8)]
    rows = [prompts[a] for a in agents]
    tokens: list[int] = []  # positions through the model, counted at its embedding layer
    team.model_of(0).get_input_embeddings().register_forward_hook(lambda m, args, out: tokens.append(args[0].numel()))

    def run(reference=False):
        for param in team.parameters():
            param.grad = None
        tokens.clear()
        out = team.logprobs(agents, rows, completions, reference=reference)
        if not reference:
            (torch.stack([t.sum() for t in out]) * torch.linspace(-1, 1, len(out))).sum().backward()
        grads = [] if reference else [p.grad.clone() for a in (0, 1) for p in lora_b_params(team, a)]
        return [t.detach() for t in out], grads, sum(tokens)

    shared, shared_grads, shared_tokens = run()
    ref_shared = run(reference=True)[0]
    monkeypatch.setattr(sharing, "MIN_PREFIX_SAVING", 2.0)  # never share: one pass over the padded rows
    one, one_grads, one_tokens = run()
    ref_one = run(reference=True)[0]
    # padded rows of one pass: 8 x (120 + 12); shared: the two prompts but one token each, then 8 remainders
    assert one_tokens == 8 * 132 and shared_tokens < one_tokens / 3
    for a, b in zip(shared + ref_shared, one + ref_one):
        assert a.shape == b.shape and torch.allclose(a, b, rtol=RTOL, atol=TOL)
    assert any(float(g.abs().max()) > 0 for g in one_grads)
    for a, b in zip(shared_grads, one_grads):
        assert float((a - b).abs().max()) <= 1e-4 * float(b.abs().max()) + 1e-8


# -- training --------------------------------------------------------------------------------------------
def test_optimizer_step_changes_adapters_only():
    team = make_team(0.7, 1.0)
    perturb_lora_b(team)  # so that LoRA A gets a gradient too
    before_base = base_state(team)
    adapters = [team.adapter_parameters(i) for i in range(len(team))]
    assert all(adapters) and all(p.requires_grad for ps in adapters for p in ps)
    before = [[p.detach().clone() for p in ps] for ps in adapters]
    optimizer = torch.optim.SGD([p for ps in adapters for p in ps], lr=0.1)
    p0, p1 = prompt(team, 0, "Tell me a story."), prompt(team, 1, "Edit it.")
    lps = team.logprobs([0, 1, 0], [p0, p1, p1], [[20, 21, 22], [23, 24], [25]])
    loss = -sum(lp.sum() for lp in lps)
    loss.backward()
    optimizer.step()
    for ps, olds in zip(adapters, before):
        for p, old in zip(ps, olds):
            assert not torch.equal(p.detach(), old)
    after_base = base_state(team)
    assert after_base.keys() == before_base.keys()
    for name, tensor in before_base.items():
        assert torch.equal(after_base[name], tensor), name


def test_reference_logprobs_are_the_base_policy():
    team = make_team(0.7, 1.0)
    fresh = make_team(0.7, 1.0, seed=5)  # another team, all adapters zero (B = 0)
    p0, p1 = prompt(team, 0, "Write."), prompt(team, 1, "Rewrite, please.")
    agents, prompts, conts = [0, 1], [p0, p1], [[30, 31, 32], [33, 34]]
    with torch.no_grad():
        ref = team.logprobs(agents, prompts, conts, reference=True)
        adapted = team.logprobs(agents, prompts, conts)
        zero = fresh.logprobs(agents, prompts, conts)
    for r, a, z in zip(ref, adapted, zero):
        torch.testing.assert_close(r, a, atol=TOL, rtol=RTOL)  # before training: the same policy
        torch.testing.assert_close(r, z, atol=TOL, rtol=RTOL)
    perturb_lora_b(team)
    with torch.no_grad():
        ref2 = team.logprobs(agents, prompts, conts, reference=True)
        adapted2 = team.logprobs(agents, prompts, conts)
    for r, a, z in zip(ref2, adapted2, zero):
        torch.testing.assert_close(r, z, atol=TOL, rtol=RTOL)
        assert (r - a).abs().max().item() > 1e-3


def test_reference_logprobs_leave_every_adapter_trainable():
    """A KL penalty computes reference log-probs between training steps; every agent must stay trainable."""
    team = make_team(0.7, 1.0)
    p = prompt(team, 0, "Write.")
    with torch.no_grad():
        team.logprobs([0, 1], [p, p], [[5], [6]], reference=True)
    for i in range(len(team)):
        assert all(q.requires_grad for q in team.adapter_parameters(i)), team.names[i]
    lps = team.logprobs([0, 1], [p, p], [[5], [6]])
    (lps[0].sum() + lps[1].sum()).backward()
    for i in range(len(team)):
        assert all(q.grad is not None for q in lora_b_params(team, i)), team.names[i]


# -- persistence -----------------------------------------------------------------------------------------
def test_save_and_load_adapters_round_trip(tmp_path):
    team = make_team(0.7, 1.0)
    perturb_lora_b(team, seed=3)
    p0, p1 = prompt(team, 0, "Save me."), prompt(team, 1, "Load me.")
    agents, prompts, conts = [0, 1], [p0, p1], [[40, 41, 42], [43, 44]]
    with torch.no_grad():
        expected = team.logprobs(agents, prompts, conts)
    team.save_adapters(tmp_path / "adapters")
    assert {d.name for d in (tmp_path / "adapters").iterdir()} == {"agent0", "agent1"}

    other = make_team(0.7, 1.0, seed=9)  # different LoRA A init, zero B
    with torch.no_grad():
        unloaded = other.logprobs(agents, prompts, conts)
    assert max((u - e).abs().max().item() for u, e in zip(unloaded, expected)) > 1e-3
    other.load_adapters(tmp_path / "adapters")
    with torch.no_grad():
        loaded = other.logprobs(agents, prompts, conts)
    for got, want in zip(loaded, expected):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    for i in range(len(team)):
        for a, b in zip(team.adapter_parameters(i), other.adapter_parameters(i)):
            assert torch.equal(a.detach(), b.detach())


def test_load_adapters_missing_agent_is_a_user_error(tmp_path):
    small = make_team(0.7)
    small.save_adapters(tmp_path)  # only agent0
    team = make_team(0.7, 1.0)
    with pytest.raises(UserError, match="agent1"):
        team.load_adapters(tmp_path)
    with pytest.raises(UserError):
        team.load_adapters(tmp_path / "does-not-exist")


# -- QLoRA -----------------------------------------------------------------------------------------------
def test_qlora_4bit_generate_and_train_step():
    team = make_team(0.7, 1.0, base=BaseConfig(name="tiny", device="cpu", quantization="4bit"))
    model = team.models["base0"]
    assert any("4bit" in type(m).__name__ for m in model.modules())
    # Snapshot before generate: on CPUs with AVX512-BF16, bitsandbytes repacks 4-bit weights in place on
    # the first eval forward without grad, and its state_dict() converts them back (a side effect), so a
    # snapshot taken between generate and logprobs would hide what generate did.
    before_base = base_state(team)
    torch.manual_seed(0)
    p0, p1 = prompt(team, 0, "Write a poem."), prompt(team, 1, "Edit the poem.")
    outputs = team.generate([GenerationRequest(0, p0, n=2), GenerationRequest(1, p1, n=1)], max_new_tokens=4)
    comps = completions_of(outputs)
    assert len(comps) == 3 and all(0 < len(c.completion_ids) <= 4 for c in comps)

    params = [p for i in range(len(team)) for p in team.adapter_parameters(i)]
    before_b = [[p.detach().clone() for p in lora_b_params(team, i)] for i in range(len(team))]
    optimizer = torch.optim.SGD(params, lr=0.1)
    lps = team.logprobs([c.agent for c in comps], [c.prompt_ids for c in comps], [c.completion_ids for c in comps])
    for c, lp in zip(comps, lps):
        assert lp.sum().item() == pytest.approx(c.logprob, abs=1e-3)
    (-sum(lp.sum() for lp in lps)).backward()
    optimizer.step()
    # every LoRA B of every agent moves (B = 0 at init, so A has no gradient yet); a B whose gradient
    # is lost inside a quantized base layer would stay at zero
    for i in range(len(team)):
        for p, old in zip(lora_b_params(team, i), before_b[i]):
            assert not torch.equal(p.detach(), old)
    after_base = base_state(team)
    for name, tensor in before_base.items():
        assert torch.equal(after_base[name], tensor), name


# -- shared and heterogeneous bases ----------------------------------------------------------------------
def test_agents_on_the_same_base_share_one_model():
    team = AgentTeam([AgentSpec(base="tiny"), AgentSpec()], TINY)
    assert list(team.models) == ["base0"]
    assert [a.base.key for a in team.agents] == ["base0", "base0"]
    model = team.models["base0"]
    assert {"agent0", "agent1"} <= set(model.peft_config)
    assert team.model_of(0) is team.model_of(1)
    ids0 = {id(p) for p in team.adapter_parameters(0)}
    ids1 = {id(p) for p in team.adapter_parameters(1)}
    assert ids0 and ids1 and not ids0 & ids1


@pytest.mark.slow
def test_heterogeneous_team_tiny_and_smollm2():
    team = AgentTeam([AgentSpec(base="tiny"), AgentSpec(base="smollm2-135m-instruct")], TINY)
    assert list(team.models) == ["base0", "base1"]
    assert [a.base.key for a in team.agents] == ["base0", "base1"]
    assert team.model_of(0) is not team.model_of(1)
    torch.manual_seed(0)
    p0, p1 = prompt(team, 0, "Write a line."), prompt(team, 1, "Write a line.")
    outputs = team.generate([GenerationRequest(0, p0, n=2), GenerationRequest(1, p1, n=2)], max_new_tokens=5)
    comps = completions_of(outputs)
    assert [c.agent for c in comps] == [0, 0, 1, 1]
    lps = team.logprobs([c.agent for c in comps], [c.prompt_ids for c in comps], [c.completion_ids for c in comps])
    for c, lp in zip(comps, lps):
        assert lp.sum().item() == pytest.approx(c.logprob, abs=1e-3)
    (-sum(lp.sum() for lp in lps)).backward()
    for i in range(len(team)):
        assert all(p.grad is not None for p in lora_b_params(team, i))


def test_gradient_checkpointing_recomputes_each_agent_with_its_own_adapter(one_thread):
    """A checkpointed layer is recomputed inside the backward; one log-prob call over several agents on one base
    sets each agent's adapter in turn before the backward, so the recomputation must run the adapter its forward
    ran (``recompute_with_forward_adapters``), else every agent's gradient is the last agent's (off by ~3x their
    size on the tiny model). The gradient equals the one without checkpointing."""

    def team(checkpointing: bool) -> AgentTeam:
        t = AgentTeam(
            [AgentSpec(role="a"), AgentSpec(role="b")], BaseConfig(name="tiny", gradient_checkpointing=checkpointing)
        )
        t.train()
        return t

    plain, checkpointed = team(False), team(True)
    torch.manual_seed(1)
    with torch.no_grad():  # random nonzero B: the two adapters differ
        for name, p in plain.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    checkpointed.load_state_dict(plain.state_dict())
    prompts, completions = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12]], [[5, 6, 7], [8, 9], [3, 4, 5, 6]]

    def grads(t: AgentTeam) -> dict[str, torch.Tensor]:
        t.zero_grad(set_to_none=True)
        logprobs = t.logprobs([0, 1, 0], prompts, completions)
        torch.stack([lp.sum() for lp in logprobs]).sum().backward()
        return {n: p.grad for n, p in t.named_parameters() if p.grad is not None}

    expected, got = grads(plain), grads(checkpointed)
    assert sorted(got) == sorted(expected) and any("agent1" in n for n in got) and any("agent0" in n for n in got)
    for name, g in expected.items():  # float32 sums in another grouping (per-agent forwards against one mixed one)
        assert float((got[name] - g).abs().max()) <= 1e-4 * float(g.abs().max()) + 1e-12, name


def test_a_full_agent_decodes_beside_lora_agents_as_its_own_model():
    """A team of a LoRA agent, a full-parameter agent and another LoRA agent (one shared base for the two): in one
    greedy ``generate`` call the full agent's rows follow its own transformers model (``generate`` of that model,
    token for token, after a change of its weights that the LoRA agents do not see), and each LoRA agent's rows are
    what it decodes alone; the LoRA agents' reference is their shared base, the full agent's too."""
    torch.manual_seed(0)
    team = AgentTeam(
        [AgentSpec(sampling=SamplingSpec(temperature=0.0), finetune=f) for f in ("lora", "full", "lora")], TINY
    )
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the two LoRA agents differ
        for i in (0, 2):
            for p in lora_b_params(team, i):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    assert [a.base.key for a in team.agents] == ["base0", "full1", "base0"] and [
        a.reference.key for a in team.agents
    ] == ["base0"] * 3
    with torch.no_grad():
        team.model_of(1).get_input_embeddings().weight.mul_(1.5)
    p = prompt(team, 0, "Write a short story about a lighthouse keeper.")
    together = team.generate([GenerationRequest(i, p) for i in range(3)], max_new_tokens=6)
    model = team.model_of(1)
    ids = torch.tensor([p])
    expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
    got = together[1][0].completion_ids
    assert got == expected[0, len(p) : len(p) + len(got)].tolist() and len(got) >= 1
    for i in (0, 2):
        assert (
            together[i][0].completion_ids
            == team.generate([GenerationRequest(i, p)], max_new_tokens=6)[0][0].completion_ids
        )
    assert got != together[0][0].completion_ids  # its own weights, not the shared base's
    assert not team.pool.frozen  # the reference of every agent: the shared base, no copy loaded
