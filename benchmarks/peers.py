"""collab against its peers, side by side: seconds per optimizer step and peak memory, with ratios, from one run.

Two comparisons (``--peers`` picks the sides; by default all five run):

magrpo: MAGRPO, 2 agents, against CoMLRL (``comlrl`` 1.4.3, the reference implementation of the MAGRPO
    paper, ``comlrl.trainers.reinforce.MAGRPOTrainer``). A writing-like task: 2 posts of collab's
    packaged writing corpus per step, the concise agent asked for a short summary and the detailed agent
    for a detailed one (the prompts of collab's ``writing`` env, in the model's chat template), K = 4
    responses per agent per post, at most 64 new tokens, sampling at temperature 0.7, top-p 0.9, no top-k
    (magrpo.yaml's), one turn, aligned joint actions, mean baseline divided by the group std, no KL
    penalty, one pass, one optimizer step per agent per 2 posts. The same deterministic joint reward on
    every side, ``(-|words(concise) - 20| / 20 - |words(detailed) - 40| / 40) / 2`` (0 at 20 and 40 words).
    Sides:

    - ``collab``: ``from_config("magrpo")``, magrpo.yaml's defaults (LoRA r 8, alpha 16, q/k/v/o/gate/up/
      down, dropout 0, lr 1e-3, clip 0.2, grad-norm clip 1, auto micro-batches, the logged KL: one
      reference forward per step) with only K, the lengths and the task set here: the two agents are
      two LoRA adapters on one shared base.
    - ``comlrl``: CoMLRL's default, each agent a full ``AutoModelForCausalLM`` (two copies of the base,
      full-parameter AdamW at its default lr 5e-6, the paper's full fine-tuning rate; 1e-3 would wreck a
      full model and with it the sampled lengths).
    - ``comlrl-lora``: CoMLRL's trainer given two peft LoRA models (the same LoRA as collab's, lr 1e-3).
      CoMLRL has no LoRA option of its own; its trainer takes any model objects.

grpo: single-agent GRPO, collab's MAGRPO with one agent against TRL's ``GRPOTrainer`` + peft LoRA (this
    replaces ``benchmarks/grpo_vs_trl.py``, same settings): the same LoRA (r 8, alpha 16, q/k/v/o/gate/
    up/down, dropout 0), 2 chat prompts, group K = 8, 48 new tokens, temperature 1, no truncation, lr
    1e-5, reward ``-|words - 20| / 20``, no KL (TRL's ``beta`` 0, collab's ``kl_coef`` 0, no logged KL),
    one pass (``num_iterations`` / ``num_epochs`` 1), one optimizer step over all prompts x K samples.

Activation (gradient) checkpointing is the same on every side, off unless ``--gradient-checkpointing``
(TRL's ``GRPOConfig`` turns it on by default; collab and CoMLRL leave it off). Same model everywhere
(``--model``: collab's embedded SmolLM2-135M-Instruct folder, or ``tiny``, collab's random 2-layer Llama,
saved to a folder for the peers), float32, CPU.

Differences that remain: CoMLRL samples one agent and one post at a time (a batch of K) and computes its loss
per sequence (batch 1, prompt + the whole padded completion row, a Python loop of log-softmaxes over the
vocabulary) with no importance ratio / clip and no gradient-norm clip, and keeps its own AdamW per agent;
collab batches the agents' rows, clips (ratio 1 in a single pass: the same gradient) and logs the KL to the
base (its default). CoMLRL finds the prompt's end at the first pad token, and SmolLM2's pad token is its
``<|im_end|>``, which the chat template puts inside every prompt: CoMLRL's side pads with ``<|endoftext|>``
instead (generation still stops at ``<|im_end|>``), or its completions would be cut to nothing.

Method (as grpo_vs_trl.py's): each side runs in a subprocess of its own, builds its trainer, takes
``--steps`` optimizer steps (magrpo 4, grpo 3 by default) and reports the seconds of each (rollout + loss +
backward + optimizer step: Lightning's batch hooks, TRL's step callbacks, CoMLRL's two ``_train_step_returns``
calls of a step, whose second drains the rollout buffers into the update). The first step is warm-up; the
figure is the median of the rest. Peak RSS is the side's whole process tree: the larger of the side's own
``ru_maxrss`` (RUSAGE_SELF, and RUSAGE_CHILDREN for any children it waited for) and the peak of the tree's
summed RSS sampled from /proc every 0.2 s. Ratios are collab / peer (below 1: collab is faster or smaller).
The mean reward of each side's samples is shown too: the rewards are lengths, and the sides' step times
are comparable only while they sample replies of like lengths.

The peers are benchmark-only dependencies, not collab's: one virtualenv outside the repository holds collab's
dependencies, TRL and CoMLRL (CoMLRL 1.4.3 pins nothing that conflicts). ``--setup VENV`` runs these:

    python3.11 -m venv /tmp/peers-venv
    # the CPU build: here from local wheels, elsewhere PyTorch's CPU index
    /tmp/peers-venv/bin/pip install torch==2.13.0
    /tmp/peers-venv/bin/pip install transformers==5.24.0 peft==0.21.2 lightning==2.6.6 accelerate==1.15.0 \\
        bitsandbytes==0.50.2 gguf==0.19.0 'jsonargparse[signatures]==4.53.0' tensorboard==2.21.0 \\
        trl==1.16.0 comlrl==1.4.3

collab itself comes from the working tree (PYTHONPATH=src); the parent process imports it too (it resolves
the model folder, and saves the tiny model for the peers). A peer that needs an environment of its own can be
given its interpreter (``--python-comlrl``, ``--python-trl``; ``--python-collab`` for collab's sides); the
peers' sides import only their own package, transformers, peft and datasets. Runs:

    PYTHONPATH=src /tmp/peers-venv/bin/python benchmarks/peers.py --json /tmp/peers.json   # all, SmolLM2: ~15-20 min
    PYTHONPATH=src /tmp/peers-venv/bin/python benchmarks/peers.py --peers collab comlrl-lora
    PYTHONPATH=src /tmp/peers-venv/bin/python benchmarks/peers.py --gradient-checkpointing
    OMP_NUM_THREADS=1 PYTHONPATH=src nice -n 19 /tmp/peers-venv/bin/python benchmarks/peers.py --model tiny --steps 2

Time it on an otherwise idle machine. Beside other CPU jobs torch's threads wait on each other (2 SmolLM2
CoMLRL steps had not ended after 30 min at nice 19 with 2 threads; they took 70 s each with one): a smoke
run beside other work wants ``OMP_NUM_THREADS=1`` (the last line: every side in ~1.5 min), and its figures
are not measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "src" / "collab" / "data" / "writing_corpus.jsonl"
LORA = dict(
    r=8,
    lora_alpha=16,
    lora_dropout=0.0,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
)
# grpo: the prompts of grpo_vs_trl.py
PROMPTS = [
    "Describe the sea in one sentence.",
    "Give advice to a new gardener.",
    "Explain why the sky is blue.",
    "Write a short note to a neighbour.",
    "Describe a busy market.",
    "Tell me about your favourite season.",
    "Explain how a bicycle works.",
    "Describe the smell of rain.",
]
# magrpo: the prompts of collab's writing env (collab.envs.writing.env), one per agent
WRITING = (
    "Create a concise summary response to this post.\nQuery: {post}\n"
    "Instructions: Provide a brief and focused summary in a few sentences",
    "Create a detailed summary response to this post.\nQuery: {post}\n"
    "Instructions: You should use transition words to improve flow",
)
TARGET_WORDS = (20, 40)

COMPARISONS = {
    "magrpo": dict(
        peers=["comlrl", "comlrl-lora"],
        prompts=2,
        k=4,
        tokens=64,
        steps=4,
        lr=1e-3,
        full_lr=5e-6,
        sampling=dict(temperature=0.7, top_p=0.9, top_k=0),
    ),
    "grpo": dict(
        peers=["trl"], prompts=2, k=8, tokens=48, steps=3, lr=1e-5, sampling=dict(temperature=1.0, top_p=1.0, top_k=0)
    ),
}
NAMES = {"collab": "collab", "comlrl": "CoMLRL full", "comlrl-lora": "CoMLRL LoRA", "trl": "TRL + LoRA"}


# -- the tasks and rewards, the same on every side ---------------------------------------------------------
REWARDS: list[float] = []
"""Every reward a side computed: their mean, reported beside the times, says whether the sides sampled
replies of like lengths (the rewards are lengths), on which their step times depend."""


def words(text: str) -> int:
    return len(text.split())


def reward(text: str) -> float:
    """grpo: 0 at 20 words."""
    REWARDS.append(-abs(words(text) - 20) / 20)
    return REWARDS[-1]


def joint_reward(concise: str, detailed: str) -> float:
    """magrpo: the team's reward, 0 at 20 and 40 words."""
    REWARDS.append(sum(-abs(words(t) - n) / n for t, n in zip((concise, detailed), TARGET_WORDS)) / 2)
    return REWARDS[-1]


def posts(n: int) -> list[str]:
    with open(CORPUS) as f:
        return [json.loads(line)["prompt"].strip() for line in f if line.strip()][:n]


def task_prompts(comparison: str, n: int) -> list[list[str]]:
    """Per task, the user prompt of each agent."""
    if comparison == "grpo":
        return [[p] for p in PROMPTS[:n]]
    return [[w.format(post=p) for w in WRITING] for p in posts(n)]


def peak_rss_gb() -> float:
    return max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 2**20


# -- collab -----------------------------------------------------------------------------------------------
def collab_options(pairs: list[str]) -> dict:
    """``--collab-options KEY=VALUE ...`` as the options they set, each VALUE read as YAML (``false``, ``null``, 2); a
    dotted KEY sets a member of its group (``ppo.num_epochs=2``)."""
    import yaml

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            sys.exit(f"--collab-options: KEY=VALUE pairs, e.g. log_kl_every=0 ppo.clip=0.1; got {pair!r}")
        *groups, name = key.split(".")
        into = options
        for group in groups:
            into = into.setdefault(group, {})
        into[name] = yaml.safe_load(value)
    return options


def run_collab(comparison: str, cfg: dict, args) -> list[float]:
    from collab.policy.team import AgentSpec, LoraSpec, SamplingSpec

    names = ("writer",) if comparison == "grpo" else ("concise", "detailed")
    score = (lambda a: reward(a[0])) if comparison == "grpo" else (lambda a: joint_reward(*a))
    lora = LoraSpec(r=LORA["r"], alpha=LORA["lora_alpha"], dropout=0.0, target_modules=list(LORA["target_modules"]))
    specs = [
        AgentSpec(system_prompt=None, lora=lora, sampling=SamplingSpec(**cfg["sampling"], max_new_tokens=cfg["tokens"]))
        for _ in names
    ]
    options = dict(num_generations=cfg["k"], agent_lr=cfg["lr"])
    if comparison == "grpo":  # grpo_vs_trl.py's settings; magrpo keeps magrpo.yaml's defaults
        options.update(ppo={"num_epochs": 1}, kl_coef=0.0, log_kl_every=0, normalize_std=True)
    else:
        options.update(collab_options(args.collab_options))
    return collab_times(
        "magrpo",
        task_prompts(comparison, cfg["prompts"]),
        names,
        score,
        specs,
        options,
        args.model,
        args.steps or cfg["steps"],
        checkpointing=args.gradient_checkpointing,
    )


def collab_times(algo, tasks, names, score, specs, options, model, steps, checkpointing=False) -> list[float]:
    """Seconds of each of ``steps`` training steps of collab's ``algo`` (``from_config`` with ``specs`` and
    ``options`` over ``model``) on ``tasks`` (each task the user prompt of every role in ``names``), all of them a
    step, the team rewarded ``score(texts)`` for a joint action: Lightning's batch hooks, rollout to optimizer step."""
    import lightning as L

    from collab.algos import data_from_config, from_config
    from collab.envs.base import AgentRole, Env, Score
    from collab.policy.models import BaseConfig

    records = [{"id": i, "prompts": p} for i, p in enumerate(tasks)]
    tokens = specs[0].sampling.max_new_tokens

    class Tasks(Env):
        name = "peers"

        def __init__(self):
            super().__init__(1)
            self.roles = tuple(AgentRole(n, max_new_tokens=tokens) for n in names)

        def tasks(self, split):
            return records

        def observe(self, task):
            return list(task["prompts"])

        def score(self, state, actions):
            return Score((score(actions),) * len(names))

    times: list[float] = []

    class Clock(L.Callback):
        def on_train_batch_start(self, *a):
            self.start = time.perf_counter()

        def on_train_batch_end(self, *a):
            times.append(time.perf_counter() - self.start)

    L.seed_everything(0, verbose=False)
    base = BaseConfig(name=model, gradient_checkpointing=checkpointing)
    module = from_config(algo, base=base, agents=specs, **options)
    dm = data_from_config(algo, env="matrix", batch_size=len(records), seed=0, shuffle=False)
    dm.env = Tasks()
    dm.stream.tasks = list(records)
    trainer = L.Trainer(
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        callbacks=[Clock()],
    )
    trainer.fit(module, dm)
    return times


# -- the peers --------------------------------------------------------------------------------------------
def load_peer_model(folder: str, gradient_checkpointing: bool):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def run_trl(comparison: str, cfg: dict, args) -> list[float]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.folder)
    tokenizer.padding_side = "left"
    model = load_peer_model(args.folder, False)  # TRL turns checkpointing on or off itself
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": p[0]}]} for p in task_prompts(comparison, cfg["prompts"])]
    )
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.start)

    fields = GRPOConfig.__dataclass_fields__  # transformers renames the option (activation_checkpointing)
    checkpointing = {
        (
            "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
        ): args.gradient_checkpointing
    }
    config = GRPOConfig(
        **checkpointing,
        output_dir=tempfile.mkdtemp(prefix="peers-trl-"),
        num_generations=cfg["k"],
        per_device_train_batch_size=cfg["prompts"] * cfg["k"],
        gradient_accumulation_steps=1,
        max_completion_length=cfg["tokens"],
        temperature=cfg["sampling"]["temperature"],
        top_p=cfg["sampling"]["top_p"],
        beta=0.0,
        num_iterations=1,
        learning_rate=cfg["lr"],
        max_steps=args.steps or cfg["steps"],
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=lambda completions, **kw: [reward(c[0]["content"]) for c in completions],
        args=config,
        train_dataset=data,
        peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA),
        callbacks=[Clock()],
    )
    trainer.train()
    return times


def run_comlrl(comparison: str, cfg: dict, args, lora: bool) -> list[float]:
    tasks = task_prompts(comparison, cfg["prompts"])
    return comlrl_times(
        args.folder,
        tasks,
        k=cfg["k"],
        tokens=cfg["tokens"],
        lr=cfg["lr"] if lora else cfg["full_lr"],
        sampling=cfg["sampling"],
        reward=lambda texts: joint_reward(*texts),
        lora=lora,
        steps=args.steps or cfg["steps"],
        checkpointing=args.gradient_checkpointing,
    )


def comlrl_times(folder, tasks, k, tokens, lr, sampling, reward, lora, steps, checkpointing=False) -> list[float]:
    """Seconds of each of ``steps`` steps of CoMLRL's ``MAGRPOTrainer`` on ``tasks`` (each task the user prompt of
    every agent: as many agents as prompts), the team's reward ``reward(texts)`` of one joint action, each agent a
    full model of ``folder`` or (``lora``) a peft LoRA model of it. One step: one optimizer step per agent over the
    tasks (its buffer and batch), timed from the first task's rollout to the last one's update."""
    import random

    import torch
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    from datasets import Dataset
    from transformers import AutoTokenizer

    random.seed(0)
    torch.manual_seed(0)
    n, per_step = len(tasks[0]), len(tasks)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    # CoMLRL takes the prompt to end at its first pad token; SmolLM2's pad is <|im_end|>, inside every chat prompt.
    tokenizer.pad_token = "<|endoftext|>"
    agents = []
    for _ in range(n):
        model = load_peer_model(folder, checkpointing)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        if lora:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **LORA))
        agents.append(model)

    def formatter(agent: int):
        def format_(item) -> str:
            return tokenizer.apply_chat_template(
                [{"role": "user", "content": item["prompts"][agent]}], tokenize=False, add_generation_prompt=True
            )

        return format_

    data = Dataset.from_list([{"prompts": p} for p in tasks] * steps)
    config = MAGRPOConfig(
        num_train_epochs=1,
        agent_learning_rate=lr,
        num_agents=n,
        num_generations=k,
        max_new_tokens=tokens,
        **sampling,
        num_turns=1,
        joint_mode="aligned",
        early_termination_threshold=None,
        eval_interval=0,
        rollout_buffer_size=per_step,
        train_batch_size=per_step,
        advantage_normalization=True,
        advantage_mode="mean",
        reference_kl_enabled=False,
        logging_steps=1,
    )
    times: list[float] = []

    class Timed(MAGRPOTrainer):
        calls = 0

        def _train_step_returns(self, batch_item, **kwargs):  # one task; the last of a step also updates
            if self.calls % per_step == 0:
                self.start = time.perf_counter()
            super()._train_step_returns(batch_item, **kwargs)
            self.calls += 1
            if self.calls % per_step == 0:
                times.append(time.perf_counter() - self.start)

    trainer = Timed(
        agents=agents,
        num_agents=n,
        tokenizer=tokenizer,
        train_dataset=data,
        reward_func=lambda *texts: [reward([t[0] for t in texts])],
        formatters=[formatter(i) for i in range(n)],
        args=config,
    )
    trainer.verbose = False
    trainer.train()
    return times


def run_side(comparison: str, side: str, args) -> list[float]:
    cfg = COMPARISONS[comparison]
    if side == "collab":
        return run_collab(comparison, cfg, args)
    if side == "trl":
        return run_trl(comparison, cfg, args)
    return run_comlrl(comparison, cfg, args, lora=side == "comlrl-lora")


# -- the parent: model folder, subprocesses, memory of the process tree, table ----------------------------
def peer_folder(model: str) -> str:
    """The folder the peers load: collab's converted model, or the tiny random model saved once."""
    from collab.policy.models import TINY, BaseConfig, load_model, load_tokenizer, model_folder

    if model != TINY:
        return model_folder(model)
    folder = Path(tempfile.gettempdir()) / "collab-peers-tiny"
    if not (folder / "model.safetensors").is_file():
        load_model(BaseConfig(name=TINY)).save_pretrained(folder)
        load_tokenizer(TINY).save_pretrained(folder)
    return str(folder)


def launch(comparison: str, side: str, args, argv: list[str]) -> dict | None:
    """Runs one side; its results, or None (with its error printed) if it failed."""
    python = getattr(args, f"python_{side.split('-')[0]}") or sys.executable
    cmd = [python, __file__, "--side", f"{comparison}:{side}", "--folder", args.folder, *argv]
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "WANDB_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])),
    }
    from collab.compare.running import TreePeak  # the summed RSS of the process tree, from /proc

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, text=True)
        with TreePeak(proc, every=0.2) as peak:
            proc.wait()
        sampled = peak.bytes / 2**30
        out.seek(0), err.seek(0)
        lines = [x for x in out.read().splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(f"failed (exit {proc.returncode}):\n{err.read()[-4000:]}", flush=True)
            return None
    result = json.loads(lines[-1][7:])
    result["rss_gb"] = max(result.pop("own_rss_gb"), sampled)
    result["s_per_step"] = statistics.median(result["times"][1:] or result["times"])
    return result


def plan(peers: list[str]) -> list[tuple[str, str]]:
    """(comparison, side) pairs: a comparison's peers that were named, with collab's side when collab was named."""
    sides = []
    for comparison, cfg in COMPARISONS.items():
        named = [p for p in cfg["peers"] if p in peers]
        if "collab" in peers and (named or set(peers) == {"collab"}):
            sides.append((comparison, "collab"))
        sides += [(comparison, p) for p in named]
    return sides


def table(results: dict, args) -> str:
    rows = [
        (
            "comparison",
            "side",
            "s/step",
            "steps (s)",
            "peak RSS GiB",
            "mean reward",
            "collab/side time",
            "collab/side RSS",
        )
    ]
    for (comparison, side), r in results.items():
        mine = results.get((comparison, "collab"))
        ratios = (
            (f"{mine['s_per_step'] / r['s_per_step']:.2f}", f"{mine['rss_gb'] / r['rss_gb']:.2f}")
            if mine and side != "collab"
            else ("", "")
        )
        rows.append(
            (
                comparison,
                NAMES[side],
                f"{r['s_per_step']:.2f}",
                " ".join(f"{t:.2f}" for t in r["times"]),
                f"{r['rss_gb']:.2f}",
                f"{r['mean_reward']:.2f}",
                *ratios,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    settings = [
        f"{c}: prompts {cfg['prompts']}, K {cfg['k']}, tokens {cfg['tokens']}, steps {args.steps or cfg['steps']}"
        for c, cfg in COMPARISONS.items()
        if any(k[0] == c for k in results)
    ]
    return "\n".join(
        [
            f"model {args.model}, gradient checkpointing {args.gradient_checkpointing}"
            + (f", collab's magrpo options {' '.join(args.collab_options)}" if args.collab_options else "")
            + "; "
            + "; ".join(settings)
            + "; s/step is the median of the steps after the first",
            *lines,
        ]
    )


def setup(venv: str) -> None:
    pip = f"{venv}/bin/pip"
    for cmd in (
        [sys.executable, "-m", "venv", venv],
        [pip, "install", "torch==2.13.0"],
        [
            pip,
            "install",
            "transformers==5.24.0",
            "peft==0.21.2",
            "lightning==2.6.6",
            "accelerate==1.15.0",
            "bitsandbytes==0.50.2",
            "gguf==0.19.0",
            "jsonargparse[signatures]==4.53.0",
            "tensorboard==2.21.0",
            "trl==1.16.0",
            "comlrl==1.4.3",
        ],
    ):
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", nargs="+", default=list(NAMES), choices=list(NAMES), help="sides to run (default: all)")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="(default: %(default)s; tiny for a smoke run)")
    ap.add_argument(
        "--steps", type=int, help="optimizer steps of every side, the first warm-up (default: magrpo 4, grpo 3)"
    )
    ap.add_argument("--gradient-checkpointing", action="store_true", help="on every side (default: off on every side)")
    ap.add_argument(
        "--collab-options",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="collab's MAGRPO options over magrpo.yaml's defaults, e.g. log_kl_every=0 micro_batch_tokens=null "
        "(default: none)",
    )
    for name in ("collab", "trl", "comlrl"):
        ap.add_argument(f"--python-{name}", metavar="PYTHON", help=f"interpreter of {name}'s sides (default: this one)")
    ap.add_argument("--json", metavar="FILE", help="also write the results here")
    ap.add_argument("--setup", metavar="VENV", help="create VENV with collab's dependencies, TRL and CoMLRL, and exit")
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.setup:
        return setup(args.setup)
    if args.side:
        times = run_side(*args.side.split(":"), args)
        print(
            "RESULT "
            + json.dumps(
                {
                    "times": times,
                    "own_rss_gb": peak_rss_gb(),
                    "mean_reward": statistics.fmean(REWARDS) if REWARDS else None,
                }
            )
        )
        return
    chosen = collab_options(args.collab_options)  # a malformed pair ends here, before any side starts
    args.folder = peer_folder(args.model)
    results, failed = {}, []
    for comparison, side in plan(args.peers):
        print(f"{comparison} {NAMES[side]} ...", end=" ", flush=True)
        r = launch(comparison, side, args, argv)
        if r is None:
            failed.append(f"{comparison} {side}")
            continue
        results[comparison, side] = r
        print(
            f"seconds per step {' '.join(f'{t:.2f}' for t in r['times'])}, peak RSS {r['rss_gb']:.2f} GiB", flush=True
        )
    print("\n" + table(results, args))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "model": args.model,
                    "gradient_checkpointing": args.gradient_checkpointing,
                    "collab_options": chosen,
                    "settings": COMPARISONS,
                    "results": [{"comparison": c, "side": s, **r} for (c, s), r in results.items()],
                },
                indent=1,
            )
        )
    if failed:
        sys.exit("failed: " + ", ".join(failed))


if __name__ == "__main__":
    main()
