"""Single-agent GRPO: collab's MAGRPO with one agent (n = 1) against TRL's ``GRPOTrainer``, one optimizer step each.

The same model, LoRA (r 8, alpha 16, q/k/v/o/gate/up/down, dropout 0), prompts (``--prompts`` chat prompts),
group size (``--k`` samples per prompt), response length (``--tokens``), sampling (temperature 1, no
truncation), learning rate and reward: ``-|words - 20| / 20`` (a reply of 20 words scores 0). No KL term on
either side (TRL's default ``beta`` is 0; collab's ``kl_coef`` 0), one pass over the samples
(``num_iterations`` / ``num_epochs`` 1), one optimizer step over all prompts x K samples. Activation
(gradient) checkpointing is set the same on both sides, off unless ``--gradient-checkpointing``: TRL's
``GRPOConfig`` turns it on by default and collab's ``BaseConfig`` leaves it off, and left at those
defaults the comparison sets collab's memory without it against TRL's with it (and TRL's time with the
recomputation against collab's without).

Each side runs in a subprocess of its own (so that peak RSS is its own): it builds its trainer, takes
``--steps`` optimizer steps, and reports the seconds of each step (rollout + loss + backward + optimizer
step, from the trainers' own step hooks) and the process's peak RSS. The first step is warm-up; the figure
is the median of the rest. TRL is a benchmark-only dependency (``pip install trl==1.16.0`` in an
environment with collab); it is not one of collab's.

    PYTHONPATH=src /tmp/trlvenv/bin/python benchmarks/grpo_vs_trl.py                 # SmolLM2, ~5 min on 2 cores
    PYTHONPATH=src /tmp/trlvenv/bin/python benchmarks/grpo_vs_trl.py --gradient-checkpointing
    PYTHONPATH=src /tmp/trlvenv/bin/python benchmarks/grpo_vs_trl.py --model tiny --steps 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

PROMPTS = ["Describe the sea in one sentence.", "Give advice to a new gardener.", "Explain why the sky is blue.",
           "Write a short note to a neighbour.", "Describe a busy market.", "Tell me about your favourite season.",
           "Explain how a bicycle works.", "Describe the smell of rain."]
LORA = dict(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                    "up_proj", "down_proj"])


def reward(text: str) -> float:
    return -abs(len(text.split()) - 20) / 20


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def run_trl(args) -> list[float]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from collab.policy.models import TINY, load_model, load_tokenizer, model_folder, BaseConfig

    torch.manual_seed(0)
    tokenizer = load_tokenizer(args.model)
    tokenizer.padding_side = "left"
    model = (load_model(BaseConfig(name=TINY)) if args.model == TINY
             else AutoModelForCausalLM.from_pretrained(model_folder(args.model), dtype=torch.float32))
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS[:args.prompts]])
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.start)

    fields = GRPOConfig.__dataclass_fields__  # transformers renames the option (activation_checkpointing)
    checkpointing = {("activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"):
                     args.gradient_checkpointing}
    config = GRPOConfig(
        **checkpointing, output_dir=args.out, per_device_train_batch_size=args.prompts * args.k, num_generations=args.k,
        gradient_accumulation_steps=1, max_completion_length=args.tokens, temperature=1.0, top_p=1.0, beta=0.0,
        num_iterations=1, learning_rate=args.lr, max_steps=args.steps, logging_steps=1, report_to="none",
        save_strategy="no", use_cpu=True, bf16=False, seed=0, dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=model, processing_class=tokenizer,
                          reward_funcs=lambda completions, **kw: [reward(c[0]["content"]) for c in completions],
                          args=config, train_dataset=data, peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA),
                          callbacks=[Clock()])
    trainer.train()
    return times


def run_collab(args) -> list[float]:
    import lightning as L
    import torch

    from collab.algos import data_from_config, from_config
    from collab.envs.base import AgentRole, Env, Score
    from collab.policy.models import BaseConfig
    from collab.policy.team import AgentSpec, LoraSpec, SamplingSpec

    class Prompts(Env):
        name = "prompts"

        def __init__(self):
            super().__init__(1)
            self.roles = (AgentRole("writer", max_new_tokens=args.tokens),)

        def tasks(self, split):
            return [{"id": i, "prompt": p} for i, p in enumerate(PROMPTS[:args.prompts])]

        def observe(self, task):
            return [task["prompt"]]

        def score(self, state, actions):
            return Score((reward(actions[0]),))

    times: list[float] = []

    class Clock(L.Callback):
        def on_train_batch_start(self, *a):
            self.start = time.perf_counter()

        def on_train_batch_end(self, *a):
            times.append(time.perf_counter() - self.start)

    L.seed_everything(0, verbose=False)
    lora = LoraSpec(r=LORA["r"], alpha=LORA["lora_alpha"], dropout=0.0, target_modules=list(LORA["target_modules"]))
    spec = AgentSpec(system_prompt=None, lora=lora, sampling=SamplingSpec(temperature=1.0, max_new_tokens=args.tokens))
    module = from_config("magrpo", base=BaseConfig(name=args.model, gradient_checkpointing=args.gradient_checkpointing),
                         agents=[spec], agent_lr=args.lr, num_generations=args.k, num_epochs=1, kl_coef=0.0, log_kl=False,
                         normalize_std=True)
    dm = data_from_config("magrpo", env="matrix", batch_size=args.prompts, seed=0, shuffle=False)
    env = Prompts()
    dm.env = env
    dm.stream.tasks = list(env.tasks("train"))
    trainer = L.Trainer(max_steps=args.steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1, callbacks=[Clock()])
    trainer.fit(module, dm)
    return times


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="(default: %(default)s)")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step (default: %(default)s)")
    ap.add_argument("--k", type=int, default=8, help="group size (default: %(default)s)")
    ap.add_argument("--tokens", type=int, default=48, help="response length limit (default: %(default)s)")
    ap.add_argument("--lr", type=float, default=1e-5, help="(default: %(default)s)")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps; the first is warm-up (default: %(default)s)")
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="recompute activations in the backward, on both sides (default: off on both)")
    ap.add_argument("--side", choices=["trl", "collab"], help=argparse.SUPPRESS)
    ap.add_argument("--out", default="/tmp/collab-grpo-vs-trl", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side:
        times = run_trl(args) if args.side == "trl" else run_collab(args)
        print("RESULT " + json.dumps({"times": times, "rss_gb": peak_rss_gb()}))
        return
    results = {}
    for side in ("collab", "trl"):
        cmd = [sys.executable, __file__, "--side", side, *(argv if argv is not None else sys.argv[1:])]
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        if out.returncode != 0 or not lines:
            sys.exit(f"{side} failed:\n{out.stderr[-3000:]}")
        results[side] = json.loads(lines[-1][7:])
        t = results[side]["times"]
        print(f"{side:>6}: seconds per step {' '.join(f'{x:.2f}' for x in t)}  peak RSS {results[side]['rss_gb']:.2f} GB")
    med = {s: statistics.median(r["times"][1:] or r["times"]) for s, r in results.items()}
    print(f"\nmodel={args.model} prompts={args.prompts} K={args.k} tokens={args.tokens} "
          f"gradient_checkpointing={args.gradient_checkpointing} (median of steps after the first)")
    print(f"seconds per step: collab {med['collab']:.2f}, TRL {med['trl']:.2f}, ratio TRL / collab {med['trl'] / med['collab']:.2f}x")
    print(f"peak RSS: collab {results['collab']['rss_gb']:.2f} GB, TRL {results['trl']['rss_gb']:.2f} GB, "
          f"ratio TRL / collab {results['trl']['rss_gb'] / results['collab']['rss_gb']:.2f}x")


if __name__ == "__main__":
    main()
