"""The GPU path measured in one run: a Qwen2-1.5B-shaped team of 2 LoRA agents, random weights, bf16, on CUDA.

``scripts/gpu_check.sh`` runs this after installing what it can and after ``pytest -m gpu``; it can also run
alone. Nothing is downloaded: the base is ``Qwen2ForCausalLM`` built from a config of Qwen2-1.5B's shape
(hidden 1536, 28 layers, 12 query / 2 key-value heads, intermediate 8960, vocabulary 151936, tied embeddings),
its weights drawn by the class's own initialisation on the device. The tokenizer is made here too: a byte-level
BPE trained on collab's writing corpus, ChatML-style chat template, its vocabulary padded with unused tokens to
the model's. The folder the team loads holds that config and tokenizer and no weights; while this script runs,
``collab.policy.pool.load_model`` builds such a folder's model with random weights (:func:`random_weights`: the
module tree ``from_pretrained`` would give, so every forward does the same work); a folder with weights loads
as usual. The QLoRA and vLLM parts need weights on disk, so they write the random model once (3 GiB).

Parts, each measured only where it can run (the report's "Could not run" list says why the others did not):

rollout
    2 agents x ``--samples`` samples x ``--new-tokens`` tokens (temperature 0.8, top-p 0.95) after
    ``benchmarks/rollout.py``'s prompts: collab's ``team.generate`` (one batched loop for both agents)
    against HF ``generate`` per agent (``set_adapter``, ``num_return_sequences``), timed alternately after
    one warm-up each; tokens counted up to the first EOS. LoRA B is random, so the adapters change the model.
steps
    One MAGRPO step (writing env, 2 posts x 2 agents x ``--samples``) and one MARFT-A step (math env, duo
    profile, ``--problems`` problems): the real modules (``collab.algos.from_config``) under a Lightning
    ``Trainer``, their packaged defaults but the agents' sampling and length. Two steps each; the first is
    a warm-up (it also sizes the auto micro-batches), the second is reported: its seconds (rollout + update:
    Lightning's batch hooks), the rollout's part, and ``torch.cuda.max_memory_allocated`` over it (the weights
    included; "at start" is what was allocated when it began: weights, adapters, optimizer state).
qlora
    The MAGRPO step with the base loaded in 4-bit NF4 (``--model.base.quantization 4bit``), where
    bitsandbytes imports.
vllm
    The rollout through collab's vLLM engine (one engine, a LoRA adapter per agent), where vllm imports; the
    behaviour log-probs' recomputation by the training model is timed apart.
fit
    The largest Qwen2-shaped base (1.5B, 3B, 7B, 14B, 32B, 72B: Qwen2 / Qwen2.5 configs) with which one MAGRPO
    step of the "steps" part runs. Each is first built on the ``meta`` device to count its parameters; one
    whose bf16 weights alone exceed the free GPU memory is not tried, the others are allocated and stepped in
    increasing size until one runs out of memory.

A part that fails (rather than being unavailable) is listed as "failed" with its error, after the others ran;
the exit status is then 1. Modes: the default measures the 1.5B shape on CUDA; ``--quick`` does less of each
(1 repeat, 4 samples, 32 tokens; the fit search stops at 14B); ``--cpu-smoke`` runs the same code on the CPU at a
tiny shape (hidden 64, 2 layers, vocabulary 4096; fit: the real shapes counted on ``meta``, only the tiny one
stepped) so that a machine without a GPU checks the script's logic (tests/benchmarks/test_gpu_check.py). Figures
of a real run go into docs/measurements.md with their date and device.

    bash scripts/gpu_check.sh --out gpu_check.md                                   # install, pytest -m gpu, this
    PYTHONPATH=src python benchmarks/gpu_check.py --out gpu_check.md [--quick]     # this alone, on a GPU machine
    PYTHONPATH=src .venv/bin/python benchmarks/gpu_check.py --cpu-smoke --out /tmp/gpu_check.md   # ~20 s, no GPU
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import gc
import importlib
import importlib.util
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIB = 2**30
BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
PARTS = ("rollout", "steps", "qlora", "vllm", "fit")

SHAPES = {
    # hidden, layers, query heads, key-value heads, intermediate, vocabulary, tied embeddings
    "tiny": (64, 2, 4, 2, 128, 4096, True),
    "1.5B": (1536, 28, 12, 2, 8960, 151936, True),  # Qwen2-1.5B
    "3B": (2048, 36, 16, 2, 11008, 151936, True),  # Qwen2.5-3B
    "7B": (3584, 28, 28, 4, 18944, 152064, False),  # Qwen2-7B
    "14B": (5120, 48, 40, 8, 13824, 152064, False),  # Qwen2.5-14B
    "32B": (5120, 64, 40, 8, 27648, 152064, False),  # Qwen2.5-32B
    "72B": (8192, 80, 64, 8, 29568, 152064, False),  # Qwen2-72B
}
"""Qwen2 shapes by name (the published configs' sizes; their parameter counts are the published ones)."""
FIT = ("1.5B", "3B", "7B", "14B", "32B", "72B")
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""The tokenizer's pad, turn-start and end tokens: ids 0, 1, 2 (the model's pad and EOS are 0 and 2)."""
CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class Unavailable(Exception):
    """A part that cannot run here; the message says why (it goes into the report's "Could not run" list)."""


# -- the base: config, tokenizer, weights ------------------------------------------------------------------
def qwen2_config(shape: str, **overrides):
    from transformers import Qwen2Config

    hidden, layers, heads, kv, inter, vocab, tied = SHAPES[shape]
    options = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        max_position_embeddings=32768,
        bos_token_id=None,
        pad_token_id=0,
        eos_token_id=2,
    )
    return Qwen2Config(**{**options, **overrides})


@functools.lru_cache(maxsize=None)
def parameter_count(shape: str) -> int:
    """Parameters of the shape's model, built on the ``meta`` device (no memory; tied weights once)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(qwen2_config(shape), dtype=torch.bfloat16)
    return sum(p.numel() for p in model.parameters())


def make_tokenizer(vocab_size: int):
    """A byte-level BPE trained on collab's writing corpus (at most 8192 tokens), padded with ``<unusedN>`` tokens
    to ``vocab_size``, ChatML template: prompts get realistic lengths without downloading a tokenizer.

    The padding tokens are added tokens, each the one token its text encodes to: a random model samples them
    about 19 times in 20 at a 151,936-row vocabulary, and a multi-turn episode encodes its history from the
    responses' text, which is then as long in tokens as the responses were (a real model's reply encodes again
    to about its length). As entries of the BPE's own vocabulary they would not be: each one's text, 11-14
    characters, encodes to about 10 BPE tokens, and every later turn's prompt grew ~10x what was generated."""
    from importlib.resources import files

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = (files("collab") / "data" / "writing_corpus.jsonl").read_text().splitlines()
    texts = [json.loads(line)["prompt"] for line in corpus if line.strip()]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=min(vocab_size, 8192),
            special_tokens=list(SPECIAL),
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token=SPECIAL[0], eos_token=SPECIAL[2])
    tokenizer.add_tokens([f"<unused{i}>" for i in range(len(tokenizer), vocab_size)])
    tokenizer.chat_template = CHAT
    return tokenizer


def base_folder(shape: str, root: str | Path, **overrides) -> str:
    """``root/shape``: the shape's config (``overrides`` replacing some of its fields) and tokenizer, no weights
    (made once)."""
    folder = Path(root) / shape
    if not (folder / "tokenizer.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        qwen2_config(shape, **overrides).save_pretrained(folder)
        make_tokenizer(SHAPES[shape][5]).save_pretrained(folder)
    return str(folder)


def weights_folder(shape: str, root: str | Path, dtype: str = "float32", device: str = "cpu", **overrides) -> str:
    """``root/shape-weights``: :func:`base_folder` with the random weights written (seed 0), for what loads from
    disk (4-bit quantization, vLLM, ``collab.policy.models.load_model``); made once."""
    from collab.policy.models import BaseConfig

    folder = Path(root) / f"{shape}-weights"
    if not has_weights(str(folder)):
        source = base_folder(shape, Path(root) / "configs", **overrides)
        model = random_model(BaseConfig(name=source, dtype=dtype, device=device))
        model.save_pretrained(folder)
        shutil.copytree(source, folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns("config.json"))
        del model
        free_memory()
    return str(folder)


def has_weights(folder: str) -> bool:
    return any(Path(folder).glob("*.safetensors")) or any(Path(folder).glob("*.bin"))


def random_model(config):
    """What ``collab.policy.models.load_model`` returns for ``config`` (a folder without weights): the class's
    own random initialisation, drawn on the device from the config's seed, frozen, in eval mode."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from collab.policy.devices import resolve_device
    from collab.policy.models import DTYPES

    if config.quantization != "none":
        raise Unavailable(f"{config.quantization} quantization needs weights on disk ({config.name} has none)")
    torch.manual_seed(config.seed)
    with resolve_device(config.device):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config.name), dtype=DTYPES[config.dtype])
    model.requires_grad_(False)
    return model.eval()


@contextlib.contextmanager
def random_weights():
    """Within: a team whose base folder holds no weights gets :func:`random_model` (others load as usual)."""
    import collab.policy.pool as pool

    load = pool.load_model
    pool.load_model = lambda config: (
        random_model(config) if Path(config.name).is_dir() and not has_weights(config.name) else load(config)
    )
    try:
        yield
    finally:
        pool.load_model = load


# -- measuring ---------------------------------------------------------------------------------------------
class Context:
    """What every part needs: the settings, the device, and the report being written (a plain class, not a
    dataclass: tests load this script without registering it as a module, which dataclasses need)."""

    def __init__(
        self,
        *,
        shape: str,
        device: str,
        dtype: str,
        samples: int,
        new_tokens: int,
        repeats: int,
        problems: int,
        fit_shapes: tuple[str, ...],
        fit_run: tuple[str, ...],
        workdir: str,
    ) -> None:
        self.shape, self.device, self.dtype, self.workdir = shape, device, dtype, workdir
        self.samples, self.new_tokens, self.repeats, self.problems = samples, new_tokens, repeats, problems
        self.fit_shapes, self.fit_run = fit_shapes, fit_run
        self.sections: dict[str, list[str]] = {}
        """The report's sections by title: their lines."""
        self.missing: list[tuple[str, str]] = []
        """(part, why) of what could not run."""

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


def sync(ctx: Context) -> None:
    if ctx.cuda:
        import torch

        torch.cuda.synchronize()


def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def rollout_module():
    """``benchmarks/rollout.py``: its prompts and its timed collab / HF / vLLM rollouts."""
    sys.path.insert(0, str(HERE))
    import rollout

    return rollout


def agent_specs(ctx: Context, temperature: float, top_p: float):
    from collab.policy.team import AgentSpec, SamplingSpec

    return [
        AgentSpec(sampling=SamplingSpec(temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=ctx.new_tokens))
        for _ in range(2)
    ]


def rollout_team(ctx: Context, name: str):
    """2 agents on ``name`` with rollout.py's roles and prompts, LoRA B random (so that adapters matter)."""
    import torch

    from collab.policy.models import BaseConfig
    from collab.policy.team import AgentTeam

    bench = rollout_module()
    specs = agent_specs(ctx, 0.8, 0.95)
    for spec, (role, system) in zip(specs, bench.ROLES):
        spec.role, spec.system_prompt = role, system
    team = AgentTeam(specs, BaseConfig(name=name, dtype=ctx.dtype, device=ctx.device))
    with torch.no_grad():
        for model in team.models.values():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0.0, 0.01)
    prompts = [
        team.encode(i, [{"role": "system", "content": s.system_prompt}, {"role": "user", "content": bench.TASK}])
        for i, s in enumerate(specs)
    ]
    return team, prompts


def timed_rollouts(ctx: Context, team, prompts, methods: dict) -> dict[str, list[tuple[int, float]]]:
    """(tokens, seconds) of each method's rollouts: one warm-up each, then ``repeats`` in rotating order."""
    import torch

    for fn in methods.values():
        fn(team, prompts, 1, 4)
    runs: dict[str, list[tuple[int, float]]] = {m: [] for m in methods}
    names = list(methods)
    for r in range(ctx.repeats):
        for m in names[r % len(names) :] + names[: r % len(names)]:
            torch.manual_seed(1 + r)
            sync(ctx)
            start = time.perf_counter()
            tokens = methods[m](team, prompts, ctx.samples, ctx.new_tokens)
            sync(ctx)
            runs[m].append((tokens, time.perf_counter() - start))
    return runs


def rollout_rows(runs: dict[str, list[tuple[int, float]]], labels: dict[str, str]) -> list[list]:
    rate = {m: statistics.median(t / s for t, s in v) for m, v in runs.items()}
    first = next(iter(rate))
    return [
        [
            labels[m],
            sum(t for t, _ in v),
            f"{sum(s for _, s in v):.2f}",
            f"{rate[m]:.1f}",
            f"{rate[m] / rate[first]:.2f}",
        ]
        for m, v in runs.items()
    ]


def part_rollout(ctx: Context) -> None:
    bench = rollout_module()
    with random_weights():
        team, prompts = rollout_team(ctx, base_folder(ctx.shape, ctx.workdir))
    runs = timed_rollouts(ctx, team, prompts, {"collab": bench.run_collab, "hf": bench.run_loop})
    ctx.sections["Rollout"] = [
        f"2 agents x {ctx.samples} samples x {ctx.new_tokens} new tokens, prompts of {[len(p) for p in prompts]} "
        f"tokens, temperature 0.8, top-p 0.95; {ctx.repeats} timed repeat(s) after a warm-up; tokens/s: the median.",
        "",
        *table(
            ["engine", "tokens", "seconds", "tokens/s", "x collab"],
            rollout_rows(
                runs, {"collab": "collab team.generate (both agents batched)", "hf": "HF generate, one agent at a time"}
            ),
        ),
    ]
    del team
    free_memory()


class StepClock:
    """A Lightning callback: seconds, peak allocated memory and the rollout's seconds of every training step."""

    def __init__(self, cuda: bool) -> None:
        import lightning as L

        self.cuda, self.steps = cuda, []
        clock = self

        class Callback(L.Callback):
            def on_train_batch_start(self, *args):
                import torch

                if clock.cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                clock.at_start = torch.cuda.memory_allocated() if clock.cuda else None
                clock.start = time.perf_counter()

            def on_train_batch_end(self, trainer, *args):
                import torch

                if clock.cuda:
                    torch.cuda.synchronize()
                metrics = trainer.callback_metrics
                clock.steps.append(
                    {
                        "seconds": time.perf_counter() - clock.start,
                        "at_start": clock.at_start,
                        "peak": torch.cuda.max_memory_allocated() if clock.cuda else None,
                        "rollout": float(metrics["rollout/seconds"]) if "rollout/seconds" in metrics else None,
                        "tokens": float(metrics["rollout/tokens"]) if "rollout/tokens" in metrics else None,
                        "trained": float(metrics["train/active_samples"])
                        if "train/active_samples" in metrics
                        else None,
                    }
                )

        self.callback = Callback()


MAGRPO_KL = 0.01


def algo_step(ctx: Context, algo: str, base, steps: int = 2) -> dict:
    """``steps`` training steps of ``algo`` (magrpo on writing, marft_a on math) under a Lightning Trainer;
    the last step's figures."""
    import lightning as L

    from collab.algos import data_from_config, from_config

    env, tasks = {"magrpo": ("writing", 2), "marft_a": ("math", ctx.problems)}[algo]
    # random weights give every writing sample the same reward, so no group-relative advantage is nonzero and
    # MAGRPO's update would skip every sample (only the rollout measured): a small KL penalty makes every sample
    # train, with the reference forward it costs
    options = {"num_generations": ctx.samples, "kl_coef": MAGRPO_KL} if algo == "magrpo" else {}
    module = from_config(algo, base=base, agents=agent_specs(ctx, 0.7, 0.9), **options)
    data = data_from_config(algo, env=env, batch_size=tasks, seed=0)
    clock = StepClock(ctx.cuda)
    trainer = L.Trainer(
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="gpu" if ctx.cuda else "cpu",
        devices=1,
        callbacks=[clock.callback],
        default_root_dir=ctx.workdir,
    )
    with random_weights():
        trainer.fit(module, data)
    attn = module.team.model_of(0).config._attn_implementation
    del trainer, module, data
    free_memory()
    return {**clock.steps[-1], "attn": attn, "env": env, "tasks": tasks}


def step_row(label: str, s: dict) -> list:
    rollout = "-" if s["rollout"] is None else f"{s['rollout']:.2f}"
    tokens = "-" if s["tokens"] is None else f"{s['tokens']:.0f}"
    trained = "-" if s["trained"] is None else f"{s['trained']:.0f}"
    return [
        label,
        f"{s['env']} x {s['tasks']}",
        f"{s['seconds']:.2f}",
        rollout,
        tokens,
        trained,
        gib(s["at_start"]),
        gib(s["peak"]),
    ]


STEP_HEADER = [
    "step",
    "env x tasks",
    "seconds",
    "of which rollout",
    "rollout tokens",
    "samples trained",
    "GiB at start",
    "peak GiB (CUDA)",
]


def part_steps(ctx: Context) -> None:
    from collab.policy.models import BaseConfig

    base = BaseConfig(name=base_folder(ctx.shape, ctx.workdir), dtype=ctx.dtype)
    magrpo, marft = algo_step(ctx, "magrpo", base), algo_step(ctx, "marft_a", base)
    ctx.sections["Training steps"] = [
        f"The real modules under Lightning, 2 steps each, the second reported; attention: {magrpo['attn']}. "
        f"MAGRPO: K={ctx.samples} per agent, KL coefficient {MAGRPO_KL} (with random weights every reward is the "
        f"same, so without it no sample would train); MARFT-A: duo profile, a Reasoner then an Actor; "
        f"{ctx.new_tokens} new tokens at most per response, temperature 0.7, top-p 0.9.",
        "",
        *table(STEP_HEADER, [step_row("MAGRPO", magrpo), step_row("MARFT-A", marft)]),
    ]


def part_qlora(ctx: Context) -> None:
    try:
        import bitsandbytes  # noqa: F401
    except Exception as e:  # ImportError, or a broken install's RuntimeError
        raise Unavailable(f"bitsandbytes does not import ({type(e).__name__}: {first_line(e)})")
    from collab.policy.models import BaseConfig

    base = BaseConfig(
        name=weights_folder(ctx.shape, ctx.workdir, ctx.dtype, ctx.device), dtype=ctx.dtype, quantization="4bit"
    )
    s = algo_step(ctx, "magrpo", base)
    ctx.sections["QLoRA 4-bit"] = [
        f"The MAGRPO step with the base in 4-bit NF4 (double quantization, {ctx.dtype} compute), bitsandbytes "
        f"{importlib.import_module('bitsandbytes').__version__}.",
        "",
        *table(STEP_HEADER, [step_row("MAGRPO, QLoRA", s)]),
    ]


def part_vllm(ctx: Context) -> None:
    if importlib.util.find_spec("vllm") is None:
        raise Unavailable("vllm is not installed")
    if not ctx.cuda:
        raise Unavailable(
            "left out on the CPU (vLLM's CPU engine takes minutes to start; benchmarks/rollout.py "
            "measures it in .venv-vllm)"
        )
    from collab.policy.vllm_engine import VllmEngine, VllmOptions

    bench = rollout_module()
    team, prompts = rollout_team(ctx, weights_folder(ctx.shape, ctx.workdir, ctx.dtype, ctx.device))
    start = time.perf_counter()
    engine = VllmEngine(team, VllmOptions(max_model_len=max(map(len, prompts)) + ctx.new_tokens + 16))
    started = time.perf_counter() - start
    bench.RESCORE.clear()
    runs = timed_rollouts(ctx, team, prompts, {"collab": bench.run_collab, "vllm": bench.run_vllm(engine)})
    rescore = statistics.median(bench.RESCORE[-ctx.repeats :]) if bench.RESCORE else float("nan")
    ctx.sections["vLLM"] = [
        f"The rollout's workload through collab's vLLM engine (vllm {importlib.import_module('vllm').__version__}; "
        f"engine start {started:.1f} s, once per run), beside collab's loop on the same team; of each vLLM "
        f"rollout, {rescore:.2f} s (median) recompute the behaviour log-probs with the training model.",
        "",
        *table(
            ["engine", "tokens", "seconds", "tokens/s", "x collab"],
            rollout_rows(runs, {"collab": "collab team.generate", "vllm": "vLLM engine (+ rescoring)"}),
        ),
    ]
    del team, engine
    free_memory()


def first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0][:300]


def is_oom(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def free_bytes(ctx: Context) -> int | None:
    """The GPU memory free now (None on the CPU)."""
    import torch

    return torch.cuda.mem_get_info()[0] if ctx.cuda else None


def part_fit(ctx: Context) -> None:
    from collab.policy.models import BaseConfig

    rows, largest = [], None
    free = free_bytes(ctx)
    stopped = False
    for shape in ctx.fit_shapes:
        params = parameter_count(shape)
        weights = params * BYTES[ctx.dtype]
        row = [shape, f"{params:,}", gib(weights)]
        if stopped:
            rows.append(row + ["not tried (a smaller base did not fit)", "-", "-"])
            continue
        if shape not in ctx.fit_run:
            rows.append(row + ["not tried here (needs CUDA)", "-", "-"])
            continue
        if free is not None and weights > free:
            rows.append(row + [f"predicted not to fit: weights > {gib(free)} GiB free", "-", "-"])
            stopped = True
            continue
        try:
            s = algo_step(ctx, "magrpo", BaseConfig(name=base_folder(shape, ctx.workdir), dtype=ctx.dtype), steps=1)
            rows.append(row + ["fits", f"{s['seconds']:.2f}", gib(s["peak"])])
            largest = shape
        except Exception as e:  # noqa: BLE001 -- out of memory ends the search; so does a failure, reported
            if is_oom(e):
                rows.append(row + [f"out of memory ({first_line(e)[:120]})", "-", "-"])
            else:
                traceback.print_exc()
                rows.append(row + [f"failed ({type(e).__name__})", "-", "-"])
                ctx.missing.append(
                    ("largest base that fits", f"failed at {shape}: {type(e).__name__}: {first_line(e)}")
                )
            stopped = True
        free_memory()
        free = free_bytes(ctx)
    shown = [s for s in ctx.fit_shapes if s not in ctx.fit_run]
    if shown and not ctx.cuda:
        ctx.missing.append(
            ("largest base that fits", f"{', '.join(shown)} counted on the meta device only: needs CUDA")
        )
    ctx.sections["Largest base that fits"] = [
        f"Largest that ran one MAGRPO step (the steps part's workload, 2 agents): **{largest or 'none'}**. "
        f"Each shape is counted on the meta device first; a run is its first step (it also sizes the micro-batches).",
        "",
        *table(["shape", "parameters", f"{ctx.dtype} weights GiB", "result", "step seconds", "peak GiB"], rows),
    ]


# -- the report -------------------------------------------------------------------------------------------
def version(name: str) -> str:
    try:
        return importlib.import_module(name).__version__
    except Exception:  # noqa: BLE001 -- not installed or broken: said so in the report
        return "not installed"


def header(ctx: Context, mode: str) -> list[str]:
    import torch

    if ctx.cuda:
        props = torch.cuda.get_device_properties(0)
        device = f"{props.name}, {props.total_memory / GIB:.1f} GiB, CUDA {torch.version.cuda}"
    else:
        device = f"CPU ({platform.machine()}, {torch.get_num_threads()} torch threads); no CUDA device"
    from collab.policy.team import packaged_defaults

    lora = packaged_defaults().lora  # what every agent here uses: conf/base.yaml's agent_defaults
    hidden, layers, heads, kv, inter, vocab, tied = SHAPES[ctx.shape]
    versions = ", ".join(
        f"{n} {version(n)}" for n in ("torch", "transformers", "peft", "lightning", "collab", "bitsandbytes", "vllm")
    )
    return [
        "# collab GPU check",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- device: {device}",
        f"- versions: {versions}; Python {platform.python_version()}",
        f"- mode: {mode}",
        f"- base: Qwen2 shape {ctx.shape} (hidden {hidden}, {layers} layers, {heads}/{kv} heads, intermediate {inter}, "
        f"vocabulary {vocab}, tied embeddings {tied}), {parameter_count(ctx.shape):,} parameters, random weights, "
        f"{ctx.dtype}; 2 LoRA agents (r {lora.r}, alpha {lora.alpha}, target modules {', '.join(lora.target_modules)})",
    ]


def tests_section(log: str | None, status: str | None) -> list[str] | None:
    """The summary of ``pytest -m gpu``'s log (as scripts/gpu_check.sh saved it): its count line and the tests that
    failed or skipped, with pytest's reasons; None when there is no log (the tests were not run)."""
    import re

    if not log:
        return None
    lines = Path(log).read_text(errors="replace").splitlines() if Path(log).is_file() else []
    counts = re.compile(r"^=*\s*(\d+ (passed|failed|skipped|errors?|deselected|xfailed|xpassed)|no tests ran)")
    summary = next((x.strip("= ") for x in reversed(lines) if counts.match(x)), lines[-1] if lines else "no output")
    listed = [x for x in lines if x.startswith(("FAILED", "ERROR", "SKIPPED"))]
    return [
        f"`pytest -m gpu` (exit {status or '?'}): {summary}",
        *([""] if listed else []),
        *[f"- {x}" for x in listed],
    ]


def write_report(ctx: Context, args, mode: str) -> str:
    lines = header(ctx, mode)
    if args.setup and Path(args.setup).is_file():
        lines += ["", "## Setup", "", *Path(args.setup).read_text().splitlines()]
    tests = tests_section(args.tests_log, args.tests_status)
    if tests is None:
        ctx.missing.insert(0, ("pytest -m gpu", "not run by this command (scripts/gpu_check.sh runs it)"))
    else:
        lines += ["", "## GPU tests", "", *tests]
    for name in ("Rollout", "Training steps", "QLoRA 4-bit", "vLLM", "Largest base that fits"):
        if name in ctx.sections:
            lines += ["", f"## {name}", "", *ctx.sections[name]]
    lines += ["", "## Could not run", ""]
    lines += [f"- {part}: {why}" for part, why in ctx.missing] or ["- nothing: every part ran"]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    return text


# -- command line -----------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu_check.md", help="the markdown report (default: %(default)s)")
    ap.add_argument(
        "--quick", action="store_true", help="less of each part: 1 repeat, 4 samples, 32 tokens, fit up to 14B"
    )
    ap.add_argument(
        "--cpu-smoke",
        "--dry-run",
        dest="cpu_smoke",
        action="store_true",
        help="run on the CPU at the tiny shape: checks the logic where there is no GPU",
    )
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="(default: all)")
    ap.add_argument("--shape", choices=list(SHAPES), help="the measured base (default: 1.5B; tiny with --cpu-smoke)")
    ap.add_argument(
        "--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"], help="(default: %(default)s)"
    )
    ap.add_argument("--samples", type=int, help="samples per agent (default: 8; 4 quick; 2 cpu-smoke)")
    ap.add_argument("--new-tokens", type=int, help="tokens per response (default: 128; 32 quick; 8 cpu-smoke)")
    ap.add_argument("--repeats", type=int, help="timed rollouts per engine (default: 3; 1 quick or cpu-smoke)")
    ap.add_argument("--problems", type=int, help="MARFT-A's math problems per step (default: 8; 2 cpu-smoke)")
    ap.add_argument(
        "--workdir",
        help="where the bases' folders (and the 4-bit/vLLM part's weights) go (default: a "
        "temporary folder, removed at the end)",
    )
    ap.add_argument("--setup", help="a markdown file of set-up notes to include (scripts/gpu_check.sh's)")
    ap.add_argument("--tests-log", help="pytest -m gpu's output, summarised in the report")
    ap.add_argument("--tests-status", help="pytest -m gpu's exit status")
    args = ap.parse_args(argv)
    quick, smoke = args.quick, args.cpu_smoke
    args.shape = args.shape or ("tiny" if smoke else "1.5B")
    args.samples = args.samples or (2 if smoke else 4 if quick else 8)
    args.new_tokens = args.new_tokens or (8 if smoke else 32 if quick else 128)
    args.repeats = args.repeats or (1 if smoke or quick else 3)
    args.problems = args.problems or (2 if smoke else 8)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print(
            "error: no CUDA device here (torch.cuda.is_available() is False); run on a GPU machine, or pass "
            "--cpu-smoke to check the script on the CPU at a tiny shape",
            file=sys.stderr,
        )
        return 2
    fit = FIT[:4] if args.quick else FIT
    workdir = args.workdir or tempfile.mkdtemp(prefix="collab-gpu-check-")
    ctx = Context(
        shape=args.shape,
        device="cpu" if args.cpu_smoke else "cuda",
        dtype=args.dtype,
        samples=args.samples,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        problems=args.problems,
        fit_shapes=("tiny", *fit) if args.cpu_smoke else fit,
        fit_run=("tiny",) if args.cpu_smoke else fit,
        workdir=workdir,
    )
    mode = (
        "cpu-smoke (the logic at a tiny shape: its figures are not measurements)"
        if args.cpu_smoke
        else "quick"
        if args.quick
        else "full"
    )
    parts = {"rollout": part_rollout, "steps": part_steps, "qlora": part_qlora, "vllm": part_vllm, "fit": part_fit}
    labels = {
        "rollout": "rollout tokens/s",
        "steps": "MAGRPO and MARFT-A steps",
        "qlora": "QLoRA 4-bit step",
        "vllm": "vLLM engine tokens/s",
        "fit": "largest base that fits",
    }
    try:
        for name in args.parts:
            print(f"gpu_check: {name}...", file=sys.stderr, flush=True)
            try:
                parts[name](ctx)
            except Unavailable as e:
                ctx.missing.append((labels[name], str(e)))
            except Exception as e:  # noqa: BLE001 -- one failing part must not lose the others' figures
                traceback.print_exc()
                ctx.missing.append((labels[name], f"failed: {type(e).__name__}: {first_line(e)}"))
                free_memory()
            write_report(ctx, args, mode)  # after every part: a run stopped by a time limit keeps what it measured
        print(write_report(ctx, args, mode))
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if any(why.startswith("failed") for _, why in ctx.missing) else 0


if __name__ == "__main__":
    sys.exit(main())
