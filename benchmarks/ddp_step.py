"""Step time and rollout throughput of ``python -m collab.fit`` on 1 process against N DDP processes, same global batch.

    PYTHONPATH=src .venv/bin/python benchmarks/ddp_step.py [--algos marft_a magrpo maporl] [--steps 4]
        [--accelerator cpu] [--devices 2] [--strategies ddp fsdp] [any collab.fit option, e.g. --model.base.name tiny]

Each algorithm's shipped config (the embedded model by default) runs ``--steps`` optimizer steps with the
same global batch (``data.batch_size`` is global: each of N processes plays 1/N of the step's tasks),
first on one process, then on ``--devices`` processes under each of ``--strategies`` (``ddp``; ``fsdp``: collab's
sharded frozen base, which also reports the weights each process keeps), without the held-out
evaluation (only the steps are timed), one after the other in the same run. Read from the plain
progress lines (``step k/N  reward R  tokens/s T  rollout S s  step X s``; stdout is a pipe): the step's
wall time and the rollout's decoding throughput, which the run logs as the mean over the ranks of each
rank's own tokens/s (``collab.runtime.collectives.global_means``), i.e. per rank. The first step is
dropped (warm-up) and medians of the rest are reported, with

- ``step ratio`` = median step time at 1 process / at N (above 1: N processes finish a step sooner);
- ``tokens/s ratio`` = N x per-rank tokens/s at N processes / tokens/s at 1 process (the team's decoding
  throughput at N against 1: N on N separate devices with no contention).

On one CPU machine the processes share the same cores, so the ratios show the cost of the shards and of
the gradient synchronisation rather than a speed-up; on N GPUs each rank has a device of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP = re.compile(r"^step (\d+)/\d+\s.*$", re.M)
FIELD = {
    "tokens": re.compile(r"tokens/s ([0-9.]+)"),
    "rollout": re.compile(r"rollout ([0-9.]+) s"),
    "step": re.compile(r"step ([0-9.]+) s"),
}
CALLBACKS = json.dumps([{"class_path": "collab.training.callbacks.ModelCheckpoint", "init_args": {"save_last": True}}])


def parse(stdout: str) -> list[dict[str, float]]:
    """One dict per progress line: ``step`` (s), ``rollout`` (s) and ``tokens`` (per-rank tokens/s)."""
    rows = []
    for line in STEP.finditer(stdout):
        found = {k: pattern.search(line.group(0)) for k, pattern in FIELD.items()}
        rows.append({k: float(m.group(1)) for k, m in found.items() if m})
    return rows


KEPT = re.compile(r"each keeps ([0-9.]+) of ([0-9.]+) MiB")


def run(
    algo: str, steps: int, accelerator: str, devices: int, extra: list[str], strategy: str = "ddp"
) -> tuple[list[dict[str, float]], float, str]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "collab.fit",
            "--algo",
            algo,
            "--trainer.max_steps",
            str(steps),
            "--trainer.accelerator",
            accelerator,
            "--trainer.callbacks",
            CALLBACKS,
            "--trainer.logger.init_args.save_dir",
            str(Path(tmp) / "runs"),
            *extra,
        ]
        if devices > 1:
            cmd += ["--trainer.strategy", strategy, "--trainer.devices", str(devices)]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        start = time.perf_counter()
        out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if out.returncode != 0:
            raise SystemExit(f"{algo} on {devices} process(es) failed:\n{out.stderr[-3000:]}")
        kept = KEPT.search(out.stderr)
        return parse(out.stdout), wall, f"{kept.group(1)} of {kept.group(2)} MiB" if kept else ""


def median(rows: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values[1:] or values) if values else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algos", nargs="+", default=["marft_a", "magrpo", "maporl"])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--strategies", nargs="+", default=["ddp"], choices=["ddp", "fsdp"])
    args, extra = p.parse_known_args()
    n = args.devices
    print(
        f"{'algo':8} {'procs':>9} {'step times (s)':32} {'step':>6} {'rollout':>7} {'tok/s/rank':>10} {'wall':>6}  "
        "weights kept"
    )
    for algo in args.algos:
        figures = {}
        for devices, strategy in [(1, "-"), *((n, s) for s in args.strategies)]:
            rows, wall, kept = run(algo, args.steps, args.accelerator, devices, extra, strategy)
            figures[strategy] = f = {k: median(rows, k) for k in FIELD}
            times = " ".join(f"{r['step']:.1f}" for r in rows if "step" in r)
            label = f"{devices} {strategy}" if devices > 1 else "1"
            print(
                f"{algo:8} {label:>9} {times:32} "
                f"{f['step']:6.1f} {f['rollout']:7.1f} {f['tokens']:10.1f} {wall:6.0f}  {kept}"
            )
        one = figures["-"]
        for strategy in args.strategies:
            many = figures[strategy]
            print(
                f"{algo:8} {strategy}: step ratio 1-process / {n}-process: {one['step'] / many['step']:.2f}; "
                f"tokens/s ratio {n} x per-rank at {n} / 1-process: {n * many['tokens'] / one['tokens']:.2f}"
            )


if __name__ == "__main__":
    main()
