"""The papers' presets at their models' real shapes: training steps timed on this machine, memory counted for GPUs.

Each paper preset of ``conf/presets/`` is a paper's setting, and each paper names its models (:data:`PAPERS`:
CoLLM's Qwen3-1.7B writers and Qwen2.5-Coder-3B + Qwen3-4B-Instruct-2507 coders, MARFT's Qwen2.5-3B-Instruct,
MAPoRL's Phi-3-mini...). This script builds each model from its published architecture: the values of its
``config.json`` (:data:`ARCHITECTURES`: hidden size, layers, query and key-value heads, head size, MLP width,
vocabulary, tied embeddings, rope theta; Qwen3's q/k norms come with its class), with random weights, nothing
downloaded; it prints each model's parameter count beside the published one. The tokenizer is
``benchmarks/gpu_check.py``'s (a byte-level BPE trained on collab's writing corpus, padded with unused tokens to the
model's vocabulary, ChatML template: prompts get realistic lengths). A model is a folder of config and tokenizer
without weights; while the script runs, ``AutoModelForCausalLM.from_pretrained`` of such a folder builds the
config's model with the class's own random initialisation (:func:`random_weights`), so that every loader of collab
(the team's shared bases, full agents' copies, frozen references, critics' own bases) loads it the usual way.

steps
    A preset is composed as ``python -m collab.fit`` composes it (:func:`collab.fit.build_cli` with ``--config
    conf/presets/NAME.yaml --config OVERRIDE.yaml``; the override, written beside the report's work files, names
    the random-weight bases, agents on another model getting their own ``base`` and a CoLLM critic's model
    ``critic_spec.base``, and ``--dtype``, ``--finetune``, ``--max-new-tokens``, ``--samples`` (tasks per rollout)
    and the CPU). The presets read their publishers' files under ``data/``, which are not in the repository: the
    override takes the packaged data of the same kind instead (:data:`OFFLINE`). The composed module and datamodule
    run ``--steps`` optimizer steps under a Lightning Trainer of the script's own, without the config's callbacks:
    no held-out evaluation, checkpoints or logs. With random weights most envs give every sample of a task the same
    reward (no answer is right, every response runs to its length), MAGRPO's group advantages would be 0 and its
    update skipped: each reward gets a term in [0, 0.1) drawn from a hash of the responses' text
    (:func:`vary_rewards`; one term per joint action under a team reward), so that every update runs. Each step's
    seconds are split into phases by wrapping the module's methods (:class:`PhaseClock`; nothing is added to
    ``src/``), each second counted once, in the innermost phase: rollout (``rollout``: generation and the env's
    scoring), log-prob forwards (``prepare``, without gradients: old log-probs, references, critic values, and the
    team's log-probs taken without gradients elsewhere, MAGRPO's KL reference), loss forwards (each backward pass's
    forward: log-probs and values with gradients), backward (``manual_backward``), optimizer (clipping and AdamW),
    other (logging, freeing memory, the first update's micro-batch probe). Memory: the process's resident set
    before the run and after it, and its peak (``getrusage``); presets run in processes of their own when several
    run, so that each peak is its own. Random weights never emit the end token: every response runs to its length,
    so the timings are those of the longest rollouts.
memory
    For every preset, whether it runs here or not: each model counted on the ``meta`` device (parameters; the
    decoder's linear layers, which LoRA adapts and 4-bit quantization stores; the LoRA adapters at each agent's
    rank), and an activation estimate: collab's own probes of the bytes an update's forward keeps for the backward
    per token (``collab.runtime.memory.bytes_per_token``) and of the KV cache a token takes
    (``collab.policy.pool.Base.cache_bytes_per_token``), run on slices of 1 and 2 layers of the model (its width and
    vocabulary, weights left unset) and extrapolated to its layers, times the preset's tokens (tasks, agents, K, turns,
    prompt and new tokens). From these, the memory per GPU for 1, 2 and 8 GPUs (``--devices N``, repeatable) for
    LoRA, QLoRA and full fine-tuning under ddp and collab's fsdp (``--strategy``; :func:`project`), the weights and
    optimizer state counted by :func:`collab.runtime.projection.sharded_bytes` (what the start-of-run check counts);
    under fsdp also by part (each process's share, what a backward pass gathers whole, activations, KV cache).
    ``benchmarks/fsdp_memory.py`` measures the shares and the peak on CPU processes.

The runs of the 1.5-4B models take minutes a step on 2 cores: a benchmark, never a test. ``--smoke`` runs the same
code at a tiny shape of each model's family (hidden 64, 2 layers), short rollouts, so that tests and a laptop check
the logic in seconds (tests/benchmarks/test_paper_shapes.py); ``--meta-only`` only counts. Figures of a real run
go into docs/measurements.md with their date and machine.

    PYTHONPATH=src python benchmarks/paper_shapes.py --meta-only --out shapes.md                  # counts, ~1 min
    PYTHONPATH=src python benchmarks/paper_shapes.py --preset magrpo_writing_paper --out w.md    # a real run
    PYTHONPATH=src python benchmarks/paper_shapes.py --smoke --preset marft_a_math_paper --out /tmp/s.md
    PYTHONPATH=src python benchmarks/paper_shapes.py --meta-only --preset collm_writing_paper --strategy fsdp \
        --devices 2 --devices 4 --out fsdp.md                                                    # fsdp per GPU
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import gpu_check  # noqa: E402  (benchmarks/ is not a package: its tokenizer and report helpers)

GIB = 2**30

# -- the papers' models --------------------------------------------------------------------------------------
QWEN25_3B = dict(
    model_type="qwen2",
    hidden_size=2048,
    intermediate_size=11008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
    rope_theta=1000000.0,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
)
ARCHITECTURES = {
    "Qwen3-1.7B": dict(
        model_type="qwen3",
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
    ),
    "Qwen3-4B-Instruct-2507": dict(
        model_type="qwen3",
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
        rope_theta=5000000.0,
        max_position_embeddings=262144,
        rms_norm_eps=1e-6,
    ),
    "Qwen2.5-3B-Instruct": QWEN25_3B,
    "Qwen2.5-Coder-3B": QWEN25_3B,
    "Qwen2.5-Coder-3B-Instruct": QWEN25_3B,
    "Qwen2.5-7B-Instruct": dict(
        model_type="qwen2",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
    ),
    # the 128k model's longrope factors are left out: they change the rotary angles, not a shape
    "Phi-3-mini-128k-instruct": dict(
        model_type="phi3",
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32064,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        sliding_window=262144,
    ),
}
"""The published ``config.json`` values of each model's hub repository (Qwen/..., microsoft/...): the fields that
set its shape; the others take the config class's defaults."""
PUBLISHED = {
    "Qwen3-1.7B": 1.7e9,
    "Qwen3-4B-Instruct-2507": 4.0e9,
    "Qwen2.5-3B-Instruct": 3.09e9,
    "Qwen2.5-Coder-3B": 3.09e9,
    "Qwen2.5-Coder-3B-Instruct": 3.09e9,
    "Qwen2.5-7B-Instruct": 7.61e9,
    "Phi-3-mini-128k-instruct": 3.8e9,
}
"""Parameters as each model card states them (rounded as stated)."""
SMOKE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=4096,
    max_position_embeddings=8192,
)
"""The tiny shape of ``--smoke``: the family, head ratio (grouped or not), head size ratio and tied embeddings are the
model's own."""


class Paper(NamedTuple):
    """A preset's paper setting: its algorithm, the model of each agent, the critic's model where the paper trains
    an LLM critic on a model of its own, the packaged data it runs on here, and where the paper names the models."""

    algo: str
    agents: tuple[str, ...]
    critic: str | None
    data: str
    source: str
    preset: str | None = None
    """The preset file (``conf/presets/NAME.yaml``); None: the entry's own name."""


PAPERS = {
    "magrpo_writing_paper": Paper("magrpo", ("Qwen3-1.7B",) * 2, None, "writing", "CoLLM C.2"),
    "magrpo_coding_paper": Paper("magrpo", ("Qwen2.5-Coder-3B", "Qwen3-4B-Instruct-2507"), None, "coding", "CoLLM C.2"),
    "collm_writing_paper": Paper("collm_cc", ("Qwen3-1.7B",) * 2, "Qwen3-1.7B", "writing", "CoLLM C.2"),
    "collm_coding_paper": Paper(
        "collm_cc", ("Qwen2.5-Coder-3B", "Qwen3-4B-Instruct-2507"), "Qwen2.5-Coder-3B", "coding", "CoLLM C.2"
    ),
    "collm_minecraft_paper": Paper(
        "collm_cc",
        ("Qwen2.5-3B-Instruct", "Qwen3-4B-Instruct-2507"),
        "Qwen3-4B-Instruct-2507",
        "minecraft",
        "CoLLM C.2",
    ),
    "ippo_paper": Paper("ippo", ("Qwen2.5-3B-Instruct",) * 2, None, "aime", "MARFT 5.1 (AIME)"),
    "marft_a_aime_paper": Paper("marft_a", ("Qwen2.5-3B-Instruct",) * 2, None, "aime", "MARFT 5.1 (AIME)"),
    "marft_a_coding_paper": Paper(
        "marft_a", ("Qwen2.5-3B-Instruct",) * 2, None, "codeforces", "MARFT 5.1 (coding dynamics)"
    ),
    "marft_a_codeforces_7b": Paper(
        "marft_a",
        ("Qwen2.5-7B-Instruct",) * 2,
        None,
        "codeforces",
        "MARFT 5.1 (main CodeForces runs)",
        "marft_a_coding_paper",
    ),
    "marft_a_math_paper": Paper(
        "marft_a", ("Qwen2.5-Coder-3B-Instruct",) * 2, None, "math", "MARFT 5.1 (math dynamics)"
    ),
    "marft_a_solo_paper": Paper("marft_a", ("Qwen2.5-Coder-3B-Instruct",), None, "math", "MARFT 5.1, Fig. 9"),
    "marft_t_paper": Paper("marft_t", ("Qwen2.5-Coder-3B-Instruct",) * 2, None, "math", "MARFT 5.1 (math dynamics)"),
    "maporl_gsm8k_qlora": Paper("maporl", ("Phi-3-mini-128k-instruct",) * 2, None, "gsm8k", "MAPoRL 4.2"),
}
"""Each paper preset (and MARFT's main CodeForces model, on the coding preset) with its paper's models."""

OFFLINE = {
    "writing": {"dataset": None, "train_split": None, "eval_split": None, "eval_dataset": None},
    "coding": {"dataset": "humaneval", "train_split": None, "eval_split": None},
    "minecraft": {"dataset": None, "train_split": None, "eval_split": None},
    "aime": {"dataset": "aime", "eval_dataset": None, "train_split": "[:]", "eval_split": "[:]"},
    "codeforces": {"dataset": None, "eval_dataset": None, "train_split": None, "eval_split": None},
    "math": {"dataset": "math", "eval_dataset": None, "train_split": None, "eval_split": None},
    "gsm8k": {"dataset": "gsm8k", "eval_dataset": None, "train_split": None, "eval_split": None},
}
"""The env options that replace a preset's published files (absent here) by packaged data of the same kind: TLDR ->
collab's 64 Reddit-style posts, CoopHumanEval -> HumanEval, HouseBuild's file -> collab's houses, AIME 1983-2024
-> the 15 AIME problems of OpenAI's evals, CodeForces -> the 40 shipped problems, MARFT's MATH train -> MATH test,
TinyGSM -> GSM8K."""

PHASES = ("rollout", "log-prob forwards", "loss forwards", "backward", "optimizer", "other")
WORLDS = (1, 2, 8)
STRATEGIES = ("ddp", "fsdp")
MODES = ("lora", "qlora", "full")
HEADROOM = 0.8
"""Share of this machine's RAM a run may be projected to take to be run here (the rest: the system, other users)."""


# -- models: configs, folders, weights ---------------------------------------------------------------------
def config_values(arch: str, smoke: bool = False, **overrides) -> dict:
    """The architecture's ``config.json`` values (``smoke``: the tiny shape of its family), with ``overrides``, and
    the special tokens of the script's tokenizer (pad 0, end 2)."""
    values = dict(ARCHITECTURES[arch])
    if smoke:
        heads = values["num_attention_heads"]
        kv = max(1, SMOKE["num_attention_heads"] * values.get("num_key_value_heads", heads) // heads)
        if "head_dim" in values:  # Qwen3-4B's heads are wider than hidden / heads: so are the smoke shape's
            values["head_dim"] = 16 if values["head_dim"] * heads == values["hidden_size"] else 24
        values.update(SMOKE, num_key_value_heads=kv)
        values.pop("original_max_position_embeddings", None)
    values.update(bos_token_id=None, pad_token_id=0, eos_token_id=2, **overrides)
    return values


def make_config(arch: str, smoke: bool = False, **overrides):
    from transformers import AutoConfig

    values = config_values(arch, smoke, **overrides)
    return AutoConfig.for_model(values.pop("model_type"), **values)


def base_folder(arch: str, root: str | Path, smoke: bool = False, **overrides) -> str:
    """``root/ARCH`` (``-smoke``, ``-Nlayers``): the config and the padded tokenizer, no weights (made once)."""
    suffix = ("-smoke" if smoke else "") + "".join(f"-{v}{k.split('_')[-1]}" for k, v in sorted(overrides.items()))
    folder = Path(root) / f"{arch}{suffix}"
    if not (folder / "tokenizer.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        config = make_config(arch, smoke, **overrides)
        config.save_pretrained(folder)
        gpu_check.make_tokenizer(config.vocab_size).save_pretrained(folder)
    return str(folder)


@contextlib.contextmanager
def random_weights(init: bool = True):
    """Within: ``AutoModelForCausalLM.from_pretrained`` of a folder without weights builds its config's model with
    random weights (``init``: the class's initialisation, seeded by the folder's name, without drawing from the
    run's generators; else left unset, for probes that only count bytes). A quantized load needs weights on disk:
    the random ones are written once beside the folder (``FOLDER-weights``) and loaded from there."""
    from transformers import AutoModelForCausalLM

    load = AutoModelForCausalLM.from_pretrained.__func__

    def from_pretrained(cls, name, *args, **kwargs):
        if not (Path(name).is_dir() and not gpu_check.has_weights(str(name))):
            return load(cls, name, *args, **kwargs)
        if kwargs.get("quantization_config") is not None:
            return load(cls, written(str(name), kwargs.get("dtype")), *args, **kwargs)
        return built(str(name), kwargs.get("dtype"), init)

    AutoModelForCausalLM.from_pretrained = classmethod(from_pretrained)
    try:
        yield
    finally:
        AutoModelForCausalLM.from_pretrained = classmethod(load)


def built(folder: str, dtype, init: bool):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    if not init:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model = model.to_empty(device="cpu")
        model.tie_weights()
        return model
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(zlib.crc32(Path(folder).name.encode()))
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def written(folder: str, dtype) -> str:
    """``FOLDER-weights``: the folder's random model saved with its tokenizer (made once)."""
    import shutil

    out = Path(f"{folder}-weights")
    if not gpu_check.has_weights(str(out)):
        model = built(folder, dtype, init=True)
        model.save_pretrained(out)
        shutil.copytree(folder, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("config.json"))
        del model
    return str(out)


# -- parameter counts on the meta device -------------------------------------------------------------------
def count(arch: str, smoke: bool = False, lora_ranks: tuple[int, ...] = (8,)) -> dict:
    """The model's parameters counted on the ``meta`` device (tied weights once), split into the decoder's linear
    layers (what LoRA's ``all-linear`` adapts and bitsandbytes quantizes), the embedding and head, and the rest
    (norms); the largest unit collab's fsdp gathers at once (a decoder layer's linears, or the embedding); the
    LoRA parameters of an ``all-linear`` adapter of each rank (r x (in + out) per linear layer)."""
    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(make_config(arch, smoke), dtype=torch.bfloat16)
    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m is not head]
    total = sum(p.numel() for p in model.parameters())
    linear = sum(p.numel() for m in linears for p in m.parameters())
    embeddings = {id(p): p.numel() for m in (model.get_input_embeddings(), head) for p in m.parameters()}
    layer = max(
        sum(p.numel() for m in block.modules() if isinstance(m, nn.Linear) for p in m.parameters())
        for block in model.model.layers
    )
    return {
        "params": total,
        "linear": linear,
        "embedding": sum(embeddings.values()),
        "unit": max(layer, max(embeddings.values())),
        "lora": {r: sum(r * (m.in_features + m.out_features) for m in linears) for r in lora_ranks},
        "hidden": model.config.hidden_size,
        "layers": model.config.num_hidden_layers,
    }


# -- composing a preset --------------------------------------------------------------------------------------
class Options(NamedTuple):
    """What the command line sets for every preset."""

    dtype: str
    finetune: str
    checkpointing: bool | None
    steps: int
    samples: int | None
    max_new_tokens: int | None
    smoke: bool
    workdir: str
    device: str = "cpu"
    """cpu, or cuda (``scripts/gpu_check.sh``): where the bases go and the steps run."""


def preset_file(name: str) -> Path:
    return ROOT / "conf" / "presets" / f"{PAPERS[name].preset or name}.yaml"


def override(name: str, opt: Options) -> dict:
    """The config laid over the preset: its models as random-weight folders (agent 0's as ``model.base``, another
    agent's as its ``base``, an LLM critic's as ``critic_spec.base``), the dtype, the fine-tuning, the
    lengths and tasks, the CPU, and packaged data for the publisher's files."""
    from collab.config import load_yaml

    paper, preset = PAPERS[name], load_yaml(preset_file(name))
    folder = {a: base_folder(a, opt.workdir, opt.smoke) for a in {*paper.agents, paper.critic} - {None}}
    model = preset.get("model") or {}
    base = {**(model.get("base") or {}), "name": folder[paper.agents[0]], "dtype": opt.dtype, "device": opt.device}
    if opt.finetune != "preset":  # QLoRA is the preset's choice: lora and full train a float base
        base["quantization"] = "none"
    if opt.checkpointing is not None:
        base["gradient_checkpointing"] = opt.checkpointing
    agents = []
    for arch, spec in zip(paper.agents, model.get("agents") or [{}] * len(paper.agents)):
        spec = dict(spec, base=None if arch == paper.agents[0] else folder[arch])
        if opt.finetune != "preset":
            spec["finetune"] = opt.finetune
        if opt.max_new_tokens:
            spec["sampling"] = {**(spec.get("sampling") or {}), "max_new_tokens": opt.max_new_tokens}
        agents.append(spec)
    out = {"model": {"base": base, "agents": agents}, "data": {"env_options": env_options(name, preset)}}
    if paper.critic:  # named even on agent 0's model: the preset names it (a hub id) when it sets one
        out["model"]["critic_spec"] = {**(model.get("critic_spec") or {}), "base": folder[paper.critic]}
    if opt.samples:
        out["data"]["batch_size"] = opt.samples
    return out


def env_options(name: str, preset: dict) -> dict:
    """The preset's env options with its data files replaced by :data:`OFFLINE`'s packaged data."""
    options = dict((preset.get("data") or {}).get("env_options") or {})
    return {**options, **OFFLINE[PAPERS[name].data]}


def accelerator(opt: Options) -> str:
    return "gpu" if opt.device.startswith("cuda") else "cpu"


def compose(name: str, opt: Options):
    """The preset composed as ``python -m collab.fit --algo ALGO --config PRESET --config OVERRIDE`` composes it:
    ``(LightningCLI, command)`` (its module and datamodule built, nothing loaded)."""
    import yaml

    from collab.fit import build_cli

    path = Path(opt.workdir) / f"{name}.override.yaml"
    path.write_text(yaml.safe_dump(override(name, opt), sort_keys=False))
    args = ["--config", str(preset_file(name)), "--config", str(path)]
    args += ["--trainer.accelerator", accelerator(opt), "--trainer.logger", "false"]
    args += ["--trainer.default_root_dir", opt.workdir]
    command = f"python -m collab.fit --algo {PAPERS[name].algo} {' '.join(args)}"
    return build_cli(PAPERS[name].algo, args), command


# -- making the update run -----------------------------------------------------------------------------------
def reward_term(texts) -> float:
    """A term in [0, 0.1) drawn from a hash of ``texts``: equal texts, equal terms."""
    return (zlib.crc32("\x00".join(texts).encode()) % 1000) / 10000


def vary_rewards(env) -> None:
    """Give ``env``'s rewards a term in [0, 0.1) from a hash of the responses (one term per joint action under a team
    reward, one per response otherwise), so that the samples of one task differ: with random weights they would tie,
    and MAGRPO's group advantages with them. A debate's per-answer scores (MAPoRL's rewards) get each answer's."""
    from dataclasses import replace

    step_batch = env.step_batch

    def varied(states, actions):
        out = []
        for result, joint in zip(step_batch(states, actions), actions):
            terms = [reward_term(joint)] * len(joint) if env.joint_reward else [reward_term([a]) for a in joint]
            state = result.state
            scores = state.memory.get("scores")
            if scores:
                last = tuple(s + t for s, t in zip(scores[-1], [reward_term([a]) for a in joint]))
                state = replace(state, memory={**state.memory, "scores": (*scores[:-1], last)})
            rewards = tuple(r + t for r, t in zip(result.rewards, terms))
            out.append(replace(result, state=state, rewards=rewards))
        return out

    env.step_batch = varied


# -- timing --------------------------------------------------------------------------------------------------
class PhaseClock:
    """Seconds by phase, each second counted once, in the innermost phase running."""

    def __init__(self) -> None:
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.stack: list[list[float]] = []  # per open phase: the seconds of the phases inside it

    @contextlib.contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        self.stack.append([0.0])
        try:
            yield
        finally:
            inner = self.stack.pop()[0]
            spent = time.perf_counter() - start
            self.totals[name] += spent - inner
            if self.stack:
                self.stack[-1][0] += spent

    def timed(self, name: str, fn, when=None):
        """``fn`` counted as ``name`` (only where ``when()`` holds, when given)."""

        def wrapper(*args, **kwargs):
            if when is not None and not when():
                return fn(*args, **kwargs)
            with self.phase(name):
                return fn(*args, **kwargs)

        return wrapper

    def wrap(self, module) -> None:
        """Time ``module``'s phases (its methods replaced on the instance; the team's at its start)."""
        import torch

        module.rollout = self.timed("rollout", module.rollout)
        module.prepare = self.timed("log-prob forwards", module.prepare)
        module.manual_backward = self.timed("backward", module.manual_backward)
        module.optimizer_step = self.timed("optimizer", module.optimizer_step)
        module.skip_update = self.timed("optimizer", module.skip_update)
        terms = module.terms
        module.terms = lambda *a, **k: [self.timed("loss forwards", t) for t in terms(*a, **k)]
        self.no_grad = lambda: not torch.is_grad_enabled()


def step_callback(clock: PhaseClock, records: list[dict]):
    """A Lightning callback: each training step's (one rollout and its updates) seconds by phase, updates and RSS."""
    import lightning as L

    class Steps(L.Callback):
        def on_train_start(self, trainer, module):
            team = module.team  # built by configure_model: its no-gradient log-probs are forwards of their own
            team.logprobs = clock.timed("log-prob forwards", team.logprobs, when=clock.no_grad)

        def on_train_batch_start(self, trainer, *args):
            self.before, self.step = dict(clock.totals), trainer.global_step
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, *args):
            seconds = time.perf_counter() - self.start
            phases = {k: clock.totals[k] - self.before[k] for k in PHASES if k != "other"}
            phases["other"] = max(seconds - sum(phases.values()), 0.0)
            metrics = trainer.callback_metrics
            records.append(
                {
                    "updates": trainer.global_step - self.step,
                    "seconds": seconds,
                    "phases": phases,
                    "rollout_tokens": float(metrics["rollout/tokens"]) if "rollout/tokens" in metrics else None,
                    "trained": float(metrics["train/active_samples"]) if "train/active_samples" in metrics else None,
                    "rss_gib": rss() / GIB,
                }
            )

    return Steps()


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


# -- running a preset ----------------------------------------------------------------------------------------
def run_steps(name: str, opt: Options) -> dict:
    """``opt.steps`` optimizer steps of the preset at its models' shape, timed by phase; the result's ``status``:
    ran, refused (a collab check said no, in one line) or failed (the error)."""
    import lightning as L
    import torch

    from collab.errors import UserError

    before = rss()
    records: list[dict] = []
    cuda = opt.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        with random_weights():
            cli, command = compose(name, opt)
            module, data = cli.model, cli.datamodule
            vary_rewards(data.env)
            clock = PhaseClock()
            clock.wrap(module)
            trainer = L.Trainer(
                max_steps=opt.steps,
                max_epochs=-1,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                accelerator=accelerator(opt),
                devices=1,
                callbacks=[step_callback(clock, records)],
                default_root_dir=opt.workdir,
            )
            trainer.fit(module, data)
            status = {"status": "ran", "optimizer_steps": trainer.global_step, "command": command}
    except UserError as e:
        status = {"status": "refused", "error": str(e)}
    except Exception as e:  # noqa: BLE001 -- the report says what broke, the other presets still run
        traceback.print_exc()
        status = {"status": "failed", "error": f"{type(e).__name__}: {gpu_check.first_line(e)}"}
    return {
        **status,
        "steps": records,
        "rss_before_gib": before / GIB,
        "rss_after_gib": rss() / GIB,
        "peak_rss_gib": peak_rss() / GIB,
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / GIB if cuda else None,
    }


def run_in_child(name: str, args: argparse.Namespace) -> dict:
    """:func:`run_steps` in a process of its own (its peak RSS its own): this script with ``--child``."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    argv = [sys.executable, __file__, "--preset", name, "--child", out, "--workdir", args.workdir]
    argv += ["--dtype", args.dtype, "--finetune", args.finetune, "--steps", str(args.steps), "--device", args.device]
    argv += ["--smoke"] if args.smoke else []
    argv += [] if args.checkpointing is None else ["--checkpointing" if args.checkpointing else "--no-checkpointing"]
    argv += ["--samples", str(args.samples)] if args.samples else []
    argv += ["--max-new-tokens", str(args.max_new_tokens)] if args.max_new_tokens else []
    # its output to stderr: stdout carries the JSON lines
    proc = subprocess.run(argv, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"}, stdout=sys.stderr)
    try:
        return json.loads(Path(out).read_text())
    except (OSError, ValueError):
        return {"status": "failed", "error": f"the child process ended with exit status {proc.returncode}"}
    finally:
        Path(out).unlink(missing_ok=True)


# -- memory ----------------------------------------------------------------------------------------------------
SLICES = ((1, 1024), (2, 1024), (1, 2048))
"""(layers, vocabulary) of the probes' slices: a layer's cost from the first two, a vocabulary row's from the first and
third (the full-logits path of a full agent, whose output head trains), so that no slice holds the model's
150k-row embedding."""


@functools.lru_cache(maxsize=None)
def probe(arch: str, opt: Options, finetune: str, checkpointing: bool) -> tuple[float, float]:
    """``(activation, kv)``: bytes an update's forward keeps for the backward per token, and bytes of KV cache per
    token, of the model with ``finetune`` (lora, full): collab's own probes (``bytes_per_token``,
    ``cache_bytes_per_token``) on the :data:`SLICES` of the model (its width, weights left unset), extrapolated
    linearly to its layers and vocabulary."""
    from collab.policy.models import BaseConfig
    from collab.policy.team import AgentSpec, AgentTeam
    from collab.runtime.memory import bytes_per_token

    config = make_config(arch, opt.smoke)
    figures = []
    with random_weights(init=False):
        for layers, vocab in SLICES:
            folder = base_folder(
                arch, Path(opt.workdir) / "slices", opt.smoke, num_hidden_layers=layers, vocab_size=vocab
            )
            base = BaseConfig(name=folder, dtype=opt.dtype, device="cpu", gradient_checkpointing=checkpointing)
            team = AgentTeam([AgentSpec(finetune=finetune)], base)
            team.train()
            figures.append((bytes_per_token(team), team.agents[0].base.cache_bytes_per_token()))
            del team
    (a1, k1), (a2, k2), (a3, _) = figures
    rows = (config.vocab_size - SLICES[0][1]) / (SLICES[2][1] - SLICES[0][1])
    layers = config.num_hidden_layers - 1
    return a1 + (a2 - a1) * layers + (a3 - a1) * rows, k1 + (k2 - k1) * layers


def prompt_tokens(env, arch: str, opt: Options) -> int:
    """The longest first prompt (system and user message, chat template) of the first 8 training tasks, in the
    model's tokenizer."""
    from transformers import AutoTokenizer

    from collab.policy.models import encode_chat

    tokenizer = AutoTokenizer.from_pretrained(base_folder(arch, opt.workdir, opt.smoke))
    longest = 0
    for task in env.tasks("train")[:8]:
        for role, text in zip(env.roles, env.observe(task)):
            chat = ([{"role": "system", "content": role.system_prompt}] if role.system_prompt else []) + [
                {"role": "user", "content": text}
            ]
            longest = max(longest, len(encode_chat(tokenizer, chat)))
    return longest


def workload(module, data, env, prompt: int, centralized: bool | None) -> dict:
    """The composed preset's sizes: tasks per rollout, K, turns, new tokens per response; the longest sequence an
    agent reads and writes (its first prompt, the responses its history keeps, its response; feedback not counted)
    and a critic's (a centralized critic reads every agent's); the rows one agent decodes in the widest decoding call
    and trains on in one update (MAGRPO's tree grows K-fold a turn)."""
    specs = module.team_specs(env)
    new = max(s.sampling.max_new_tokens or module.max_new_tokens for s in specs)
    k = (getattr(module, "k", None) or getattr(env, "num_generations", 4)) if type(module).__name__ == "MAGRPO" else 1
    turns, tasks, agents = env.horizon, data.batch_size, len(env.roles)
    window = getattr(env, "history_window", None)
    kept = turns - 1 if window is None else min(turns - 1, window)
    length = prompt + (kept + 1) * new
    critic = 0 if centralized is None else length * (agents if centralized else 1)
    return {
        "tasks": tasks,
        "k": k,
        "turns": turns,
        "new_tokens": new,
        "agents": agents,
        "prompt": prompt,
        "length": length,
        "critic_length": critic,
        "decode_rows": tasks * k**turns,
        "train_rows": tasks * sum(k**t for t in range(1, turns + 1)) if k > 1 else tasks * turns,
    }


def critics(name: str, module, env, specs) -> list[tuple[str, str]]:
    """``(kind, arch)`` of each trainable critic part: an LLM critic's adapter (with its value head) on its model,
    or an MLP head on a model's frozen base."""
    paper = PAPERS[name]
    mode = getattr(module, "critic_mode", None)
    if mode == "centralized":
        return [("adapter", paper.critic or paper.agents[0])]
    if mode == "decentralized":
        return [("adapter", paper.critic or a) for a in paper.agents]
    if paper.algo in ("marft_a", "marft_t"):
        return [("head", paper.agents[0])]
    if paper.algo == "maporl":
        frozen = set(module.untrained_members(env))
        return [("head", paper.agents[m % len(paper.agents)]) for m in range(len(specs)) if m not in frozen]
    return []


def plan(name: str, opt: Options) -> dict:
    """What the preset holds per process, counted without loading a model: the models and their counts, the agents'
    and critics' trainable parameters, the frozen bases of a LoRA and of a full team, the workload's tokens, and the
    activation and KV-cache bytes per token of each agent's model (:func:`probe`, with and without gradient
    checkpointing)."""
    cli, _ = compose(name, opt)
    module, data = cli.model, cli.datamodule
    env, paper = data.env, PAPERS[name]
    specs = module.team_specs(env)
    archs = [paper.agents[i % len(paper.agents)] for i in range(len(specs))]  # MAPoRL: a member per turn and agent
    frozen = set(module.untrained_members(env)) if hasattr(module, "untrained_members") else set()
    critic_spec = getattr(module, "critic_spec", None)
    ranks = tuple({s.lora.r for s in specs} | ({critic_spec.lora.r} if critic_spec else set()))
    counts = {a: count(a, opt.smoke, ranks) for a in dict.fromkeys([*archs, *([paper.critic] if paper.critic else [])])}
    parts = critics(name, module, env, specs)
    trainable = {
        "agents": sum(counts[a]["lora"][s.lora.r] for m, (a, s) in enumerate(zip(archs, specs)) if m not in frozen),
        "critics": sum(critic_parameters(kind, counts[a], module) for kind, a in parts),
    }
    mode = getattr(module, "critic_mode", None)
    prompt = max(prompt_tokens(env, a, opt) for a in dict.fromkeys(archs))
    return {
        "algo": paper.algo,
        "agents": list(paper.agents),
        "critic": paper.critic,
        "quantization": module.base.quantization,
        "checkpointing": bool(module.base.gradient_checkpointing),
        "counts": counts,
        "trainable": trainable,
        "lora_bases": list(dict.fromkeys([*paper.agents, *[a for k, a in parts if k == "adapter"]])),
        "full_frozen": full_frozen(paper, module, parts),
        "references": references(paper, module),
        "work": workload(module, data, env, prompt, None if mode is None else mode == "centralized"),
        "per_token": {a: per_token(a, opt) for a in dict.fromkeys(paper.agents)},
    }


def critic_parameters(kind: str, counts: dict, module) -> int:
    """Parameters of one critic part: an LLM critic's adapter and value head, or an MLP head (collab's own class)."""
    from collab.policy.mlp_head import CriticHead

    if kind == "adapter":
        return counts["lora"][module.critic_spec.lora.r] + counts["hidden"] + 1
    return sum(p.numel() for p in CriticHead(counts["hidden"], module.value_head.hidden).parameters())


def per_token(arch: str, opt: Options) -> dict:
    """:func:`probe` of the model as a LoRA agent and a full agent, without and with gradient checkpointing."""
    return {
        f"{finetune}{'+ckpt' if ckpt else ''}": probe(arch, opt, finetune, ckpt)
        for finetune in ("lora", "full")
        for ckpt in (False, True)
    }


def full_frozen(paper: Paper, module, parts) -> list[str]:
    """The untrained bases a team of full agents holds beside their copies: the LLM critics' bases, the frozen base
    MARFT's and MAPoRL's heads read, and the reference of a KL term (a copy per model)."""
    return list(dict.fromkeys([a for _, a in parts] + references(paper, module)))


def references(paper: Paper, module) -> list[str]:
    """The models whose untrained reference a team of full agents keeps for a KL term (``Pool.untrained``: fsdp does
    not shard it)."""
    return list(paper.agents) if getattr(module, "kl_coef", 0) or paper.algo == "maporl" else []


def team_models(p: dict, mode: str, width: int) -> list:
    """The preset's models (projection Models), one process's whole: lora, the frozen
    bases once each at ``width`` bytes a parameter; qlora, the same with their decoder's linear layers at
    :data:`collab.policy.full.QLORA_BYTES` (not shardable); full, every agent's copy (weights, gradients, AdamW's two
    moments) and the untrained bases it still reads (a KL reference: not sharded; a critic's base: sharded)."""
    from collab.policy.full import QLORA_BYTES
    from collab.runtime.projection import Model

    counts = p["counts"]
    if mode == "full":
        models = [Model(counts[a]["params"], width, trains=True) for a in p["agents"]]
        reference = set(p.get("references", []))
        return models + [Model(counts[a]["params"], width, shardable=a not in reference) for a in p["full_frozen"]]
    if mode == "qlora":
        return [
            Model(
                1, QLORA_BYTES * counts[a]["linear"] + width * (counts[a]["params"] - counts[a]["linear"]), False, False
            )
            for a in p["lora_bases"]
        ]
    return [Model(counts[a]["params"], width) for a in p["lora_bases"]]


def state(p: dict, mode: str, strategy: str, world: int, width: int) -> tuple[int, int] | None:
    """``(held, gathered)``: bytes of weights and optimizer state one process holds, and what a backward pass gathers
    whole on top of them (:func:`collab.runtime.projection.sharded_bytes` of :func:`team_models`; None: collab refuses
    the combination). Adapters and heads train in float32: 16 bytes a parameter, whole on every process. ddp: every
    process holds everything. fsdp (collab's): each process keeps 1/world of every float model, and a backward pass
    gathers the model it uses whole (weights, and a full agent's gradients; MAPoRL's passes use every model:
    ``CollabModule.passes_per_model``); a quantized base is refused."""
    from collab.runtime.projection import ADAM_BYTES, sharded_bytes

    if strategy == "fsdp" and mode == "qlora":
        return None
    trainable = ADAM_BYTES * (p["trainable"]["critics"] + (p["trainable"]["agents"] if mode != "full" else 0))
    models = team_models(p, mode, width)
    per_model = p.get("algo") != "maporl"  # CollabModule.passes_per_model
    held, gathered = sharded_bytes(models, world if strategy == "fsdp" else 1, per_model=per_model)
    return held + trainable, gathered


def state_bytes(p: dict, mode: str, strategy: str, world: int, width: int) -> int | None:
    """The bytes of :func:`state` one process holds outside a backward pass (None: refused)."""
    held = state(p, mode, strategy, world, width)
    return None if held is None else held[0]


def activation_bytes(p: dict, mode: str, world: int, cap: float | None, checkpointing: bool) -> tuple[int, int]:
    """``(update, rollout)`` bytes per process on top of the weights. An update: the activations one forward keeps for
    its backward (collab's per-token probe times its headroom ``SAFETY``) for a term's rows of this process's share of
    the minibatch, an agent's or a critic's; a rollout: the KV cache of the widest decoding call. Each at most
    ``cap`` (collab's micro-batches and decoding parts; None: no cap), and one sequence at least (an update cannot
    split one)."""
    from collab.runtime.memory import SAFETY

    w = p["work"]
    key = ("full" if mode == "full" else "lora") + ("+ckpt" if checkpointing else "")
    act = max(p["per_token"][a][key][0] for a in p["per_token"]) * SAFETY
    kv = sum(p["per_token"][a][key][1] for a in p["per_token"]) / len(p["per_token"])
    longest = max(w["length"], w["critic_length"])
    update = act * longest * math.ceil(w["train_rows"] / world)
    rollout = kv * w["length"] * math.ceil(w["decode_rows"] * w["agents"] / world)
    if cap is not None:
        update, rollout = max(min(update, cap), act * longest), max(min(rollout, cap), kv * w["length"])
    return int(update), int(rollout)


def project(
    p: dict,
    mode: str,
    strategy: str,
    world: int,
    width: int,
    gpu_bytes: float | None,
    checkpointing: bool | None = None,
) -> int | None:
    """Bytes per GPU: the weights and optimizer state (:func:`state`) and the larger of an update's activations
    (with what an fsdp backward pass gathers whole) and a rollout's KV cache (they are not alive together), capped
    as collab caps them on a GPU of ``gpu_bytes`` (a quarter of its memory each); ``checkpointing`` None: the
    preset's."""
    held = state(p, mode, strategy, world, width)
    if held is None:
        return None
    ckpt = p["checkpointing"] if checkpointing is None else checkpointing
    update, rollout = activation_bytes(p, mode, world, None if gpu_bytes is None else gpu_bytes / 4, ckpt)
    return held[0] + max(update + held[1], rollout)


def cpu_bytes(p: dict, opt: Options) -> int:
    """The preset's run on this machine's CPU, projected: 1 process, its fine-tuning, collab's CPU caps (1/16 of the
    RAM, at most 1 GiB, of activations or KV cache; one sequence at least) and 1 GiB for Python, torch and the rest."""
    import torch

    from collab.runtime.memory import budget_bytes

    mode = "full" if opt.finetune == "full" else "qlora" if p["quantization"] != "none" else "lora"
    state = state_bytes(p, mode, "ddp", 1, gpu_check.BYTES[opt.dtype])
    update, rollout = activation_bytes(p, mode, 1, budget_bytes(torch.device("cpu"), None), p["checkpointing"])
    return state + max(update, rollout) + GIB


def fits_here(p: dict, opt: Options) -> bool:
    """Whether :func:`cpu_bytes` is within :data:`HEADROOM` of this machine's RAM."""
    from collab.runtime.memory import total_ram

    return cpu_bytes(p, opt) <= HEADROOM * total_ram()


# -- the report ----------------------------------------------------------------------------------------------
def gb(n: float | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def architectures_section(names: list[str], smoke: bool) -> list[str]:
    rows = []
    for arch in dict.fromkeys(a for n in names for a in (*PAPERS[n].agents, PAPERS[n].critic) if a):
        v, c = config_values(arch, smoke), count(arch, smoke)
        heads = f"{v['num_attention_heads']}/{v.get('num_key_value_heads', v['num_attention_heads'])}"
        head_dim = v.get("head_dim", v["hidden_size"] // v["num_attention_heads"])
        published = PUBLISHED[arch]
        off = "-" if smoke else f"{100 * (c['params'] / published - 1):+.1f}%"
        rows.append(
            [
                arch,
                v["model_type"],
                v["hidden_size"],
                v["num_hidden_layers"],
                heads,
                head_dim,
                v["intermediate_size"],
                v["vocab_size"],
                v["tie_word_embeddings"],
                f"{v['rope_theta']:g}",
                f"{c['params']:,}",
                f"{published / 1e9:g}B",
                off,
            ]
        )
    shape = "the smoke shape of each family" if smoke else "each model's published config.json"
    return [
        f"Counted on the meta device at {shape}; the published size is the model card's.",
        "",
        *gpu_check.table(
            [
                "model",
                "family",
                "hidden",
                "layers",
                "heads/kv",
                "head dim",
                "MLP",
                "vocabulary",
                "tied",
                "rope theta",
                "parameters",
                "published",
                "off by",
            ],
            rows,
        ),
    ]


def presets_section(plans: dict) -> list[str]:
    rows = []
    for name, p in plans.items():
        w = p["work"]
        rows.append(
            [
                name,
                p["algo"],
                " + ".join(p["agents"]),
                p["critic"] or "-",
                PAPERS[name].source,
                PAPERS[name].data,
                w["tasks"],
                w["k"],
                w["turns"],
                w["new_tokens"],
                w["prompt"],
                w["length"],
                w["critic_length"] or "-",
            ]
        )
    return [
        "Tokens in this script's tokenizer (a BPE of 8192 merges: longer than Qwen's own on code and math); a "
        "sequence: the first prompt, the responses the history keeps and the response (feedback not counted); a "
        "centralized critic reads every agent's.",
        "",
        *gpu_check.table(
            [
                "preset",
                "algo",
                "agents' models",
                "LLM critic's model",
                "paper",
                "data here",
                "tasks",
                "K",
                "turns",
                "new tokens",
                "first prompt",
                "longest sequence",
                "critic's sequence",
            ],
            rows,
        ),
    ]


STEP_COLUMNS = ["status", "optimizer steps", "s/step", *PHASES, "peak RSS", "RSS before", "RSS after", "peak GPU"]


def step_row(r: dict) -> list:
    """A run's cells under :data:`STEP_COLUMNS`: seconds per optimizer step by phase, GiB of memory."""
    if r["status"] != "ran":
        return [r["status"], *["-"] * (len(STEP_COLUMNS) - 1)]
    updates = max(1, r["optimizer_steps"])
    total = sum(s["seconds"] for s in r["steps"])
    phases = [sum(s["phases"][k] for s in r["steps"]) / updates for k in PHASES]
    gpu = r.get("peak_gpu_gib")
    return [
        "ran",
        r["optimizer_steps"],
        f"{total / updates:.1f}",
        *[f"{x:.2f}" for x in phases],
        *[f"{r[k]:.2f}" for k in ("peak_rss_gib", "rss_before_gib", "rss_after_gib")],
        "-" if gpu is None else f"{gpu:.2f}",
    ]


def steps_section(runs: dict) -> list[str]:
    rows = [[name, *step_row(r)] for name, r in runs.items()]
    lines = [f"- {name}: {r['status']}: {r.get('error', '')}" for name, r in runs.items() if r["status"] != "ran"]
    return [
        "Seconds per optimizer step (a rollout's seconds spread over the updates it feeds), by phase; resident memory "
        "and the GPU's peak allocation in GiB.",
        "",
        *gpu_check.table(["preset", *STEP_COLUMNS], rows),
        *([""] + lines if lines else []),
    ]


def memory_section(plans: dict, dtype: str) -> list[str]:
    width, rows = gpu_check.BYTES[dtype], []
    for name, p in plans.items():
        params = sum(p["counts"][a]["params"] for a in dict.fromkeys(p["agents"]))
        tok = {k: max(p["per_token"][a][k][0] for a in p["per_token"]) / 2**10 for k in ("lora", "full", "lora+ckpt")}
        kv = max(p["per_token"][a]["lora"][1] for a in p["per_token"]) / 2**10
        update, rollout = activation_bytes(p, "lora", 1, None, p["checkpointing"])
        one, _ = activation_bytes(p, "lora", 1, 0, p["checkpointing"])
        rows.append(
            [
                name,
                f"{params / 1e9:.2f}B",
                gb(state_bytes(p, "lora", "ddp", 1, width)),
                f"{(p['trainable']['agents'] + p['trainable']['critics']) / 1e6:.1f}M",
                gb(state_bytes(p, "full", "ddp", 1, width)),
                *[f"{tok[k]:.0f}" for k in tok],
                f"{kv:.0f}",
                gb(one),
                gb(update),
                gb(rollout),
            ]
        )
    return [
        f"Per process, {dtype}, GiB unless said. Parameters: the agents' distinct models. LoRA: the frozen bases once "
        "(the critics' too) and the adapters and heads with their gradients and AdamW moments (16 bytes a parameter); "
        "full: each agent's copy at 4 x the dtype's bytes (weights, gradients, two moments) and the untrained bases it "
        "still reads. Activations: KiB a token that an update's forward keeps for the backward (collab's probe; "
        "ckpt: with gradient checkpointing), and the KV cache a token takes; GiB of activations (with collab's "
        "headroom of 1.5) of the longest sequence, of a term's rows of the whole minibatch in one pass, and the KV "
        "cache of the widest decoding call, before collab's micro-batch and decoding caps (LoRA, the preset's "
        "checkpointing). A 4-bit base's activations are taken as a float base's (bitsandbytes keeps the same inputs).",
        "",
        *gpu_check.table(
            [
                "preset",
                "parameters",
                "LoRA weights+state",
                "trainable (LoRA)",
                "full weights+state",
                "act KiB/token (LoRA)",
                "(full)",
                "(LoRA, ckpt)",
                "KV KiB/token",
                "one sequence",
                "update in one pass",
                "rollout KV cache",
            ],
            rows,
        ),
    ]


def projection_section(plans: dict, dtype: str, gpu_gib: float, strategies=STRATEGIES, worlds=WORLDS) -> list[str]:
    width, gpu = gpu_check.BYTES[dtype], gpu_gib * GIB
    rows = []
    for name, p in plans.items():
        for mode in MODES:
            cells = [project(p, mode, strategy, w, width, gpu) for strategy in strategies for w in worlds]
            ckpt = project(p, mode, "ddp", 1, width, gpu, checkpointing=True)
            rows.append([name, mode, *[gb(c) if c is not None else "refused" for c in cells], gb(ckpt)])
    return [
        f"GiB per GPU on a {gpu_gib:g} GiB GPU, {dtype}: weights and optimizer state, plus the larger of an update's "
        "activations and a rollout's KV cache, each at most a quarter of the GPU (collab's default micro-batch and "
        "decoding budgets there) but one sequence at least; the tasks split over the processes; the preset's "
        "gradient checkpointing (the last column: with it). ddp: every process holds every base, adapter and full "
        "agent. fsdp is collab's: each process keeps 1/N of every float model (a full agent's weights, gradients and "
        "moments; a frozen base's weights), and a backward pass gathers the model it uses whole on top (MAPoRL's: "
        "every model), alive with the update's activations (weights, and a full agent's gradients: Lockstep.backward); "
        "it refuses a quantized base (QLoRA). Not counted: the CUDA context and allocator slack (about 1 GiB).",
        "",
        *gpu_check.table(
            [
                "preset",
                "fine-tuning",
                *[f"{s} {w} GPU" for s in strategies for w in worlds],
                "ddp 1 GPU, checkpointing",
            ],
            rows,
        ),
    ]


def fsdp_section(plans: dict, dtype: str, gpu_gib: float, worlds=WORLDS) -> list[str]:
    """Each preset's projection per GPU under collab's fsdp, by part."""
    width, gpu = gpu_check.BYTES[dtype], gpu_gib * GIB
    rows = []
    for name, p in plans.items():
        for mode in ("lora", "full"):
            for w in worlds:
                held, gathered = state(p, mode, "fsdp", w, width)
                update, rollout = activation_bytes(p, mode, w, gpu / 4, p["checkpointing"])
                total = project(p, mode, "fsdp", w, width, gpu)
                rows.append([name, mode, w, *map(gb, (held, gathered, update, rollout, total))])
    return [
        f"GiB per GPU under --trainer.strategy fsdp, {dtype}, a {gpu_gib:g} GiB GPU: held (each model's 1/N share: a "
        "full agent's weights, gradients and AdamW moments, a frozen base's weights; adapters and heads whole), what "
        "a backward pass gathers whole on top (the model the pass uses, MAPoRL's every model: weights, and a full "
        "agent's gradients), an "
        "update's activations and a rollout's KV cache (capped as above); the total is held + the larger of "
        "gathered + activations and the KV cache (collab.runtime.projection.sharded_bytes).",
        "",
        *gpu_check.table(
            ["preset", "fine-tuning", "GPUs", "held", "gathered in backward", "activations", "KV cache", "total"],
            rows,
        ),
    ]


def header(args, mode: str) -> list[str]:
    import torch

    from collab.runtime.memory import total_ram

    names = ("torch", "transformers", "peft", "lightning", "collab")
    versions = ", ".join(f"{n} {gpu_check.version(n)}" for n in names)
    checkpointing = "the preset's" if args.checkpointing is None else str(args.checkpointing).lower()
    return [
        "# collab presets at their papers' shapes",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: CPU ({platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads), "
        f"{total_ram() / GIB:.1f} GiB RAM",
        f"- versions: {versions}; Python {platform.python_version()}",
        f"- mode: {mode}; {args.dtype}; fine-tuning: {args.finetune}; gradient checkpointing: {checkpointing}; "
        f"{args.steps} optimizer steps",
    ]


def write_report(args, mode: str, plans: dict, runs: dict, skipped: dict) -> str:
    lines = header(args, mode)
    lines += ["", "## Models", "", *architectures_section(list(plans), args.smoke)]
    lines += ["", "## Presets", "", *presets_section(plans)]
    if runs:
        lines += ["", "## Training steps", "", *steps_section(runs)]
    lines += ["", "## Memory", "", *memory_section(plans, args.dtype)]
    strategies, worlds = args.strategy or STRATEGIES, tuple(args.devices or WORLDS)
    lines += ["", "## Projected memory per GPU", ""]
    lines += projection_section(plans, args.dtype, args.gpu_gib, strategies, worlds)
    if "fsdp" in strategies:
        lines += ["", "## Projected memory per GPU under fsdp, by part", ""]
        lines += fsdp_section(plans, args.dtype, args.gpu_gib, worlds)
    lines += ["", "## Not run here", ""]
    lines += [f"- {n}: {why}" for n, why in skipped.items()] or ["- none: every preset ran"]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    return text


def json_line(name: str, p: dict, run: dict | None, args) -> str:
    width = gpu_check.BYTES[args.dtype]
    worlds = tuple(args.devices or WORLDS)
    projected = {
        f"{mode}/{strategy}": [project(p, mode, strategy, w, width, args.gpu_gib * GIB) for w in worlds]
        for mode in MODES
        for strategy in args.strategy or STRATEGIES
    }
    slim = {k: v for k, v in p.items() if k not in ("per_token",)}
    return json.dumps({"preset": name, **slim, "projected_bytes": projected, "run": run}, default=str)


# -- command line -----------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", choices=list(PAPERS), help="(repeatable; default: every paper preset)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="(default: %(default)s)")
    ap.add_argument(
        "--finetune",
        default="preset",
        choices=["lora", "full", "preset"],
        help="every agent's fine-tuning (preset: as the preset composes it; default)",
    )
    ap.add_argument(
        "--checkpointing",
        action=argparse.BooleanOptionalAction,
        help="gradient checkpointing of every base (default: the preset's)",
    )
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps a run (default: %(default)s)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where steps run (default: %(default)s)")
    ap.add_argument("--samples", type=int, help="tasks a rollout (data.batch_size; default: the preset's, 2 smoke)")
    ap.add_argument("--max-new-tokens", type=int, help="each response's length (default: the preset's, 8 smoke)")
    ap.add_argument("--meta-only", action="store_true", help="count and project only: no training step")
    ap.add_argument("--smoke", action="store_true", help="a tiny shape of each model's family: checks the logic")
    ap.add_argument(
        "--run",
        choices=["fits", "all"],
        default="fits",
        help="which presets take steps: those projected to fit this machine's RAM (default), or all given",
    )
    ap.add_argument("--gpu-gib", type=float, default=80.0, help="the GPU of the projection (default: %(default)s)")
    ap.add_argument(
        "--strategy", action="append", choices=list(STRATEGIES), help="the projection's strategies (default: both)"
    )
    ap.add_argument(
        "--devices", type=int, action="append", help=f"GPUs of the projection (repeatable; default: {WORLDS})"
    )
    ap.add_argument("--out", default="paper_shapes.md", help="the markdown report (default: %(default)s)")
    ap.add_argument("--workdir", help="the models' folders and overrides (default: a temporary folder)")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # a preset's run in a process of its own: its JSON here
    args = ap.parse_args(argv)
    args.preset = args.preset or list(PAPERS)
    if args.smoke:
        args.samples = args.samples or 2
        args.max_new_tokens = args.max_new_tokens or 8
    return args


def options(args) -> Options:
    return Options(
        args.dtype,
        args.finetune,
        args.checkpointing,
        args.steps,
        args.samples,
        args.max_new_tokens,
        args.smoke,
        args.workdir,
        args.device,
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    keep = args.workdir is not None
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="collab-paper-shapes-")
    opt = options(args)
    if args.child:  # one preset's steps, for the parent's report
        with contextlib.redirect_stdout(sys.stderr):
            Path(args.child).write_text(json.dumps(run_steps(args.preset[0], opt)))
        return 0
    mode = "meta-only" if args.meta_only else "smoke (a tiny shape of each family)" if args.smoke else "real shapes"
    plans, runs, skipped = {}, {}, {}
    try:
        for name in args.preset:
            print(f"paper_shapes: counting {name}...", file=sys.stderr, flush=True)
            plans[name] = plan(name, opt)
        for name in args.preset:
            here = f"{gb(cpu_bytes(plans[name], opt))} GiB projected on this machine's CPU"
            if args.meta_only:
                skipped[name] = f"--meta-only ({here}: {'fits' if fits_here(plans[name], opt) else 'does not fit'})"
            elif args.run == "fits" and not fits_here(plans[name], opt):
                skipped[name] = f"{here}, more than {HEADROOM:.0%} of its RAM (counted only; --run all tries it)"
            else:
                print(f"paper_shapes: {args.steps} steps of {name}...", file=sys.stderr, flush=True)
                if len(args.preset) == 1:
                    with contextlib.redirect_stdout(sys.stderr):  # collab's lines: stdout carries the JSON lines
                        runs[name] = run_steps(name, opt)
                else:
                    runs[name] = run_in_child(name, args)
        for name, p in plans.items():
            print(json_line(name, p, runs.get(name), args), flush=True)
        write_report(args, mode, plans, runs, skipped)
    finally:
        if not keep:
            import shutil

            shutil.rmtree(args.workdir, ignore_errors=True)
    return 1 if any(r["status"] == "failed" for r in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
