"""Decoding against the CPU's own limit: achieved GFLOP/s of collab's decode loop next to plain matmuls.

A decode step of a dense decoder costs about 2 x parameters FLOPs per row (the attention over the cache
adds a little at these lengths): SmolLM2-135M at 32 rows, 8.6 GFLOP. The loop's rate is measured as
``team.generate`` of 32 samples of one prompt with ``--tokens`` new tokens minus the same call with 1 new
token (which leaves the prefill and the set-up), over the tokens generated in between. Beside it, on the
same threads: a large square matmul (what the cores can do) and the decode step's own matmuls (32 rows
times each weight of the model, ``torch.mm``), i.e. the best a step could reach at this batch size. Then
``torch.profiler`` over a few decode steps says where the time goes.

    PYTHONPATH=src .venv/bin/python benchmarks/decode_flops.py            # ~1-2 min on 2 cores
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from collab.policy.models import BaseConfig
from collab.policy.sampling import GenerationRequest
from collab.policy.team import AgentSpec, AgentTeam, SamplingSpec


def gflops_of_mm(shapes: list[tuple[int, int, int]], repeats: int) -> float:
    """GFLOP/s of ``torch.mm`` over the (m, k, n) shapes, best of ``repeats``."""
    mats = [(torch.randn(m, k), torch.randn(k, n)) for m, k, n in shapes]
    flops = sum(2 * m * k * n for m, k, n in shapes)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for a, b in mats:
            torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return flops / best / 1e9


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="(default: %(default)s)")
    ap.add_argument("--rows", type=int, default=32, help="decoding batch (default: %(default)s)")
    ap.add_argument("--tokens", type=int, default=33, help="new tokens per row (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="(default: %(default)s)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    team = AgentTeam([AgentSpec(sampling=SamplingSpec(temperature=1.0))], BaseConfig(name=args.model))
    model = team.model_of(0)
    params = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    prompt = team.encode(0, [{"role": "user", "content": "Write a long story about a lighthouse keeper."}])

    def generate(tokens: int) -> tuple[float, int]:
        torch.manual_seed(1)
        start = time.perf_counter()
        out = team.generate([GenerationRequest(0, prompt, args.rows)], max_new_tokens=tokens)[0]
        return time.perf_counter() - start, sum(len(c.completion_ids) for c in out)

    generate(4)  # warm-up
    rates = []
    for _ in range(args.repeats):
        t1, n1 = generate(1)
        tn, nn = generate(args.tokens)
        rates.append(2 * params * (nn - n1) / (tn - t1) / 1e9)
    loop = statistics.median(rates)

    config = model.config
    h, i = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (getattr(config, "head_dim", None) or h // config.num_attention_heads)
    layer = [(args.rows, h, h), (args.rows, h, kv), (args.rows, h, kv), (args.rows, h, h),
             (args.rows, h, i), (args.rows, h, i), (args.rows, i, h)]
    step_shapes = layer * config.num_hidden_layers + [(args.rows, h, config.vocab_size)]
    square = gflops_of_mm([(2048, 2048, 2048)], args.repeats)
    shaped = gflops_of_mm(step_shapes, args.repeats * 3)
    print(f"model={args.model} params={params / 1e6:.1f}M threads={torch.get_num_threads()} rows={args.rows} "
          f"(about {2 * params * args.rows / 1e9:.1f} GFLOP per decode step)")
    print(f"decode loop:                 {loop:7.1f} GFLOP/s  (repeats: {' '.join(f'{r:.1f}' for r in rates)})")
    print(f"decode-shaped matmuls (mm):  {shaped:7.1f} GFLOP/s  -> the loop reaches {loop / shaped:.0%} of it")
    print(f"2048^3 matmul:               {square:7.1f} GFLOP/s  -> the loop reaches {loop / square:.0%} of it")

    # where a decode step's time goes
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        generate(9)
    print("\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=40))


if __name__ == "__main__":
    main()
