"""The stacked per-row adapter path equals peft's own single-adapter forward, values and gradients."""

import torch

from collab.policy.lora_batch import per_row_adapters, supported
from collab.policy.models import BaseConfig
from collab.policy.team import AgentSpec, AgentTeam, LoraSpec


def perturbed_team():
    torch.manual_seed(0)
    # different ranks and target modules per agent: padding and missing adapters are exercised
    team = AgentTeam(
        [AgentSpec(lora=LoraSpec(r=4)), AgentSpec(lora=LoraSpec(r=8, target_modules=["q_proj", "v_proj"]))],
        BaseConfig(name="tiny"),
    )
    with torch.no_grad():
        for n, p in team.models["base0"].named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    return team


def test_per_row_forward_matches_peft_set_adapter():
    team = perturbed_team()
    model = team.models["base0"]
    assert supported(model)
    ids = torch.randint(0, 1000, (4, 7))
    rows = ["agent0", "agent1", "agent1", "agent0"]
    with per_row_adapters(model, rows):
        stacked = model.get_base_model()(input_ids=ids).logits
    for b, name in enumerate(rows):
        model.set_adapter(name)
        alone = model(input_ids=ids[b : b + 1]).logits
        # another batch shape: float32 noise relative to the logits' size (~2e-6 of it at 2 threads)
        assert torch.allclose(stacked[b], alone[0], rtol=1e-4, atol=1e-4 * float(alone[0].detach().abs().max()))


def test_per_row_gradients_match_peft():
    team = perturbed_team()
    model = team.models["base0"]
    ids = torch.randint(0, 1000, (2, 5))
    with per_row_adapters(model, ["agent1", "agent0"]):
        model.get_base_model()(input_ids=ids).logits.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    for b, name in enumerate(["agent1", "agent0"]):
        model.set_adapter(name)
        (
            model(input_ids=ids[b : b + 1]).logits.square().sum() / ids[:1].numel() / 2 / model.config.vocab_size
        ).backward()
    # Each gradient entry sums over the tokens and the vocabulary (49k logits) in another order: float32 noise
    # relative to the size of the whole gradient (~1e-5 of it at 2 threads), not of each (often far smaller) entry.
    scale = max(float(g.abs().max()) for n, g in grads.items() if "lora_" in n)
    for n, p in model.named_parameters():
        if "lora_" in n and n in grads:
            assert torch.allclose(grads[n], p.grad, rtol=1e-4, atol=1e-4 * scale), n
    assert any("agent0" in n for n in grads) and any("agent1" in n for n in grads)


def test_patch_is_removed_after_the_block():
    team = perturbed_team()
    model = team.models["base0"]
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    with per_row_adapters(model, ["agent0"]):
        assert "forward" in vars(layer)
    assert "forward" not in vars(layer)


def test_one_token_rows_match_peft_for_mixed_and_single_adapters():
    """A decoding step's route (the batch's adapters concatenated, a mask per row) against peft per row,
    with agent1 absent from most layers (k/o/MLP), and a batch of one adapter (no mask)."""
    team = perturbed_team()
    model = team.models["base0"]
    hidden = torch.randn(5, 1, model.config.hidden_size)
    for rows in (["agent0", "agent1", "agent1", "agent0", "agent1"], ["agent1"] * 5):
        for layer_name in ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj"):
            layer = model.get_base_model().model.layers[1].get_submodule(layer_name)
            x = hidden if "down" not in layer_name else torch.randn(5, 1, model.config.intermediate_size)
            with per_row_adapters(model, rows):
                batched, flat = layer(x), layer(x[:, 0])
            for b, name in enumerate(rows):
                model.set_adapter(name)
                alone = layer(x[b : b + 1])
                scale = float(alone.detach().abs().max())
                assert torch.allclose(batched[b], alone[0], rtol=1e-5, atol=1e-5 * scale), (rows, layer_name, b)
                assert torch.allclose(flat[b], alone[0, 0], rtol=1e-5, atol=1e-5 * scale)
            if layer_name == "self_attn.k_proj" and rows[0] == "agent0":  # agent1 has no k_proj adapter
                base = layer.base_layer(x)
                assert not torch.allclose(batched[0], base[0])
                assert torch.equal(batched[1], base[1])  # its masked columns add exact zeros


def test_one_token_route_gradients_and_decode_steps_match_the_batched_route():
    """Gradients through the one-token route equal peft's, and whole decoding runs give the same
    log-probs as a teacher-forced (multi-token, batched-route) pass over the sampled tokens."""
    team = perturbed_team()
    model = team.models["base0"]
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    x = torch.randn(3, 1, model.config.hidden_size)
    rows = ["agent1", "agent0", "agent1"]
    with per_row_adapters(model, rows):
        layer(x).square().sum().backward()
    grads = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    model.zero_grad()
    for b, name in enumerate(rows):
        model.set_adapter(name)
        layer(x[b : b + 1]).square().sum().backward()
    assert set(grads) == {n for n, p in layer.named_parameters() if p.grad is not None} and len(grads) == 4
    for n, p in layer.named_parameters():
        if n in grads:
            assert torch.allclose(grads[n], p.grad, rtol=1e-5, atol=1e-5 * float(p.grad.abs().max())), n

    from collab.policy.sampling import GenerationRequest

    torch.manual_seed(3)
    requests = [GenerationRequest(0, [5, 6, 7, 8], 2), GenerationRequest(1, [9, 10, 11], 2)]
    outs = team.generate(requests, max_new_tokens=6)
    for agent, out in enumerate(outs):
        for c in out:
            forced = team.logprobs(agent, [c.prompt_ids], [c.completion_ids])[0].detach()
            sampled = torch.tensor(c.logprobs)
            assert len(c.completion_ids) == 6
            assert torch.allclose(sampled, forced, rtol=1e-4, atol=1e-4 * float(forced.abs().max()))
