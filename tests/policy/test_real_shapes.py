"""The properties of the papers' models at their real shapes, each reproduced on a tiny model of the same family.

``benchmarks/paper_shapes.py`` runs the presets at the papers' shapes (minutes a step); these tests keep, at a
2-layer size, what those shapes have that collab's other tests do not combine:

- a vocabulary larger than the tokenizer's: Qwen's models have 151,936 embedding rows for a tokenizer of 151,665
  tokens (Phi-3: 32,064 for 32,011); the policy is a softmax over every row, so a rollout may sample an id that no
  token has (here 2,048 extra rows, as many as the tokenizer's tokens: about every other sampled token is one). Its
  text leaves it out; its log-prob is scored and trained like any other;
- long prompts: several hundred tokens (a writing post, a HouseBuild prompt of 1,800), over the 512 columns of a
  prefill piece (``collab.policy.prefill.PREFILL_CHUNK``);
- grouped-query attention: 2 key-value heads for 4 query heads (Qwen2.5-3B: 2 for 16), and Qwen3-4B's heads wider
  than hidden / heads (24 here against 64 / 4);
- tied embeddings: the output head is the input embedding (Qwen2.5-3B, Qwen3-1.7B and -4B), which a full agent
  trains as one tensor (its head trains, so its log-probs take the one-pass path, LoRA's the chunked head).

For a LoRA agent and a full agent on Qwen2 and Qwen3, a sampled rollout of the long prompt, its teacher-forced
log-probs (equal to a plain transformers forward, and to the behaviour log-probs the rollout recorded: the
importance ratio starts at 1) and a backward with finite gradients on what trains.
"""

from __future__ import annotations

import json
from importlib.resources import files

import pytest
import torch

from collab.policy.adapters import train_adapters_only
from collab.policy.models import TINY_CONFIG, BaseConfig
from collab.policy.prefill import PREFILL_CHUNK
from collab.policy.sampling import GenerationRequest
from collab.policy.team import AgentSpec, AgentTeam, SamplingSpec
from tests.support.architectures import other_tokenizer

EXTRA = 2048
"""Embedding rows beyond the tokenizer's tokens (about 2,048: :func:`tests.support.architectures.other_tokenizer`)."""
NEW_TOKENS = 24


def long_chat() -> list[dict[str, str]]:
    """A system prompt and a user message of three posts of collab's writing corpus (several hundred tokens)."""
    corpus = (files("collab") / "data" / "writing_corpus.jsonl").read_text().splitlines()
    posts = [json.loads(line)["prompt"] for line in corpus[:3]]
    return [
        {"role": "system", "content": "You summarize Reddit posts."},
        {"role": "user", "content": "Summarize the posts.\n\n" + "\n\n".join(posts)},
    ]


def model_folder(family: str, root, tokenizer_folder: str) -> str:
    """A tiny random Qwen2 or Qwen3 with GQA, tied embeddings and :data:`EXTRA` rows beyond the tokenizer."""
    import transformers as tf

    folder = root / family
    tokenizer = tf.AutoTokenizer.from_pretrained(tokenizer_folder)
    common = dict(
        vocab_size=len(tokenizer) + EXTRA,
        **TINY_CONFIG,  # the tiny model's shape, in each family's architecture
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = tf.Qwen3Config(**common, head_dim=24) if family == "qwen3" else tf.Qwen2Config(**common)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


class Case:
    def __init__(self, family: str, finetune: str, folder: str) -> None:
        torch.manual_seed(0)  # peft draws the LoRA A matrices from the global generator
        sampling = SamplingSpec(temperature=1.0, top_p=1.0, top_k=0)
        self.family, self.finetune = family, finetune
        self.team = AgentTeam([AgentSpec(finetune=finetune, sampling=sampling)], BaseConfig(name=folder, device="cpu"))
        with torch.no_grad():  # LoRA B random, so that the adapter changes the policy
            for name, p in self.team.model_of(0).named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.2)
        self.tokens = len(self.team.tokenizer_of(0))
        self.prompt = self.team.encode(0, long_chat())
        torch.manual_seed(1)
        ((self.completion,),) = self.team.generate([GenerationRequest(0, self.prompt)], max_new_tokens=NEW_TOKENS)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("real-shapes")
    tokenizer = other_tokenizer(root)
    return {family: model_folder(family, root, tokenizer) for family in ("qwen2", "qwen3")}


@pytest.fixture(scope="module", params=[("qwen2", "lora"), ("qwen2", "full"), ("qwen3", "lora"), ("qwen3", "full")])
def case(request, folders) -> Case:
    family, finetune = request.param
    return Case(family, finetune, folders[family])


def plain_logprobs(case: Case) -> torch.Tensor:
    """log_softmax of one plain transformers forward (the agent's adapter set, or the full agent's model) at the
    completion's tokens (temperature 1)."""
    model = case.team.model_of(0)
    ids = case.prompt + case.completion.completion_ids
    if case.finetune == "lora":
        model.set_adapter(case.team.names[0])
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, len(case.prompt) - 1 : -1].float()
    finally:
        if case.finetune == "lora":
            train_adapters_only(model)  # set_adapter left only this adapter trainable
    targets = torch.tensor(case.completion.completion_ids)[:, None]
    return logits.log_softmax(-1).gather(-1, targets).squeeze(-1)


def test_the_tiny_model_has_the_real_shapes_properties(case):
    config = case.team.model_of(0).config
    assert config.vocab_size == case.tokens + EXTRA  # rows beyond the tokenizer
    assert config.num_key_value_heads < config.num_attention_heads  # grouped-query attention
    model = case.team.model_of(0)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
    assert len(case.prompt) > PREFILL_CHUNK  # a long prompt: prefilled in pieces
    if case.family == "qwen3":
        assert config.head_dim * config.num_attention_heads != config.hidden_size


def test_a_rollout_samples_ids_beyond_the_tokenizer_and_leaves_them_out_of_its_text(case):
    ids = case.completion.completion_ids
    beyond = [t for t in ids if t >= case.tokens]
    assert 0 < len(ids) <= NEW_TOKENS and beyond, ids
    tokenizer = case.team.tokenizer_of(0)
    assert case.completion.text == tokenizer.decode([t for t in ids if t < case.tokens], skip_special_tokens=True)
    assert all(torch.isfinite(torch.tensor(case.completion.logprobs)))


def test_logprobs_equal_a_plain_forward_and_the_behaviour_logprobs(case):
    with torch.no_grad():
        (ours,) = case.team.logprobs(0, [case.prompt], [case.completion.completion_ids])
    ref = plain_logprobs(case)
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    behaviour = torch.tensor(case.completion.logprobs, dtype=ours.dtype)
    torch.testing.assert_close(ours, behaviour, rtol=1e-4, atol=1e-4)  # the importance ratio starts at 1


def test_a_backward_through_the_long_prompt_gives_finite_gradients_to_what_trains(case):
    params = case.team.adapter_parameters(0)
    (lp,) = case.team.logprobs(0, [case.prompt], [case.completion.completion_ids])
    try:
        (-lp.sum()).backward()
        grads = [p.grad for p in params if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads)
        assert any(g.abs().sum() > 0 for g in grads)
        if case.finetune == "full":  # the tied matrix gets the head's gradient at the sampled rows beyond the tokenizer
            embedding = case.team.model_of(0).get_input_embeddings().weight
            beyond = [t for t in case.completion.completion_ids if t >= case.tokens]
            assert embedding.grad[beyond].abs().sum() > 0
    finally:
        for p in params:
            p.grad = None
