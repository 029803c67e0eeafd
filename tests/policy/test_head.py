"""Log-probs through the output head in chunks (collab.policy.head): the one-pass values and gradients,
without a full-vocabulary logits tensor saved for the backward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from collab.policy.head import chunk_tokens, output_head, token_logprobs


def one_pass(hidden, head, targets, temperature, mask, entropy):
    from collab.policy.sampling import policy_logits

    lp = policy_logits(head(hidden).float(), temperature, mask).log_softmax(-1)
    ent = -(lp.exp() * lp.masked_fill(~torch.isfinite(lp), 0.0)).sum(-1)
    return lp.gather(-1, targets[:, None]).squeeze(-1), ent


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_chunks_give_the_one_pass_values_and_gradients(chunk):
    torch.manual_seed(0)
    n, h, v = 7, 16, 50
    head = nn.Linear(h, v, bias=False).requires_grad_(False)
    hidden = torch.randn(n, h, requires_grad=True)
    targets = torch.randint(0, 5, (n,))
    temperature = torch.tensor([1.0, 0.7, 0.0, 1.3, 1.0, 0.7, 2.0])  # 0: greedy, scored at 1
    allowed = torch.zeros(2, v, dtype=torch.bool)
    allowed[0, :5], allowed[1, :3] = True, True
    which = torch.tensor([0, -1, 1, 0, -1, -1, 0])  # tokens 1, 4, 5: no closed vocabulary
    mask = torch.ones(n, v, dtype=torch.bool)
    mask[which >= 0] = allowed[which[which >= 0]]
    targets[which == 1] = targets[which == 1] % 3
    weights_lp, weights_ent = torch.randn(n), torch.randn(n)

    expected_lp, expected_ent = one_pass(hidden, head, targets, temperature, mask, True)
    (expected_lp * weights_lp + expected_ent * weights_ent).sum().backward()
    expected_grad, hidden.grad = hidden.grad.clone(), None

    lp, ent = token_logprobs(hidden, head, targets, temperature, (allowed, which), entropy=True, chunk=chunk)
    (lp * weights_lp + ent * weights_ent).sum().backward()
    for got, want in ((lp, expected_lp), (ent, expected_ent), (hidden.grad, expected_grad)):
        got, want = got.detach(), want.detach()
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))
    assert float(expected_grad.abs().sum()) > 0


def test_without_entropy_only_logprobs():
    torch.manual_seed(1)
    head = nn.Linear(8, 20, bias=False).requires_grad_(False)
    hidden = torch.randn(5, 8, requires_grad=True)
    lp, ent = token_logprobs(hidden, head, torch.arange(5), torch.ones(5), chunk=2)
    assert ent is None
    lp.sum().backward()
    assert hidden.grad.shape == hidden.shape and float(hidden.grad.abs().sum()) > 0


def test_chunk_size_from_the_byte_budget():
    assert chunk_tokens(49_152) == 64 * 2**20 // (4 * 49_152) == 341
    assert chunk_tokens(10**12) == 1


def saved_bytes(fn) -> tuple[int, object]:
    """Bytes autograd saves for the backward while ``fn`` runs (each storage once), and ``fn()``."""
    from collab.runtime.memory import saved_for_backward

    seen, out = saved_for_backward(fn)
    return sum(seen.values()), out


def test_the_team_saves_no_full_vocabulary_logits_for_the_backward(monkeypatch, one_thread):
    """16 responses of 40 tokens over the tiny model's 49,152-token vocabulary: one pass saves at least the
    float32 logits (tokens x V x 4 bytes) for the backward; the chunks save far less, the same log-probs."""
    from collab.policy import head as head_module
    from collab.policy.models import BaseConfig
    from collab.policy.team import AgentSpec, AgentTeam

    team = AgentTeam([AgentSpec(role="a"), AgentSpec(role="b")], BaseConfig(name="tiny"))
    torch.manual_seed(0)
    prompts = [torch.randint(3, 1000, (12 + i,)).tolist() for i in range(16)]
    completions = [torch.randint(3, 1000, (40,)).tolist() for _ in range(16)]
    agents = [i % 2 for i in range(16)]
    vocab = team.models["base0"].get_output_embeddings().weight.shape[0]
    logits_bytes = 16 * 40 * vocab * 4

    chunked, lps = saved_bytes(lambda: team.logprobs(agents, prompts, completions))
    monkeypatch.setattr(head_module, "output_head", lambda model: None)  # the one-pass path
    whole, expected = saved_bytes(lambda: team.logprobs(agents, prompts, completions))
    print(
        f"saved for the backward: one pass {whole / 2**20:.1f} MiB, chunks {chunked / 2**20:.1f} MiB, "
        f"logits {logits_bytes / 2**20:.1f} MiB"
    )
    assert whole >= logits_bytes and chunked < logits_bytes / 10
    for got, want in zip(lps, expected):
        got, want = got.detach(), want.detach()
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


def test_models_that_post_process_their_logits_keep_the_one_pass_path():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model = LlamaForCausalLM(config).requires_grad_(False)
    assert output_head(model)[2] is model.lm_head
    model.config.final_logit_softcapping = 30.0  # Gemma 2's: the forward changes the head's output
    assert output_head(model) is None
    model.config.final_logit_softcapping = None
    model.lm_head.weight.requires_grad_(True)  # a head that trains (LoRA on lm_head): its gradient is needed
    assert output_head(model) is None
