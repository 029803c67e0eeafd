"""The main jobs on several seeds: ``python -m collab.fit --algo X`` with seed k as ``--seed_everything k
--data.seed k`` and no other argument, each run's held-out line collected into one table (issue 32).

    python benchmarks/default_seeds.py --algos collm_cc ippo --seeds 0 1 2 3 4 --jobs 2 --out runs/default_seeds

Each run is a subprocess writing ``OUT/ALGO/seed_K.log`` (and its run folder under ``OUT/ALGO/seed_K``); a seed
whose run folder already holds its held-out figures (``reward_summary.json``) is not run again (resumable). ``--jobs 2`` runs two at a time with
one thread each (the tuning setting on 2 cores); ``--jobs 1`` one at a time with every thread (the setting of
the 10-minute figure). Writes ``OUT/seeds.csv`` (one row per run) and ``OUT/seeds.md`` (per algorithm: every
seed's before, after and paired gain, then the mean gain over seeds with its standard error and how many seeds
gained) and prints the markdown.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WALL = re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?P<t>[\d:.]+)")
RSS = re.compile(r"Maximum resident set size \(kbytes\): (?P<kb>\d+)")


def held_out(log: Path) -> dict | None:
    """The run's held-out figures (the ``held_out`` entry of its ``reward_summary.json``, as
    :func:`collab.evaluation.grid.fill` reads a grid cell's) with the wall time and peak RSS that
    ``/usr/bin/time -v`` wrote to its log; None when the run has no held-out figures yet."""
    summaries = sorted(log.with_suffix("").glob("*/version_*/reward_summary.json"))
    held = json.loads(summaries[-1].read_text()).get("held_out") if summaries else None
    if not held:
        return None
    row = {"metric": "accuracy" if held["score"] == "solved" else held["score"], "n": held["problems"],
           "how": "greedy" if held["greedy"] else f"{held['samples']} samples"}
    row.update({k: held[k] for k in ("before", "before_se", "after", "after_se", "gain", "gain_se")})
    text = log.read_text(errors="replace") if log.exists() else ""
    wall, rss = WALL.search(text), RSS.search(text)
    if wall:
        parts = [float(p) for p in wall["t"].split(":")]
        row["wall_s"] = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    if rss:
        row["peak_rss_gib"] = int(rss["kb"]) / 2**20
    return row


def run(algo: str, seed: int, out: Path, threads: int, extra: list[str]) -> None:
    folder = out / algo
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"seed_{seed}.log"
    if held_out(log) is not None:
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    time_v = ["/usr/bin/time", "-v"] if Path("/usr/bin/time").exists() else []
    cmd = [*time_v, sys.executable, "-m", "collab.fit", "--algo", algo, "--seed_everything", str(seed),
           "--data.seed", str(seed), "--trainer.default_root_dir", str(folder / f"seed_{seed}"), *extra]
    start = time.time()
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        code = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    print(f"{algo} seed {seed}: exit {code} in {time.time() - start:.0f} s ({log})", flush=True)


def table(rows: list[dict]) -> str:
    lines = []
    for algo in dict.fromkeys(r["algo"] for r in rows):
        mine = [r for r in rows if r["algo"] == algo]
        metric = mine[0]["metric"]
        lines += [f"### {algo}: held-out {metric} ({mine[0]['n']} eval problems, {mine[0]['how']})", "",
                  "| seed | before | after | gain (paired SE) | SE | wall | peak RSS |", "|---|---|---|---|---|---|---|"]
        for r in mine:
            z = r["gain"] / r["gain_se"] if r["gain_se"] > 0 else float("nan")
            wall = f"{r['wall_s'] / 60:.1f} min" if r.get("wall_s") else ""
            rss = f"{r['peak_rss_gib']:.2f} GiB" if r.get("peak_rss_gib") else ""
            lines.append(f"| {r['seed']} | {r['before']:.4f} ± {r['before_se']:.4f} | {r['after']:.4f} ± {r['after_se']:.4f} "
                         f"| {r['gain']:+.4f} ± {r['gain_se']:.4f} | {z:.1f} | {wall} | {rss} |")
        gains = [r["gain"] for r in mine]
        mean = sum(gains) / len(gains)
        se = (math.sqrt(sum((g - mean) ** 2 for g in gains) / (len(gains) - 1) / len(gains))
              if len(gains) > 1 else float("nan"))
        positive = sum(g > 0 for g in gains)
        lines += ["", f"Mean gain over {len(gains)} seeds {mean:+.4f} ± {se:.4f} (SE over seeds; {mean / se:.1f} SE); "
                  f"positive on {positive} of {len(gains)}.", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algos", nargs="+", required=True)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("runs/default_seeds"))
    p.add_argument("--report_only", action="store_true", help="only collect the logs already written")
    args, extra = p.parse_known_args()
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    if not args.report_only:
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda job: run(*job, args.out, threads, extra), [(a, s) for a in args.algos for s in args.seeds]))
    rows = []
    for algo in args.algos:
        for seed in args.seeds:
            row = held_out(args.out / algo / f"seed_{seed}.log")
            if row is not None:
                rows.append({"algo": algo, "seed": seed, **row})
    if rows:
        with open(args.out / "seeds.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            writer.writeheader()
            writer.writerows(rows)
        (args.out / "seeds.md").write_text(table(rows) + "\n")
        print(table(rows))


if __name__ == "__main__":
    main()
