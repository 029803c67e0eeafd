"""Shared-prefix prefill: one depth of a Minecraft MAGRPO rollout tree, prefilled with and without sharing.

At depth d of the tree (K = 2) each house has 2^d history nodes, and every history of a player opens
with the same E.3 prompt (about 900-1,400 tokens). ``collab.policy.prefill.prefill`` runs each player's prompt
once and only the nodes' own remainders (the player's last commands and the feedback) per row;
"one pass" prefills every row's whole history (``MIN_PREFIX_SAVING`` set above 1 turns sharing off).
Both then decode the same way. The histories are built by scripted actions, so both methods see the
same requests; the order alternates across repeats and each is warmed up once.

    PYTHONPATH=src .venv/bin/python benchmarks/prefix.py                      # SmolLM2, depth 2: ~4 min on 2 cores
    PYTHONPATH=src .venv/bin/python benchmarks/prefix.py --model tiny --repeats 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import collab.policy.prefixes as prefixes
from collab.envs.minecraft.env import MinecraftEnv
from collab.policy.models import BaseConfig
from collab.policy.sampling import GenerationRequest
from collab.policy.team import AgentSpec, AgentTeam, SamplingSpec

SCRIPTED = ["/fill 0 0 0 1 0 1 stone", "I will build the walls first.", "/kill", "/fill 9 9 9 9 9 9 air"]
"""Actions that make sibling histories differ (valid, rejected, attack and out-of-box lines)."""


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="base model name (default: %(default)s)")
    ap.add_argument("--houses", type=int, default=2, help="train houses (default: %(default)s)")
    ap.add_argument("--depth", type=int, default=2, help="tree depth d: 2^d nodes per house (default: %(default)s)")
    ap.add_argument("--k", type=int, default=2, help="samples per player and node (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="(default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats of each method (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    return ap.parse_args(argv)


def histories(env: MinecraftEnv, houses: int, depth: int):
    """The states at ``depth`` of a binary tree of scripted joint actions, for the first ``houses`` houses."""
    frontier = [env.reset(task) for task in env.tasks("train")[:houses]]
    for d in range(depth):
        nxt = []
        for state in frontier:
            for child in range(2):
                actions = [SCRIPTED[(d + child + i) % len(SCRIPTED)] for i in range(env.n_agents)]
                nxt.append(env.step(state, actions).state)
        frontier = nxt
    return frontier


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    env = MinecraftEnv()
    team = AgentTeam(
        [AgentSpec(sampling=SamplingSpec(temperature=0.6, top_p=0.6, top_k=0)) for _ in env.roles],
        BaseConfig(name=args.model),
    )
    states = histories(env, args.houses, args.depth)
    requests = [
        GenerationRequest(i, team.encode(i, s.histories[i]), args.k) for s in states for i in range(env.n_agents)
    ]
    names = [team.names[r.agent] for r in requests]
    group_of, lengths = prefixes.shared_prefixes([r.prompt_ids for r in requests], names)
    total = sum(len(r.prompt_ids) for r in requests)
    shared = total - sum((group_of.count(g) - 1) * n for g, n in enumerate(lengths))
    print(
        f"model={args.model} threads={torch.get_num_threads()} houses={args.houses} depth={args.depth} "
        f"rows={len(requests)} K={args.k} max_new_tokens={args.max_new_tokens}"
    )
    print(
        f"prompt tokens: {total} in one pass, {shared} with shared prefixes "
        f"(longest prompt {max(len(r.prompt_ids) for r in requests)})"
    )

    threshold = prefixes.MIN_PREFIX_SAVING
    methods = {"shared": threshold, "one pass": 2.0}

    def run(method: str, max_new_tokens: int) -> tuple[int, float]:
        prefixes.MIN_PREFIX_SAVING = methods[method]
        try:
            start = time.perf_counter()
            out = team.generate(requests, max_new_tokens=max_new_tokens)
            return sum(len(c.completion_ids) for group in out for c in group), time.perf_counter() - start
        finally:
            prefixes.MIN_PREFIX_SAVING = threshold

    for m in methods:
        run(m, 2)
    seconds: dict[str, list[float]] = {m: [] for m in methods}
    print(f"\n{'repeat':>6}  {'first':<9} {'shared tok':>10} {'s':>7}  {'one-pass tok':>12} {'s':>7}")
    for r in range(args.repeats):
        order = list(methods) if r % 2 == 0 else list(reversed(methods))
        row = {}
        for m in order:
            torch.manual_seed(args.seed + 1 + r)
            row[m] = run(m, args.max_new_tokens)
            seconds[m].append(row[m][1])
        print(
            f"{r:>6}  {order[0]:<9} {row['shared'][0]:>10} {row['shared'][1]:>7.2f}  "
            f"{row['one pass'][0]:>12} {row['one pass'][1]:>7.2f}"
        )
    med = {m: statistics.median(v) for m, v in seconds.items()}
    print(f"\nmedian seconds: shared {med['shared']:.2f}   one pass {med['one pass']:.2f}")
    print(f"speed-up of sharing: {med['one pass'] / med['shared']:.2f}x")


if __name__ == "__main__":
    main()
