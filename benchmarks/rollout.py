"""Rollout throughput: one batched AgentTeam.generate call vs. a per-agent loop of HF generate.

collab
    ``team.generate`` with one ``GenerationRequest(agent, prompt, n=K)`` per agent: every agent's K
    samples share one decoding loop (rows carry their adapter names), each prompt prefilled once.
per-agent loop (what the reference code does)
    for each agent in turn: ``peft_model.set_adapter(name)`` and HF
    ``model.generate(input_ids, attention_mask, do_sample=True, temperature, top_p,
    max_new_tokens, num_return_sequences=K)``.

Both use the same team (same model object and adapters), the same sampling settings and length limit.
Generated tokens are counted up to and including the first EOS. The order of the two alternates across
repeats; each is warmed up once before timing.

    cd /work/main && PYTHONPATH=src .venv/bin/python benchmarks/rollout.py            # defaults: ~2-3 min on 2 CPU cores
    PYTHONPATH=src .venv/bin/python benchmarks/rollout.py --model tiny --repeats 5     # quick smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from collab.policy.models import BaseConfig
from collab.policy.sampling import GenerationRequest
from collab.policy.team import AgentSpec, AgentTeam, SamplingSpec

ROLES = [
    ("writer", "You are a creative writer. Write vivid, concrete prose with varied vocabulary."),
    ("editor", "You are a careful editor. Improve the draft's clarity, rhythm and word choice."),
    ("critic", "You are a literary critic. Point out what works and what does not, briefly."),
]
TASK = (
    "Write a short story of about 150 words about a lighthouse keeper who finds a message in a bottle "
    "on the morning of a storm. Use sensory details and end with a surprising but earned twist."
)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="base model name (default: %(default)s)")
    ap.add_argument("--agents", type=int, default=2, help="number of agents (default: %(default)s)")
    ap.add_argument("--k", type=int, default=4, help="samples per agent (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="(default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats of each method (default: %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.8, help="(default: %(default)s)")
    ap.add_argument("--top-p", type=float, default=0.95, help="(default: %(default)s)")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda... (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads; 0 keeps torch's default. On a CPU shared with other busy processes, "
                         "1 avoids OpenMP oversubscription (which can slow both methods >10x)")
    return ap.parse_args(argv)


def build(args):
    torch.manual_seed(args.seed)
    specs = []
    for i in range(args.agents):
        role, system = ROLES[i % len(ROLES)]
        specs.append(AgentSpec(role=role, system_prompt=system,
                               sampling=SamplingSpec(temperature=args.temperature, top_p=args.top_p, top_k=0)))
    team = AgentTeam(specs, BaseConfig(name=args.model, device=args.device))
    prompts = [team.encode(i, [{"role": "system", "content": s.system_prompt}, {"role": "user", "content": TASK}])
               for i, s in enumerate(specs)]
    return team, prompts


def count_generated(row: list[int], eos: set[int]) -> int:
    """Tokens up to and including the first EOS (all of them when there is none)."""
    for i, t in enumerate(row):
        if t in eos:
            return i + 1
    return len(row)


def run_collab(team: AgentTeam, prompts, k: int, max_new_tokens: int) -> int:
    requests = [GenerationRequest(i, p, n=k) for i, p in enumerate(prompts)]
    outputs = team.generate(requests, max_new_tokens=max_new_tokens)
    eos = {team.tokenizer_of(0).eos_token_id}
    return sum(count_generated(c.completion_ids, eos) for group in outputs for c in group)


@torch.no_grad()
def run_loop(team: AgentTeam, prompts, k: int, max_new_tokens: int) -> int:
    total = 0
    for i, p in enumerate(prompts):
        model, tokenizer = team.model_of(i), team.tokenizer_of(i)
        sampling = team.specs[i].sampling
        model.set_adapter(team.names[i])
        input_ids = torch.tensor([p], device=team.device)
        attention_mask = torch.ones_like(input_ids)
        out = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, do_sample=True,
            temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
            max_new_tokens=max_new_tokens, num_return_sequences=k,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )
        eos = {tokenizer.eos_token_id}
        total += sum(count_generated(row, eos) for row in out[:, input_ids.shape[1]:].tolist())
    return total


def timed(fn, *args) -> tuple[int, float]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    tokens = fn(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return tokens, time.perf_counter() - start


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    team, prompts = build(args)
    print(f"model={args.model} device={team.device} threads={torch.get_num_threads()} agents={args.agents} "
          f"K={args.k} max_new_tokens={args.max_new_tokens} temperature={args.temperature} top_p={args.top_p} "
          f"top_k=0 prompt_tokens={[len(p) for p in prompts]}")

    methods = {"collab": run_collab, "per-agent loop": run_loop}
    for fn in methods.values():  # warm-up: first-call allocations, lazy imports
        torch.manual_seed(args.seed)
        fn(team, prompts, 1, 4)

    rates: dict[str, list[float]] = {m: [] for m in methods}
    print(f"\n{'repeat':>6}  {'first':<14}  {'collab tok':>10} {'s':>7} {'tok/s':>8}   {'loop tok':>8} {'s':>7} {'tok/s':>8}")
    for r in range(args.repeats):
        order = list(methods) if r % 2 == 0 else list(reversed(methods))
        row = {}
        for m in order:
            torch.manual_seed(args.seed + 1 + r)
            tokens, seconds = timed(methods[m], team, prompts, args.k, args.max_new_tokens)
            row[m] = (tokens, seconds)
            rates[m].append(tokens / seconds)
        (ct, cs), (lt, ls) = row["collab"], row["per-agent loop"]
        print(f"{r:>6}  {order[0]:<14}  {ct:>10} {cs:>7.2f} {ct / cs:>8.1f}   {lt:>8} {ls:>7.2f} {lt / ls:>8.1f}")

    med = {m: statistics.median(v) for m, v in rates.items()}
    print(f"\nmedian tokens/s: collab {med['collab']:.1f}   per-agent loop {med['per-agent loop']:.1f}")
    print(f"ratio collab / per-agent-loop: {med['collab'] / med['per-agent loop']:.2f}x")


if __name__ == "__main__":
    main()
