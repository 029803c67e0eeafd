"""Tiny random models of the common HF architecture families, written as model folders (no downloads).

Each family gets a 2-layer config of its own class (hidden 64, 4 query heads over 2 key-value heads where the
family has grouped-query attention), random weights from a fixed seed and a tokenizer made from SmolLM2's
(the embedded model's, converted once into collab's cache): every family keeps its own module names, fused
layers (Phi3's ``qkv_proj``, GPT-NeoX's ``query_key_value``, GPT-2's ``Conv1D`` ``c_attn``), norms, rotary
variants, sliding windows and expert layers. Families with a sliding window get one of :data:`WINDOW` tokens,
shorter than a chat prompt, so that decoding runs past it. The GPT-2 folder's tokenizer has neither a chat
template nor a pad token, as GPT-2's own has not.

:func:`other_tokenizer` is a second tokenizer with a vocabulary and chat template of its own (trained from
SmolLM2's on collab's writing corpus) for teams that mix tokenizers.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch

WINDOW = 16
"""Sliding window (tokens) of the families that have one: shorter than every chat prompt of the tests."""

FAMILIES = (
    "llama",
    "qwen2",
    "qwen3",
    "mistral",
    "gemma2",
    "gemma3_text",
    "phi3",
    "olmo2",
    "granite",
    "gpt_neox",
    "gpt2",
    "qwen2_moe",
    "mixtral",
)
"""The architectures of the matrix (``model_type`` of their configs)."""

MOE = ("qwen2_moe", "mixtral")
SLIDING = ("qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3", "mixtral")


def _config(family: str, tokenizer, shape: dict | None = None):
    import transformers as tf

    vocab = len(tokenizer)
    special = dict(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )
    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        **special,
    )
    common.update(shape or {})
    window = dict(sliding_window=WINDOW)
    if family == "llama":
        return tf.LlamaConfig(**common)
    if family == "qwen2":
        return tf.Qwen2Config(**common, use_sliding_window=True, max_window_layers=0, **window)
    if family == "qwen3":
        return tf.Qwen3Config(**common, head_dim=16, use_sliding_window=True, max_window_layers=0, **window)
    if family == "mistral":
        return tf.MistralConfig(**common, head_dim=16, **window)
    if family == "gemma2":
        return tf.Gemma2Config(**common, head_dim=16, query_pre_attn_scalar=16, **window)
    if family == "gemma3_text":
        return tf.Gemma3TextConfig(
            **common,
            head_dim=16,
            query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention"],
            **window,
        )
    if family == "phi3":
        return tf.Phi3Config(**common, **window)
    if family == "olmo2":
        return tf.Olmo2Config(**common)
    if family == "granite":
        return tf.GraniteConfig(
            **common, embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=2.0, attention_multiplier=0.25
        )
    if family == "gpt_neox":
        return tf.GPTNeoXConfig(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=512,
            rotary_pct=0.5,
            tie_word_embeddings=False,
            **special,
        )
    if family == "gpt2":
        return tf.GPT2Config(
            vocab_size=vocab,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=512,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    if family == "qwen2_moe":
        return tf.Qwen2MoeConfig(
            **common,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            decoder_sparse_step=1,
        )
    if family == "mixtral":
        return tf.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2, **window)
    raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")


def base_tokenizer():
    """SmolLM2's tokenizer as collab loads it (left padding; pad = eos)."""
    from collab.policy.models import load_tokenizer

    return load_tokenizer("tiny")


@lru_cache(maxsize=None)
def _built(family: str, root: str, seed: int, tokenizer_folder: str | None, shape: tuple = ()) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sized = "".join(f"-{k}{v}" for k, v in shape)
    folder = Path(root) / f"{family}-{seed}{'-other' if tokenizer_folder else ''}{sized}"
    if (folder / "config.json").is_file():
        return str(folder)
    if tokenizer_folder:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    else:
        from collab.policy.models import model_folder

        tokenizer = AutoTokenizer.from_pretrained(model_folder("tiny"))
    config = _config(family, tokenizer, dict(shape))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    if family == "gpt2":  # GPT-2's own tokenizer has no chat template and no pad token
        tokenizer.chat_template = None
        tokenizer.pad_token = None
    tokenizer.save_pretrained(folder)
    if family == "gpt2":  # save_pretrained may keep the template in a side file
        for name in ("chat_template.jinja", "chat_template.json"):
            (folder / name).unlink(missing_ok=True)
        config_file = folder / "tokenizer_config.json"
        data = json.loads(config_file.read_text())
        data.pop("chat_template", None)
        data.pop("pad_token", None)
        config_file.write_text(json.dumps(data, indent=2))
    return str(folder)


def model_dir(family: str, root: str | Path, seed: int = 0, tokenizer: str | Path | None = None, **shape) -> str:
    """A folder under ``root`` holding a tiny random ``family`` model (seeded) and its tokenizer, made on the first
    call: load it with ``BaseConfig(name=folder)`` or ``AutoModelForCausalLM.from_pretrained(folder)``.
    ``tokenizer``: a tokenizer folder to use instead of SmolLM2's (e.g. :func:`other_tokenizer`). ``shape``: config
    fields over the tiny ones (``hidden_size=512``...; the families built from the shared fields only)."""
    return _built(family, str(root), seed, str(tokenizer) if tokenizer else None, tuple(sorted(shape.items())))


OTHER_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '### ' + message['role'] | capitalize + ':\n' + message['content'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{{ '</s>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Assistant:\n' }}{% endif %}"
)


def other_tokenizer(root: str | Path) -> str:
    """A folder under ``root`` with a second tokenizer: BPE of 2,048 tokens trained on collab's writing corpus from
    SmolLM2's (another vocabulary: the same text gets other ids and lengths), ``</s>`` as its end token and a
    ``### Role:`` chat template instead of SmolLM2's ``<|im_start|>`` one."""
    from importlib.resources import files

    from transformers import AutoTokenizer

    from collab.policy.models import model_folder

    folder = Path(root) / "other-tokenizer"
    if (folder / "tokenizer.json").is_file():
        return str(folder)
    corpus = [
        json.loads(line)
        for line in (files("collab") / "data" / "writing_corpus.jsonl").read_text().splitlines()
        if line
    ]
    texts = [" ".join(str(v) for v in item.values()) if isinstance(item, dict) else str(item) for item in corpus]
    texts += ["The sum of 3 and 4 is 7.", "Answer with one number.", "def add(a, b):\n    return a + b\n"] * 4
    source = AutoTokenizer.from_pretrained(model_folder("tiny"))
    tokenizer = source.train_new_from_iterator(texts, vocab_size=2048, new_special_tokens=["</s>", "<s>", "<pad>"])
    tokenizer.eos_token, tokenizer.bos_token, tokenizer.pad_token = "</s>", "<s>", "<pad>"
    tokenizer.chat_template = OTHER_TEMPLATE
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    return str(folder)
