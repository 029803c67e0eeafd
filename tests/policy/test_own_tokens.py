"""Only an agent's own tokens are scored (collab.policy.scoring, ``own``): a completion that holds a tool's result
within the turn keeps those tokens as context, while its log-probs, entropies and their gradients are those of the
agent's tokens alone, against a hand-built forward of the same sequence with the same mask."""

from __future__ import annotations

import pytest
import torch

from collab.policy import head as head_module
from tests.policy.test_team import lora_b_params, make_team, perturb_lora_b, prompt

# agent tokens a1 a2, a tool's result r1 r2 r3 (context), agent token a3
COMPLETION = [504, 1003, 28, 29, 30, 2208]
OWN = [True, True, False, False, False, True]
RTOL = 1e-5


def hand_built(team, prompt_ids: list[int], completion: list[int], own: list[bool]):
    """The agent's policy on its own tokens from one plain forward of prompt + completion (adapter 0 active),
    the others dropped by the mask: log-probs and entropies."""
    model = team.model_of(0)
    model.set_adapter(team.names[0])
    ids = torch.tensor([prompt_ids + completion])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp = (logits / team.specs[0].sampling.temperature).log_softmax(-1)
    picked = logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    mask = torch.tensor(own)
    return picked[mask], entropy[mask]


@pytest.mark.parametrize("chunked", [True, False], ids=["head-in-chunks", "one-pass"])
def test_only_own_tokens_are_scored_and_trained(chunked, monkeypatch, one_thread):
    if not chunked:  # the one-pass path of models whose forward changes the head's output
        monkeypatch.setattr(head_module, "output_head", lambda model: None)
    team = make_team(0.7)
    perturb_lora_b(team)
    p = prompt(team, 0, "What is 12 + 30?")
    ((lp, ent),) = zip(*team.logprobs([0], [p], [COMPLETION], entropy=True, own=[OWN]))
    assert lp.shape == (3,) and ent.shape == (3,)
    lp.sum().backward()
    got = [q.grad.clone() for q in lora_b_params(team, 0)]
    team.zero_grad(set_to_none=True)

    want_lp, want_ent = hand_built(team, p, COMPLETION, OWN)
    torch.testing.assert_close(lp, want_lp, rtol=RTOL, atol=1e-6)
    torch.testing.assert_close(ent, want_ent, rtol=RTOL, atol=1e-6)
    want_lp.sum().backward()
    for g, q in zip(got, lora_b_params(team, 0)):  # relative to the gradient's size: float noise of two paths
        assert (g - q.grad).norm() <= 1e-4 * q.grad.norm()
    assert any(g.abs().sum() > 0 for g in got)


def test_all_own_is_the_unmasked_result_bitwise(one_thread):
    team = make_team(1.0)
    perturb_lora_b(team)
    p = prompt(team, 0, "Name a colour.")
    plain = team.logprobs([0], [p], [COMPLETION])[0]
    masked = team.logprobs([0], [p], [COMPLETION], own=[[True] * len(COMPLETION)])[0]
    assert torch.equal(plain, masked)
    part = team.logprobs([0], [p], [COMPLETION], own=[OWN])[0]
    # the same forward, the context's tokens left out: the head then multiplies fewer rows, which a BLAS may block
    # otherwise (without vector kernels the sums differ in their last bit), so equal to float32 rounding
    expected = plain[torch.tensor(OWN)]
    torch.testing.assert_close(part, expected, rtol=1e-6, atol=1e-6 * float(expected.detach().abs().max()))
