"""A run beside another of the same size: how much slower is each step than alone?

Researchers run several jobs on one machine (``collab.compare --jobs``, a notebook beside a run). On 2 cores,
two runs that each use 2 OpenMP threads share them; the question is what the sharing costs beyond the
2x that halving the cores can cost at most. For each variant (environment variables given to the runs), the
same command runs alone, then ``--copies`` copies of it start at once; the figures are each run's step times,
parsed from its progress lines (``step N/M ... rollout R s  step S s``): the first step, and the median of the
later ones (after the first, which holds the warm-up), and the slowdown of the copies against the run alone.

Variants (``--variants``):

- ``chosen``: no wait set, what ``collab.fit`` chooses at its start (:mod:`collab.runtime.threads`: libgomp's
  own alone, 1,000 spins beside other busy processes or another collab run);
- ``spin``: libgomp's default wait (``GOMP_SPINCOUNT=300000``: an idle thread spins before it sleeps), what torch
  does unless told otherwise;
- ``spin30k``, ``spin10k``, ``spin1k``: fewer spins (``GOMP_SPINCOUNT``); ``spin1k`` is what ``collab.fit`` and
  ``collab.evaluate`` choose when the cores are shared;
- ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` (an idle thread sleeps at once);
- ``one``: one thread each (``OMP_NUM_THREADS=1``), what ``collab.compare --jobs 2`` gives each run on 2 cores.

Each variant takes ~5-20 minutes on 2 cores (its pair the longer part):

    PYTHONPATH=src .venv/bin/python benchmarks/shared_machine.py --variants spin passive --steps 4 --out /tmp/shared.md
    PYTHONPATH=src .venv/bin/python benchmarks/shared_machine.py --variants spin10k spin1k --steps 4

Nothing else may run meanwhile: the point is the copies' own contention.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {
    "chosen": {},
    "spin": {"GOMP_SPINCOUNT": "300000"},
    "spin30k": {"GOMP_SPINCOUNT": "30000"},
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
    "spin1k": {"GOMP_SPINCOUNT": "1000"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "one": {"OMP_NUM_THREADS": "1"},
}
CLEARED = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
STEP = re.compile(r"^step (\d+)/\d+.*?rollout ([\d.]+) s\s+step ([\d.]+) s", re.M)
WAIT = re.compile(r"idle threads: (?:spin (\d+) times|(.*))")


def start(command: list[str], env: dict[str, str], root: Path) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if k not in CLEARED}
    return subprocess.Popen(
        [*command, "--trainer.default_root_dir", str(root)],
        env={**base, **env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def together(command: list[str], env: dict[str, str], copies: int, root: Path) -> list[dict]:
    """``copies`` runs started at once; each one's step and rollout seconds."""
    procs = [start(command, env, root / str(i)) for i in range(copies)]
    began = time.perf_counter()
    runs = []
    for proc in procs:
        out, _ = proc.communicate()
        steps = [(float(r), float(s)) for _, r, s in STEP.findall(out)]
        if proc.returncode or not steps:
            sys.exit(f"run failed (exit {proc.returncode}):\n{out[-3000:]}")
        wait = WAIT.search(out)
        runs.append({"steps": steps, "wall": time.perf_counter() - began, "wait": wait and (wait[1] or wait[2])})
    return runs


def later(steps: list[tuple[float, float]], index: int) -> float:
    rest = steps[1:] or steps
    return statistics.median(s[index] for s in rest)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--algo", default="marft_a")
    ap.add_argument("--out", type=Path)
    ap.add_argument("extra", nargs="*", help="more collab.fit arguments (after --)")
    args = ap.parse_args()
    command = [sys.executable, "-m", "collab.fit", "--algo", args.algo, "--trainer.max_steps", str(args.steps)]
    command += args.extra
    lines = [
        f"`{' '.join(['collab.fit', *command[3:]])}`, {os.cpu_count()} cores, "
        f"{args.copies} copies at once against alone",
        "",
        "| variant | run | spins | first step s | later steps s (median) | rollout s (median) | slowdown (later) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in args.variants:
        with tempfile.TemporaryDirectory() as tmp:
            alone = together(command, VARIANTS[name], 1, Path(tmp) / "alone")[0]
            shared = together(command, VARIANTS[name], args.copies, Path(tmp) / "shared")
        base = later(alone["steps"], 1)
        rows = [("alone", alone)] + [(f"copy {i + 1} of {args.copies}", run) for i, run in enumerate(shared)]
        for label, run in rows:
            step = later(run["steps"], 1)
            lines.append(
                f"| {name} | {label} | {run['wait']} | {run['steps'][0][1]:.1f} | {step:.1f} "
                f"| {later(run['steps'], 0):.1f} | {step / base:.2f}x |"
            )
        print("\n".join(lines[-len(rows) :]), flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
