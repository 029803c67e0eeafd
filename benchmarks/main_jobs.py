"""Peak memory and wall time of every algorithm's default main job (``python -m collab.fit --algo X``, issue 33).

Each job runs alone in a subprocess, exactly as a user starts it (plus ``--trainer.default_root_dir`` into a
temporary folder and any ``--extra`` arguments). While it runs, the resident memory of its whole process tree
(the job and any child it starts: sandboxed code, tokenizer workers) is summed from ``/proc`` every 50 ms; the
peak of that sum is the figure, with the kernel's ``ru_maxrss`` of the largest single process beside it (the
two agree when the job has no child). The held-out line the job prints (before, after, gain) is copied into
the table. Linux only (``/proc``).

    PYTHONPATH=src .venv/bin/python benchmarks/main_jobs.py                         # all seven, ~45 min on 2 cores
    PYTHONPATH=src .venv/bin/python benchmarks/main_jobs.py --algos collm_cc ippo --extra --trainer.max_steps 2
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from collab.compare.running import TreePeak  # resident bytes of a process and its children

ALGOS = ["magrpo", "collm_cc", "collm_dc", "ippo", "maporl", "marft_a", "marft_t"]
CAP_GIB = 3.0


def run(algo: str, extra: list[str], root: Path) -> dict:
    cmd = [sys.executable, "-m", "collab.fit", "--algo", algo, "--trainer.default_root_dir", str(root), *extra]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with TreePeak(proc) as peak:
        out, _ = proc.communicate()
    seconds = time.perf_counter() - start
    held = re.search(r"held-out .*?: before (.*?), after (.*?), gain (.*)", out)
    micro = re.search(r"micro-batches: (\d+) padded tokens", out)
    return {
        "algo": algo,
        "rc": proc.returncode,
        "seconds": seconds,
        "tree_gib": peak.bytes / 2**30,
        "micro": micro.group(1) if micro else "-",
        "held_out": " / ".join(held.groups()) if held else "-",
        "tail": out[-2000:] if proc.returncode else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algos", nargs="+", default=ALGOS, choices=ALGOS)
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="arguments added to every job")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for algo in args.algos:
            row = run(algo, args.extra, Path(tmp))
            rows.append(row)
            print(
                f"{algo}: exit {row['rc']}, {row['seconds'] / 60:.1f} min, peak {row['tree_gib']:.2f} GiB (tree), "
                f"micro-batches {row['micro']}, held-out {row['held_out']}",
                flush=True,
            )
            if row["rc"]:
                print(row["tail"], flush=True)
    print(
        f"\n| algo | wall | peak RSS, process tree | <= {CAP_GIB:g} GiB | micro-batch tokens | "
        "held-out before / after / gain |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        ok = "yes" if r["tree_gib"] <= CAP_GIB else "no"
        print(
            f"| {r['algo']} | {r['seconds'] / 60:.1f} min | {r['tree_gib']:.2f} GiB | {ok} | {r['micro']} | "
            f"{r['held_out']} |"
        )
    return max((r["rc"] for r in rows), default=0)


if __name__ == "__main__":
    sys.exit(main())
