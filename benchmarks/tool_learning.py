"""Learning with tools (issue 52's criterion): from a ``collab.compare`` folder of tool-using cells, each run's held-out
accuracy and fraction of right calls before and after training, and per algorithm the gains across seeds.

The accuracy, its gain and the gain's paired SE are ``results.csv``'s (the grid's own held-out score). The right
calls are ``steps.csv``'s ``eval/env/tool_right`` at the run's first and last logged step: the mean over the eval
problems of the calls whose result was the problem's answer. With ``tool_choice`` every turn of the calling agent
opens with one call (``tool_budget: {calls: 1}``), so it is the fraction of the forced calls that were right; the
calls that parsed and ran (``eval/env/tool_calls``) are shown beside it. Across seeds: how many gains are positive,
their mean and its standard error (the standard deviation over seeds / sqrt(seeds)).

    python -m collab.compare --defaults --algos magrpo ippo marft_a --seeds 0 1 2 3 4 \\
        --output runs/compare_math_tools --config conf/compare/math_tools.yaml
    PYTHONPATH=src .venv/bin/python benchmarks/tool_learning.py runs/compare_math_tools
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from pathlib import Path


def first_and_last(rows: list[dict], tag: str) -> tuple[float, float]:
    """A run's ``tag`` at its first and last logged step (NaN when it never logged it)."""
    values = sorted((int(r["step"]), float(r["value"])) for r in rows if r["tag"] == tag)
    return (values[0][1], values[-1][1]) if values else (math.nan, math.nan)


def mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="a collab.compare --output folder")
    args = ap.parse_args(argv)
    results = list(csv.DictReader(open(args.folder / "results.csv")))
    steps = defaultdict(list)
    for r in csv.DictReader(open(args.folder / "steps.csv")):
        steps[(r["method"], r["seed"])].append(r)
    gains: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    header = "method | seed | accuracy before | after | gain (paired SE) | right calls before | after | calls run after"
    print(f"| {header} |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        if r["returncode"] != "0" or not r["gain"]:
            continue
        runs = steps[(r["method"], r["seed"])]
        right_before, right_after = first_and_last(runs, "eval/env/tool_right")
        _, calls_after = first_and_last(runs, "eval/env/tool_calls")
        print(
            f"| {r['method']} | {r['seed']} | {float(r['before']):.4f} | {float(r['score']):.4f} | "
            f"{float(r['gain']):+.4f} ± {float(r['gain_se']):.4f} | {right_before:.4f} | {right_after:.4f} | "
            f"{calls_after:.4f} |"
        )
        gains[r["method"]]["accuracy"].append(float(r["gain"]))
        gains[r["method"]]["right calls"].append(right_after - right_before)
    print()
    for method, kinds in gains.items():
        for kind, values in kinds.items():
            mean, se = mean_se(values)
            ratio = mean / se if se > 0 else math.copysign(math.inf, mean) if se == 0 and mean else math.nan
            positive = sum(v > 0 for v in values)
            print(
                f"{method} {kind}: gain positive on {positive} of {len(values)} seeds, "
                f"mean {mean:+.4f} ± {se:.4f} ({ratio:.1f} SE)"
            )


if __name__ == "__main__":
    main()
