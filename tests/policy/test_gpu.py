"""The GPU path (issue 16): bf16 bases with fp32 adapters and optimizer state, SDPA attention, QLoRA (4-bit
NF4) and gradient checkpointing on CUDA. Marked ``gpu``; skipped where there is no CUDA device.

Run on a GPU machine with ``pytest -m gpu``.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from collab.policy.models import BaseConfig
from collab.policy.sampling import GenerationRequest
from collab.policy.team import AgentSpec, AgentTeam, SamplingSpec

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def team_on_cuda(**base) -> AgentTeam:
    torch.manual_seed(0)
    specs = [AgentSpec(sampling=SamplingSpec(max_new_tokens=8)), AgentSpec(sampling=SamplingSpec(max_new_tokens=8))]
    return AgentTeam(specs, BaseConfig(name="tiny", device="cuda", **base))


def rollout_and_loss(team: AgentTeam) -> tuple[list, torch.Tensor]:
    prompt = team.encode(0, [{"role": "user", "content": "Add 2 and 3."}])
    torch.manual_seed(1)
    outs = [c for out in team.generate([GenerationRequest(0, prompt, 2), GenerationRequest(1, prompt, 2)]) for c in out]
    logps = team.logprobs([c.agent for c in outs], [c.prompt_ids for c in outs], [c.completion_ids for c in outs])
    return outs, torch.stack([lp.sum() for lp in logps]).sum()


def test_bf16_base_with_fp32_adapters_and_optimizer_state_and_sdpa_attention():
    team = team_on_cuda(dtype="bfloat16")
    model = team.model_of(0)
    assert model.config._attn_implementation == "sdpa"
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
    assert {p.dtype for n, p in model.named_parameters() if "lora_" not in n} == {torch.bfloat16}
    assert all(p.device.type == "cuda" for p in model.parameters())
    outs, loss = rollout_and_loss(team)
    assert torch.isfinite(loss)
    loss.backward()
    params = [p for i in range(len(team)) for p in team.adapter_parameters(i)]
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    optimizer.step()
    states = [optimizer.state[p] for p in params if p in optimizer.state]
    assert states and all(s["exp_avg"].dtype == torch.float32 for s in states)


def test_bf16_log_probs_agree_with_fp32_within_bf16_rounding():
    fp32, bf16 = team_on_cuda(), team_on_cuda(dtype="bfloat16")
    prompt = fp32.encode(0, [{"role": "user", "content": "Name a colour."}])
    completion = fp32.tokenizer_of(0).encode(" Blue, like the sea.", add_special_tokens=False)
    with torch.no_grad():
        a = fp32.logprobs(0, [prompt], [completion])[0].float()
        b = bf16.logprobs(0, [prompt], [completion])[0].float()
    # the tiny model's log-probs are about -10.8 (a near-uniform 49k vocabulary); bf16 keeps 8 bits of mantissa
    torch.testing.assert_close(b, a, rtol=2e-2, atol=0.0)


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")
def test_qlora_4bit_on_cuda_trains_the_adapters():
    team = team_on_cuda(quantization="4bit", dtype="bfloat16")
    import bitsandbytes as bnb

    assert any(isinstance(m, bnb.nn.Linear4bit) for m in team.model_of(0).modules())
    _, loss = rollout_and_loss(team)
    loss.backward()
    grads = [p.grad for i in range(len(team)) for p in team.adapter_parameters(i)]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)


def test_gradient_checkpointing_gives_the_same_gradients_on_cuda():
    def gradients(checkpointing: bool) -> list[torch.Tensor]:
        team = team_on_cuda(gradient_checkpointing=checkpointing)
        team.train()
        prompt = team.encode(0, [{"role": "user", "content": "Add 2 and 3."}])
        completion = team.tokenizer_of(0).encode(" 5", add_special_tokens=False)
        team.logprobs([0, 1], [prompt, prompt], [completion, completion])[0].sum().backward()
        return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in team.adapter_parameters(0)]

    for a, b in zip(gradients(False), gradients(True)):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6 * max(a.abs().max().item(), 1e-12))


def test_a_magrpo_run_trains_on_cuda_in_bf16(tmp_path):
    from collab.fit import main

    argv = ["--algo", "magrpo", "--model.base.name", "tiny", "--model.base.dtype", "bfloat16",
            "--trainer.accelerator", "gpu", "--trainer.devices", "1", "--data.env", "matrix", "--data.env_options", "{}",
            "--data.batch_size", "2", "--trainer.max_steps", "2", "--trainer.enable_progress_bar", "false",
            "--trainer.callbacks", '[{"class_path": "collab.training.callbacks.ModelCheckpoint", "init_args": {"save_last": true}}]',
            "--trainer.logger.init_args.save_dir", str(tmp_path)]
    assert main(argv) == 0
    assert list(tmp_path.glob("magrpo/version_*/checkpoints/last.ckpt"))
