"""The GPU path: bf16 bases with fp32 adapters and optimizer state, SDPA attention, collab's
decoding loop against HF ``generate``, log-probs that agree across code paths and dtypes, QLoRA (4-bit NF4),
gradient checkpointing and a training run on CUDA. Marked ``gpu``; skipped where there is no CUDA device.

The base is a tiny random Qwen2 written to a folder with ``benchmarks/gpu_check.py``'s tokenizer (trained from
collab's writing corpus), not the ``tiny`` Llama: that one takes its tokenizer from the embedded SmolLM2, whose
package a bare GPU machine may lack, and nothing here may need a download. Its init scale (0.1) spreads the
logits, so that greedy decoding rarely meets a tie within bf16 rounding.

Run on a GPU machine with ``pytest -m gpu`` (``scripts/gpu_check.sh`` runs them, then the GPU benchmark).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from collab.policy.models import BaseConfig
from collab.policy.sampling import GenerationRequest
from collab.policy.team import AgentSpec, AgentTeam, SamplingSpec
from tests.support.benchmarks import load

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEVICE = "cuda"
BF16 = 2**-8
"""bf16's relative rounding step (8 significant bits): log-probs computed in bf16 by two code paths (a cached decode
step and a full forward, another kernel or batch) differ by a few of these relative to the logits' size."""
PROMPTS = ("Add 2 and 3.", "Name a colour of the sea.")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """A tiny random Qwen2 (2 layers, hidden 64, 4096 tokens) with its weights, loadable as ``BaseConfig(name=...)``."""
    return load("gpu_check").weights_folder("tiny", tmp_path_factory.mktemp("gpu"), initializer_range=0.1)


def make_team(folder: str, temperature: float = 0.7, **base) -> AgentTeam:
    """Two agents with distinct random LoRA B (zero at init), so that each adapter changes the model its own way."""
    torch.manual_seed(0)
    specs = [AgentSpec(sampling=SamplingSpec(temperature=temperature, max_new_tokens=12)) for _ in range(2)]
    team = AgentTeam(specs, BaseConfig(name=folder, device=DEVICE, **base))
    with torch.no_grad():
        for name, p in team.model_of(0).named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2)
    return team


def prompts(team: AgentTeam) -> list[list[int]]:
    return [team.encode(i, [{"role": "user", "content": text}]) for i, text in enumerate(PROMPTS)]


def rollout(team: AgentTeam, n: int = 2) -> list:
    torch.manual_seed(1)
    return [c for out in team.generate([GenerationRequest(i, p, n) for i, p in enumerate(prompts(team))]) for c in out]


@torch.no_grad()
def hf_logprobs(team: AgentTeam, agent: int, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """The completion's per-token log-probs from one plain forward of the peft model with the agent's adapter."""
    model = team.model_of(agent)
    model.set_adapter(team.names[agent])
    ids = torch.tensor([prompt + completion], device=DEVICE)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logp = (logits / team.specs[agent].sampling.temperature).log_softmax(-1)
    return logp.gather(-1, torch.tensor(completion, device=DEVICE)[:, None]).squeeze(-1)


def test_bf16_base_with_fp32_adapters_and_optimizer_state_and_sdpa_attention(folder):
    team = make_team(folder, dtype="bfloat16")
    model = team.model_of(0)
    assert model.config._attn_implementation == "sdpa"
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
    assert {p.dtype for n, p in model.named_parameters() if "lora_" not in n} == {torch.bfloat16}
    assert all(p.device.type == "cuda" for p in model.parameters())
    outs = rollout(team)
    loss = torch.stack(
        [
            lp.sum()
            for lp in team.logprobs(
                [c.agent for c in outs], [c.prompt_ids for c in outs], [c.completion_ids for c in outs]
            )
        ]
    ).sum()
    assert torch.isfinite(loss)
    loss.backward()
    params = [p for i in range(len(team)) for p in team.adapter_parameters(i)]
    assert all(p.grad is not None for p in params) and all(p.grad.abs().sum() > 0 for p in params)
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    optimizer.step()
    states = [optimizer.state[p] for p in params]
    assert states and all(s["exp_avg"].dtype == torch.float32 for s in states)


def test_greedy_decoding_in_bf16_follows_hf_generate_up_to_ties_within_rounding(folder):
    """Both agents decoded in one batch by collab's loop (each row its own adapter, KV caches repeated from one
    prefill) against HF ``generate`` with that agent's adapter alone. In bf16 the two may part at a near tie:
    where they part, the two tokens' logits (HF's teacher-forced forward of the common prefix) must be within
    bf16 rounding of each other; a wrong adapter, position or cache would part them at a clear gap."""
    team = make_team(folder, temperature=0.0, dtype="bfloat16")
    outs = team.generate([GenerationRequest(i, p) for i, p in enumerate(prompts(team))])
    compared = 0
    for (ours,), prompt in zip(outs, prompts(team)):
        model, tokenizer = team.model_of(ours.agent), team.tokenizer_of(ours.agent)
        model.set_adapter(team.names[ours.agent])
        ids = torch.tensor([prompt], device=DEVICE)
        with torch.no_grad():
            hf = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=12,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        theirs = hf[0, len(prompt) :].tolist()
        mine = ours.completion_ids
        parted = next((t for t, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        if parted is None:
            assert mine == theirs[: len(mine)] and len(mine) == len(theirs)
            compared += len(mine)
            continue
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + mine[:parted]], device=DEVICE)).logits[0, -1].float()
        gap = (logits[mine[parted]] - logits[theirs[parted]]).abs().item()
        assert gap <= 8 * BF16 * logits.abs().max().item(), (parted, gap)
        compared += parted
    assert compared > 0


def test_bf16_logprobs_agree_across_decoding_teacher_forcing_and_a_plain_hf_forward(folder):
    """The behaviour log-probs of sampling (cached decode steps, both agents in one batch), the teacher-forced ones
    of the update (``team.logprobs``: one shared prompt forward, mixed adapters) and a plain HF forward with the
    agent's adapter: the same policy in bf16, so equal within bf16 rounding relative to the logits' size."""
    team = make_team(folder, dtype="bfloat16")
    outs = rollout(team, n=3)
    with torch.no_grad():
        forced = team.logprobs([c.agent for c in outs], [c.prompt_ids for c in outs], [c.completion_ids for c in outs])
    for c, lp in zip(outs, forced):
        behaviour = torch.tensor(c.logprobs, device=DEVICE)
        plain = hf_logprobs(team, c.agent, c.prompt_ids, c.completion_ids)
        scale = plain.abs().mean().item()  # per-token log-probs of ~8 nats (4096 tokens)
        torch.testing.assert_close(lp.float(), plain, rtol=0.0, atol=8 * BF16 * scale)
        torch.testing.assert_close(behaviour, plain, rtol=0.0, atol=8 * BF16 * scale)


def test_bf16_logprobs_agree_with_fp32_within_bf16_rounding(folder):
    fp32, bf16 = make_team(folder), make_team(folder, dtype="bfloat16")
    (prompt, _), completion = (
        prompts(fp32),
        fp32.tokenizer_of(0).encode(" Blue, like the sea.", add_special_tokens=False),
    )
    with torch.no_grad():
        a = fp32.logprobs(0, [prompt], [completion])[0].float()
        b = bf16.logprobs(0, [prompt], [completion])[0].float()
    torch.testing.assert_close(b, a, rtol=0.0, atol=8 * BF16 * a.abs().mean().item())
    assert not torch.equal(a, b)  # bf16 did round: the comparison compares two computations


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")
def test_qlora_4bit_on_cuda_trains_the_adapters(folder):
    team = make_team(folder, quantization="4bit", dtype="bfloat16")
    import bitsandbytes as bnb

    assert any(isinstance(m, bnb.nn.Linear4bit) for m in team.model_of(0).modules())
    outs = rollout(team)
    team.logprobs([c.agent for c in outs], [c.prompt_ids for c in outs], [c.completion_ids for c in outs])[
        0
    ].sum().backward()
    grads = [p.grad for p in team.adapter_parameters(outs[0].agent)]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)


def test_gradient_checkpointing_gives_the_same_gradients_on_cuda(folder):
    def gradients(checkpointing: bool) -> list[torch.Tensor]:
        team = make_team(folder, gradient_checkpointing=checkpointing)
        team.train()
        prompt = prompts(team)[0]
        completion = team.tokenizer_of(0).encode(" 5", add_special_tokens=False)
        team.logprobs([0, 1], [prompt, prompt], [completion, completion])[0].sum().backward()
        return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in team.adapter_parameters(0)]

    for a, b in zip(gradients(False), gradients(True)):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6 * max(a.abs().max().item(), 1e-12))


def test_a_magrpo_run_trains_on_cuda_in_bf16(folder, tmp_path):
    pytest.importorskip("jsonargparse", reason="collab.fit's command line needs jsonargparse")
    from collab.fit import main

    argv = [
        "--algo",
        "magrpo",
        "--model.base.name",
        folder,
        "--model.base.dtype",
        "bfloat16",
        "--trainer.accelerator",
        "gpu",
        "--trainer.devices",
        "1",
        "--data.env",
        "matrix",
        "--data.env_options",
        "{}",
        "--data.batch_size",
        "2",
        "--trainer.max_steps",
        "2",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.callbacks",
        '[{"class_path": "collab.training.callbacks.ModelCheckpoint", "init_args": {"save_last": true}}]',
        "--trainer.logger.init_args.save_dir",
        str(tmp_path),
    ]
    assert main(argv) == 0
    assert list(tmp_path.glob("magrpo/version_*/checkpoints/last.ckpt"))


@torch.no_grad()
def test_a_left_padded_bf16_batch_is_finite_and_equals_each_row_alone(folder):
    """Prompts of 3 to 40 tokens in one left-padded bf16 forward on CUDA's own SDPA kernels: a pad's query row may
    attend to nothing, which fused kernels can answer with NaN (collab.policy.attention); every prompt's logits are
    finite and those of the prompt alone, up to bf16 rounding."""
    team = make_team(folder, dtype="bfloat16")
    model = team.model_of(0)
    rows = [list(range(5, 8)), list(range(10, 50)), list(range(60, 77))]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows], device=DEVICE)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=DEVICE)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    batch = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    for i, r in enumerate(rows):
        alone = model(input_ids=torch.tensor([r], device=DEVICE)).logits[0].float()
        got = batch[i, width - len(r) :]
        assert torch.isfinite(got).all()
        assert (got - alone).abs().max() <= 8 * BF16 * alone.abs().max()
