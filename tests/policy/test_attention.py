"""Left-padded batches under a kernel that adds the mask as a bias (collab.policy.attention)."""

import math

import pytest
import torch

from collab.policy.attention import without_empty_rows
from collab.policy.models import tiny_llama
from collab.policy.prefill import prefill


def test_without_empty_rows_by_hand():
    mask = torch.tensor([[[[False, False, False], [True, False, False], [True, True, True]]]])
    fixed = without_empty_rows(mask)
    assert fixed.tolist() == [[[[True, True, True], [True, False, False], [True, True, True]]]]
    assert without_empty_rows(None) is None
    bias = torch.zeros(1, 1, 2, 2)
    assert without_empty_rows(bias) is bias


def biased_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """SDPA as a kernel that adds the mask as a bias would compute it: a query row that may attend to nothing gets
    NaN, and a NaN key poisons every row whose masked score meets it (CUDA's fused paths; the CPU's return zeros)."""
    if key.shape[1] != query.shape[1]:
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        value = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
    scores = query @ key.transpose(-1, -2) * (scale or 1 / math.sqrt(query.shape[-1]))
    if attn_mask is None and is_causal:
        attn_mask = torch.ones(scores.shape[-2:], dtype=torch.bool).tril(scores.shape[-1] - scores.shape[-2])
    if attn_mask is not None:
        scores = scores + torch.zeros_like(scores).masked_fill(~attn_mask, float("-inf"))
    return scores.softmax(-1) @ value


@pytest.fixture
def fused_kernel(monkeypatch):
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", biased_sdpa)


def test_a_left_padded_batch_stays_finite_and_equals_each_row_alone(fused_kernel):
    model = tiny_llama(100, seed=0).eval()
    assert model.config._attn_implementation == "sdpa"
    prompts = [[5, 6, 7], [11, 12, 13, 14, 15, 16, 17, 18, 19]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        batch = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        for row, p in enumerate(prompts):
            alone = model(input_ids=torch.tensor([p])).logits[0]
            got = batch[row, width - len(p) :]
            assert torch.isfinite(got).all()
            assert torch.allclose(got, alone, rtol=1e-4, atol=1e-5 * alone.abs().max().item())


def test_a_prefill_of_prompts_of_different_lengths_stays_finite(fused_kernel):
    model = tiny_llama(100, seed=1).eval()
    out, _, _ = prefill(model, [[5, 6, 7], list(range(10, 30))], ["a", "a"], pad=0, device="cpu")
    assert torch.isfinite(out.logits[:, -1]).all()
