"""Peak memory and time of one decoding call in parts (``--model.decode_memory_gb``) against one batch.

The shape is the deepest level of Minecraft's rollout tree (``python -m collab.fit --data.env minecraft``): 2 houses
x 8 histories x 2 players = 32 requests of K = 2 samples each, prompts of ``--prompt`` tokens (default 1,900,
the E.3 prompt with its last turn) whose first ``prompt - 200`` tokens each player's histories share (random token
ids; agent 0 and agent 1 interleaved, as the tree lists them). Every setting runs in a subprocess of its own
(each peak is that process's alone: resident bytes sampled every 5 ms, minus the resident bytes before the
call), one after the other, and prints the ratio of its time and peak to the first setting of the same run (one
batch, the prefill in one pass). Each budget runs with each ``--chunks`` setting: the prefill fed that many columns at
a time (``collab.policy.prefill.PREFILL_CHUNK``, 512 by default; 0: one pass, as before pieces existed).

    .venv/bin/python benchmarks/decode_parts.py   # one batch, parts of 1 and 0.5 GiB; whole and 512
    .venv/bin/python benchmarks/decode_parts.py --new 32 --budgets 1 --chunks 512   # 32 new tokens, one budget
    .venv/bin/python benchmarks/decode_parts.py --model tiny --prompt 300 --budgets 0.001   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time


def measure(model: str, prompt: int, requests: int, new: int, budget_gb: float | None, chunk: int = 0) -> dict:
    """One ``team.generate`` call in this process: seconds, peak resident bytes over the start, parts, cache bytes.
    ``chunk``: the prefill's columns a pass (0: one pass)."""
    import torch

    import collab.policy.prefill as prefill_module

    saved_chunk, prefill_module.PREFILL_CHUNK = prefill_module.PREFILL_CHUNK, chunk or 1 << 30

    from collab.policy.models import BaseConfig
    from collab.policy.sampling import GenerationRequest
    from collab.policy.team import AgentSpec, AgentTeam, SamplingSpec
    from collab.runtime.memory import resident_bytes

    torch.manual_seed(0)
    team = AgentTeam(
        [AgentSpec(sampling=SamplingSpec(temperature=1.0, max_new_tokens=new)) for _ in range(2)],
        BaseConfig(name=model, device="cpu"),
    )
    g = torch.Generator().manual_seed(0)
    vocab = min(team.tokenizer_of(0).vocab_size, 40000)
    shared = [torch.randint(100, vocab, (prompt - 200,), generator=g).tolist() for _ in range(2)]
    rows = [
        GenerationRequest(r % 2, shared[r % 2] + torch.randint(100, vocab, (200,), generator=g).tolist(), 2)
        for r in range(requests)
    ]
    team.decode_memory = None if budget_gb is None else int(budget_gb * 2**30)
    per_token = team.agents[0].base.cache_bytes_per_token()
    peak, running = [0], [True]

    def sample():
        while running[0]:
            peak[0] = max(peak[0], resident_bytes())
            time.sleep(0.005)

    import collab.policy.team as team_module

    calls, decode = [0], team_module.decode
    team_module.decode = lambda *a: calls.__setitem__(0, calls[0] + 1) or decode(*a)  # count the parts
    start_bytes = resident_bytes()
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    start = time.perf_counter()
    try:
        team.generate(rows, max_new_tokens=new)
    finally:
        team_module.decode = decode
        prefill_module.PREFILL_CHUNK = saved_chunk
    seconds = time.perf_counter() - start
    running[0] = False
    thread.join()
    return {
        "seconds": seconds,
        "peak_bytes": peak[0] - start_bytes,
        "parts": calls[0],
        "cache_gib": 2 * requests * (prompt + new) * per_token / 2**30,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--prompt", type=int, default=1900)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--new", type=int, default=4, help="new tokens a sample (the prefill and the cache dominate)")
    p.add_argument("--budgets", type=float, nargs="+", default=[1.0, 0.5], help="GiB of KV cache a part")
    p.add_argument(
        "--chunks",
        type=int,
        nargs="+",
        default=[0, 512],
        help="prefill columns a pass, each budget with each (0: one pass)",
    )
    p.add_argument("--one", type=float, default=-1.0, help=argparse.SUPPRESS)  # internal: run one setting here
    p.add_argument("--chunk", type=int, default=0, help=argparse.SUPPRESS)  # internal: its chunk
    args = p.parse_args()
    if args.one != -1.0:
        print(
            json.dumps(
                measure(
                    args.model, args.prompt, args.requests, args.new, None if args.one == 0 else args.one, args.chunk
                )
            )
        )
        return
    rows = []
    for budget in [0.0, *args.budgets]:
        for chunk in args.chunks:
            cmd = [
                sys.executable,
                __file__,
                "--model",
                args.model,
                "--prompt",
                str(args.prompt),
                "--requests",
                str(args.requests),
                "--new",
                str(args.new),
                "--one",
                str(budget),
                "--chunk",
                str(chunk),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            rows.append((budget, chunk, json.loads(out)))
    base = rows[0][2]
    print(
        f"{args.requests} requests x 2 samples x ({args.prompt} + {args.new}) tokens: {base['cache_gib']:.2f} GiB "
        f"of KV cache ({args.model})"
    )
    print("| setting | prefill | parts | time | peak over start | time / first | peak / first |")
    print("|---|---|---|---|---|---|---|")
    for budget, chunk, r in rows:
        name = "one batch" if budget == 0 else f"parts of {budget:g} GiB"
        pieces = "one pass" if chunk == 0 else f"{chunk} columns a pass"
        print(
            f"| {name} | {pieces} | {r['parts']} | {r['seconds']:.1f} s | {r['peak_bytes'] / 2**30:.2f} GiB "
            f"| {r['seconds'] / base['seconds']:.2f} | {r['peak_bytes'] / max(base['peak_bytes'], 1):.2f} |"
        )


if __name__ == "__main__":
    main()
