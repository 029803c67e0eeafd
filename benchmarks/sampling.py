"""Time of one decoding step's draw: :func:`collab.policy.draw.sample_tokens` against the full sort.

For each shape (rows x vocabulary) and each kind of next-token distribution, the draw of one token per row as
``sample_tokens`` makes it, against the draw every wide nucleus took before inverse-CDF rejection: the full sort
(:func:`~collab.policy.draw.truncate`) and the exponential race over the whole vocabulary
(:func:`~collab.policy.draw._categorical`; without truncation the race alone). Both sides run in this process,
alternating, on the same logits; the ratio is the race's median time over ``sample_tokens``'.

Distributions (logits, then divided by the temperature):

- ``flat``: a random model's (the tests' tiny Llama: logits of std ~0.16) at temperature 0.7, top-p 0.9: the
  nucleus holds ~90% of the vocabulary;
- ``t1``: a trained model's spread (std 3) at temperature 1, top-p 1 (GRPO's sampling, TRL's default);
- ``peaked``: std 3 at temperature 0.7, top-p 0.9: the nucleus lies within the candidates (unchanged path).

    .venv/bin/python benchmarks/sampling.py
    .venv/bin/python benchmarks/sampling.py --rows 8 --vocab 2000 --repeats 3   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from collab.policy.draw import _categorical, sample_tokens, truncate

KINDS = {"flat": (0.16, 0.7, 0.9), "t1": (3.0, 1.0, 1.0), "peaked": (3.0, 0.7, 0.9)}
"""Each kind's logit std, temperature and top-p."""


def before(logits: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """The draw without the candidates: the race over the whole (sorted and truncated) vocabulary."""
    if bool(((top_p < 1) | (top_k > 0)).any()):
        return _categorical(truncate(logits, top_p, top_k).softmax(-1))
    return _categorical(logits.softmax(-1))


def timed(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--vocab", type=int, default=49_152, help="SmolLM2's vocabulary by default")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    print(f"threads {torch.get_num_threads()}, vocabulary {args.vocab}")
    print("| kind | rows | full sort + race (ms) | sample_tokens (ms) | ratio |")
    print("|---|---|---|---|---|")
    for kind in args.kinds:
        std, temperature, p = KINDS[kind]
        for rows in args.rows:
            logits = torch.randn(rows, args.vocab) * std / temperature
            top_p, top_k = torch.full((rows,), p), torch.zeros(rows, dtype=torch.long)
            old, new = [], []
            for _ in range(2):  # alternate the sides, in halves
                old += timed(lambda: before(logits, top_p, top_k), args.repeats // 2 or 1)
                new += timed(lambda: sample_tokens(logits, top_p, top_k), args.repeats // 2 or 1)
            a, b = statistics.median(old) * 1e3, statistics.median(new) * 1e3
            print(f"| {kind} | {rows} | {a:.2f} | {b:.2f} | {a / b:.1f}x |")
            print(json.dumps({"kind": kind, "rows": rows, "before_ms": a, "sample_tokens_ms": b}), flush=True)


if __name__ == "__main__":
    main()
