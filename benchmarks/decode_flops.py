"""Decoding against the CPU's own limit: achieved GFLOP/s of collab's decode loop next to plain matmuls.

A decode step of a dense decoder costs about 2 x parameters FLOPs per row (the attention over the cache
adds a little at these lengths): SmolLM2-135M at 32 rows, 8.6 GFLOP. The loop's rate is measured as
``team.generate`` of 32 samples of one prompt (split among ``--agents`` LoRA adapters, at the configs'
temperature 0.7 and top-p 0.9) with ``--tokens`` new tokens minus the same call with 1 new token (which
leaves the prefill and the set-up), over the tokens generated in between. Beside it, on the same threads:
a large square matmul (what the cores can do) and the decode step's own matmuls (32 rows times each
weight of the model, ``torch.mm``), i.e. the best a step could reach at this batch size. Then
``torch.profiler`` over a few decode steps says where the time goes, op by op and grouped by what the
ops serve (base weights, LoRA, attention, sampling, the rest).

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
    ap.add_argument(
        "--agents", type=int, default=2, help="agents (LoRA adapters) sharing the rows (default: %(default)s)"
    )
    ap.add_argument("--temperature", type=float, default=0.7, help="(default: %(default)s, the configs' value)")
    ap.add_argument(
        "--top-p", type=float, default=0.9, help="(default: %(default)s, the configs'; 1 samples the whole vocabulary)"
    )
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    sampling = SamplingSpec(temperature=args.temperature, top_p=args.top_p)
    team = AgentTeam([AgentSpec(sampling=sampling) for _ in range(args.agents)], BaseConfig(name=args.model))
    model = team.model_of(0)
    params = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    prompt = team.encode(0, [{"role": "user", "content": "Write a long story about a lighthouse keeper."}])
    share = [args.rows // args.agents + (a < args.rows % args.agents) for a in range(args.agents)]

    def generate(tokens: int) -> tuple[float, int]:
        torch.manual_seed(1)
        start = time.perf_counter()
        outs = team.generate([GenerationRequest(a, prompt, n) for a, n in enumerate(share)], max_new_tokens=tokens)
        return time.perf_counter() - start, sum(len(c.completion_ids) for out in outs for c in out)

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
    layer = [
        (args.rows, h, h),
        (args.rows, h, kv),
        (args.rows, h, kv),
        (args.rows, h, h),
        (args.rows, h, i),
        (args.rows, h, i),
        (args.rows, i, h),
    ]
    step_shapes = layer * config.num_hidden_layers + [(args.rows, h, config.vocab_size)]
    square = gflops_of_mm([(2048, 2048, 2048)], args.repeats)
    shaped = gflops_of_mm(step_shapes, args.repeats * 3)
    print(
        f"model={args.model} params={params / 1e6:.1f}M threads={torch.get_num_threads()} rows={args.rows} "
        f"(about {2 * params * args.rows / 1e9:.1f} GFLOP per decode step)"
    )
    print(f"decode loop:                 {loop:7.1f} GFLOP/s  (repeats: {' '.join(f'{r:.1f}' for r in rates)})")
    print(f"decode-shaped matmuls (mm):  {shaped:7.1f} GFLOP/s  -> the loop reaches {loop / shaped:.0%} of it")
    print(f"2048^3 matmul:               {square:7.1f} GFLOP/s  -> the loop reaches {loop / square:.0%} of it")

    # where a decode step's time goes
    from torch.profiler import ProfilerActivity, profile

    steps = 9
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        generate(steps)
    print("\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=40))
    ranks = lora_ranks(model)
    groups: dict[str, float] = {}
    for e in prof.key_averages(group_by_input_shape=True):
        group = group_of(e.key, e.input_shapes, ranks)
        groups[group] = groups.get(group, 0.0) + e.self_cpu_time_total / 1e3
    total = sum(groups.values())
    print(f"where {steps} decode steps (and the prefill) went, {total:.0f} ms in all:")
    for group, ms in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"  {group:<44} {ms:8.1f} ms  {ms / total:5.1%}")


OP_GROUPS = {
    "base weights (mm, addmm, linear)": {"aten::mm", "aten::addmm", "aten::matmul", "aten::linear"},
    "LoRA (the rows' adapters)": {"aten::bmm"},  # and mm by a rank: group_of
    "attention (sdpa)": {
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_attention_math",
        "aten::scaled_dot_product_attention",
    },
    "sampling (softmax, top-p, draws, log-probs)": {
        "aten::exponential_",
        "aten::_softmax",
        "aten::_log_softmax",
        "aten::topk",
        "aten::sort",
        "aten::cumsum",
        "aten::argmax",
        "aten::div",
        "aten::masked_fill",
        "aten::masked_fill_",
        "aten::gather",
        "aten::where",
        "aten::rand",
        "aten::uniform_",
        "aten::searchsorted",
        "aten::logsumexp",
        "aten::sum",
        "aten::_local_scalar_dense",
        "aten::item",
    },
}
"""Profiler ops by what they serve in a decode step (elementwise ops of the layers fall in "everything else")."""


def lora_ranks(model) -> set[int]:
    """Inner sizes of the LoRA products: each adapter's rank and their sum over a layer's adapters."""
    ranks: set[int] = set()
    for module in model.modules():
        if hasattr(module, "lora_A") and len(module.lora_A):
            sizes = [a.weight.shape[0] for a in module.lora_A.values()]
            ranks.update(sizes)
            ranks.add(sum(sizes))
    return ranks


def group_of(op: str, input_shapes, ranks: set[int]) -> str:
    """The group of one profiled op; a plain matrix product with a LoRA rank among its sizes is LoRA's
    (the one-token route of ``lora_batch`` multiplies by the concatenated adapters with ``mm``)."""
    if op in {"aten::mm", "aten::matmul"} and any(shape and shape[-1] in ranks for shape in input_shapes or []):
        return "LoRA (the rows' adapters)"
    return next((g for g, ops in OP_GROUPS.items() if op in ops), "everything else")


if __name__ == "__main__":
    main()
