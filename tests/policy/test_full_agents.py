"""Full-parameter agents (``finetune: full``) beside LoRA agents on the ``tiny`` base: one MAGRPO update of a full
agent against a plain transformers model and ``torch.optim.AdamW`` on the same batch and loss, computed here by hand;
the LoRA agent and the shared base untouched by it; the reference policy (the untrained base); saving and loading a
full agent as a model folder; the one-line refusals (a quantized base, a team larger than its device, a bad value).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import lightning as L
import pytest
import torch

from collab.algos import data_from_config, from_config
from collab.errors import UserError
from collab.policy.models import BaseConfig, load_tokenizer, tiny_llama
from collab.policy.sampling import GenerationRequest
from collab.policy.team import AgentSpec, AgentTeam
from tests.support import quiet_fit

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = BaseConfig(name="tiny", device="cpu")
LR, KL = 5e-5, 0.05
# AdamW's first step moves an entry by lr * g / (|g| + eps): one whose gradient is within float rounding of 0 moves by
# up to lr * |rounding| / eps, measured here at 2e-3 lr (one entry; the rest within 4e-5 lr): at LR that entry stays
# within a seventh of the tolerance of 1e-5 of its tensor's values.


def full_and_lora() -> list[AgentSpec]:
    return [AgentSpec(finetune="full"), AgentSpec()]


def trained_once(only_full: bool):
    """A MAGRPO module on the matrix game (agent 0 full, agent 1 LoRA on the same base, a KL penalty to the reference,
    no gradient clipping) after one update; the prepared batch it trained on; every team weight before it. With
    ``only_full`` the update sees the full agent's samples alone."""
    L.seed_everything(0, verbose=False)
    dm = data_from_config("magrpo", env="matrix", env_options={"preset": "table1"}, batch_size=2, seed=0)
    module = from_config(
        "magrpo",
        agents=full_and_lora(),
        base=TINY,
        agent_lr=LR,
        num_generations=4,
        kl_coef=KL,
        log_kl_every=0,
        max_grad_norm=0.0,
    )
    module.build(dm.env)
    before = {n: p.detach().clone() for n, p in module.team.named_parameters()}
    batches = []
    update = module.update

    def capture(batch):
        if only_full:
            batch = replace(batch, items=[s for s in batch.items if s.agent == 0])
        batches.append(batch)
        return update(batch)

    module.update = capture
    quiet_fit(module, dm, 1)
    assert len(batches) == 1
    return module, batches[0], before


def logprob(model, sample, choices: torch.Tensor, temperature: float) -> torch.Tensor:
    """log pi(a | prompt) of a one-token action by hand: the last prompt position's logits over the closed action
    vocabulary, divided by the temperature."""
    ids = torch.tensor([list(sample.prompt_ids) + list(sample.completion_ids)])
    logits = model(input_ids=ids).logits[0, len(sample.prompt_ids) - 1].float()
    allowed = logits[choices] / temperature
    return allowed.log_softmax(-1)[choices.tolist().index(sample.completion_ids[0])]


def test_a_full_agents_update_is_a_transformers_model_and_adamw_step():
    """The full agent's weights after one MAGRPO update (its samples' clipped surrogate and k3 KL to the untrained
    base, each divided by its sample count) equal, to a relative 1e-5 of each tensor's values, a fresh transformers
    Llama of the same seed stepped by ``torch.optim.AdamW`` (weight decay 0) on that loss computed here by hand; so do
    its gradients, to 1e-5 of theirs, and its step, to 1% of the learning rate. The LoRA agent, trained in the same
    step, does not change that."""
    module, batch, before = trained_once(only_full=False)
    team = module.team
    mine = [s for s in batch.items if s.agent == 0]
    assert mine and any(s.agent == 1 for s in batch.items) and any(s.advantages != 0 for s in mine)
    model = tiny_llama(len(load_tokenizer("tiny")), seed=0)  # the untrained base, a plain transformers model
    for n, p in model.named_parameters():
        assert torch.equal(p, before[f"models.full0.{n}"]), n
    reference = copy.deepcopy(model).requires_grad_(False)
    choices, temperature, clip = team.choice_ids[0], team.specs[0].sampling.temperature, module.ppo.clip
    loss = torch.zeros(())
    for s in mine:
        lp = logprob(model, s, choices, temperature)
        ratio = torch.exp(lp - s.old_logprob)
        surrogate = -torch.minimum(ratio * s.advantages, ratio.clamp(1 - clip, 1 + clip) * s.advantages)
        d = logprob(reference, s, choices, temperature) - lp
        loss = loss + (surrogate + KL * (torch.exp(d) - d - 1)) / len(mine)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    loss.backward()
    trained = team.models["full0"]
    assert trained is team.model_of(0) and team.agents[0].adapter is None and team.agents[1].adapter == "agent1"
    for n, p in model.named_parameters():  # the same gradient (left in .grad by the update), to 1e-5 of its size
        grad = trained.get_parameter(n).grad
        assert float((grad - p.grad).abs().max()) <= 1e-5 * float(p.grad.abs().max()), n
    optimizer.step()
    for n, expected in model.named_parameters():
        got, start, expected = trained.get_parameter(n).detach(), before[f"models.full0.{n}"], expected.detach()
        assert float((got - expected).abs().max()) <= 1e-5 * float(expected.abs().max()), n
        # the step itself: every entry moved as AdamW moved it, to 1% of the learning rate (a first step moves an
        # entry by at most lr), and it did move
        assert float(((got - start) - (expected - start)).abs().max()) <= 0.01 * LR, n
        assert float((got - start).abs().max()) >= 0.9 * LR, n
    # what the start line and the refusal count: weights, gradients and AdamW's two moments, 16 bytes a parameter
    from collab.policy.full import COPIES

    state = module.trainer.optimizers[0].state
    params = list(trained.parameters())
    held = sum(
        p.nbytes + p.grad.nbytes + sum(t.nbytes for t in state[p].values() if t.dim()) for p in params
    )  # the step counters are scalars
    assert held == COPIES * 4 * sum(p.numel() for p in params) == 16 * 3_219_776


def test_the_full_agents_update_leaves_the_lora_agent_and_the_shared_base_bitwise():
    """An update on the full agent's samples alone (its KL term reading the untrained base: the shared base with the
    LoRA adapters disabled) moves every weight of the full agent and leaves bitwise the LoRA agent's adapter and every
    weight of the shared base, which loads no copy of its own."""
    module, batch, before = trained_once(only_full=True)
    team = module.team
    assert batch.items and {s.agent for s in batch.items} == {0}
    assert (
        team.agents[0].reference.key == "base0" and team.untrained(0) is team.models["base0"] and not team.pool.frozen
    )
    after = dict(team.named_parameters())
    shared = [n for n in before if n.startswith("models.base0.")]
    assert any("lora_" in n for n in shared) and any("lora_" not in n for n in shared)
    for n in shared:
        assert torch.equal(after[n], before[n]), n
    moved = [n for n in before if n.startswith("models.full0.") and not torch.equal(after[n], before[n])]
    assert len(moved) == len([n for n in before if n.startswith("models.full0.")])
    assert all(after[n].requires_grad for n in moved)
    assert not any(p.requires_grad for n, p in after.items() if n.startswith("models.base0.") and "lora_" not in n)


def test_the_reference_of_a_full_agent_is_its_untrained_base():
    """A full-only team: the reference policy is a frozen copy of the base, loaded on first use without drawing from
    the global generator, equal to the full agent's log-probs before training and apart from them after a change;
    the team's parameters are the full agent's alone (the frozen copy is no submodule)."""
    team = AgentTeam([AgentSpec(finetune="full")], TINY)
    prompt = team.encode(0, [{"role": "user", "content": "Pick A or B."}])
    torch.manual_seed(3)
    (out,) = team.generate([GenerationRequest(0, prompt, n=2)], max_new_tokens=4)
    completions = [c.completion_ids for c in out]
    with torch.no_grad():
        own = team.logprobs([0, 0], [prompt] * 2, completions)
    state = torch.get_rng_state()
    assert not team.pool.frozen
    with torch.no_grad():
        ref = team.logprobs([0, 0], [prompt] * 2, completions, reference=True)
    assert torch.equal(torch.get_rng_state(), state) and list(team.pool.frozen) == ["tiny"]
    for c, a, r in zip(out, own, ref):
        assert float(a.sum()) == pytest.approx(c.logprob, rel=1e-5) and torch.allclose(a, r, rtol=1e-5, atol=1e-6)
    assert sum(p.numel() for p in team.parameters()) == sum(p.numel() for p in team.adapter_parameters(0))
    with torch.no_grad():
        team.model_of(0).get_input_embeddings().weight.mul_(1.5)
        moved = team.logprobs([0, 0], [prompt] * 2, completions)
        again = team.logprobs([0, 0], [prompt] * 2, completions, reference=True)
    assert all(torch.equal(r, g) for r, g in zip(ref, again))
    assert not any(torch.allclose(m, r, rtol=1e-3) for m, r in zip(moved, ref))


def test_save_and_load_write_a_full_agent_as_a_model_folder(tmp_path):
    """``save_adapters`` writes the full agent as a transformers folder (AutoModelForCausalLM loads it, with its
    weights) beside the LoRA agent's peft folder; ``load_adapters`` puts both back into a fresh team, bitwise."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    team = AgentTeam(full_and_lora(), TINY)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for i in range(2):
            for p in team.adapter_parameters(i):
                p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    team.save_adapters(tmp_path)
    assert (tmp_path / "agent0" / "config.json").is_file() and (
        tmp_path / "agent1" / "adapter_model.safetensors"
    ).is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "agent0")
    for n, p in team.model_of(0).named_parameters():
        assert torch.equal(loaded.get_parameter(n), p), n
    torch.manual_seed(0)
    fresh = AgentTeam(full_and_lora(), TINY)
    assert not torch.equal(fresh.adapter_parameters(0)[0], team.adapter_parameters(0)[0])
    fresh.load_adapters(tmp_path)
    for i in range(2):
        for a, b in zip(fresh.adapter_parameters(i), team.adapter_parameters(i)):
            assert torch.equal(a, b)
    (tmp_path / "agent0" / "config.json").unlink()
    with pytest.raises(UserError, match=r"no model \(finetune: full\) for agent0"):
        fresh.load_adapters(tmp_path)


def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


def test_a_quantized_base_with_a_full_agent_is_refused_in_one_line():
    with pytest.raises(UserError) as error:
        AgentTeam(full_and_lora(), replace(TINY, quantization="4bit"))
    text = one_line(error)
    assert "model.agents[0].finetune full" in text and "4bit" in text and "quantization none" in text


def test_a_team_larger_than_its_device_is_refused_before_loading(monkeypatch):
    """The estimate: 16 bytes a parameter per full agent in float32 (8 in bfloat16) plus the shared base once, against
    the device's memory, before any weight is loaded; the line names LoRA, QLoRA and the sizes they would take."""
    from collab.policy import full, models, pool

    params = models.KNOWN_PARAMS["tiny"]
    assert full.team_bytes(full_and_lora(), TINY) == (16 * params, 4 * params, {"tiny": params})
    assert full.team_bytes(full_and_lora(), replace(TINY, dtype="bfloat16"))[0] == 8 * params
    monkeypatch.setattr(full, "device_bytes", lambda device: 19 * params)  # the full agent fits, with the base not
    for where in (models, pool):
        monkeypatch.setattr(where, "load_model", lambda config: pytest.fail("loaded before the estimate"))
    with pytest.raises(UserError) as error:
        AgentTeam(full_and_lora(), TINY)
    text = one_line(error)
    assert "1 full-parameter agent(s) (agents 0)" in text and "16 bytes a parameter in float32" in text
    assert "finetune: lora" in text and "--model.base.quantization 4bit" in text and "more processes" in text
    monkeypatch.setattr(full, "device_bytes", lambda device: 20 * params)
    full.check_fits(full_and_lora(), TINY, torch.device("cpu"))  # 16 + 4 bytes a parameter fit in 20


def test_a_full_team_that_fits_its_fsdp_processes_sharded_is_not_refused():
    """Two full agents on tiny in float32: 32 bytes a parameter on one process, refused on a device of 25. Under fsdp
    over 2 processes each keeps half (16) and a backward pass gathers one agent's weights and gradients whole (8):
    24 fit in 25. On a device of 20 the 2 processes are refused, the line saying what a process holds and
    gathers, and 4 fit (8 + 8)."""
    from collab.policy import full, models

    params, cpu = models.KNOWN_PARAMS["tiny"], torch.device("cpu")
    team = [AgentSpec(finetune="full"), AgentSpec(finetune="full")]
    with pytest.raises(UserError, match="more processes do not help under ddp"):
        full.check_fits(team, TINY, cpu, capacity=25 * params)
    full.check_fits(team, TINY, cpu, capacity=25 * params, shards=2)
    with pytest.raises(UserError) as error:
        full.check_fits(team, TINY, cpu, capacity=20 * params, shards=2)
    text = one_line(error)
    assert f"each of the 2 fsdp processes holds {full.size(16 * params)}" in text
    assert f"gathers {full.size(8 * params)} whole" in text
    full.check_fits(team, TINY, cpu, capacity=20 * params, shards=4)


def test_bad_finetune_values_and_unsupported_settings_are_one_line():
    from collab.policy.specs import check_agents

    with pytest.raises(UserError, match=r"model.agents\[1\].finetune must be one of lora, full"):
        check_agents([AgentSpec(), AgentSpec(finetune="qlora")])
