"""Seconds per optimizer step of ``python -m collab.fit`` on 1 process against 2 DDP processes (gloo).

    PYTHONPATH=src .venv/bin/python benchmarks/ddp_step.py [--algos marft_a magrpo maporl] [--steps 4]
        [--accelerator cpu] [--devices 2]

Each algorithm's shipped config (the embedded model by default) runs ``--steps`` optimizer steps with the
same global batch, first on one process, then on ``--devices`` processes (``--trainer.strategy ddp``),
without the held-out evaluation (only the step lines are timed). The step times are read from the plain
progress lines (``step k/N ... step X s``; stdout is a pipe); the first step is dropped (warm-up) and the
median of the rest is reported, with the ratio 1-process / N-process (above 1: DDP is faster per step).
On one CPU machine the processes share the same cores, so the ratio shows the overhead of the gradient
synchronisation and of the shards rather than a speed-up; on N GPUs each rank has its own device.
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
STEP = re.compile(r"^step (\d+)/(\d+) .* step ([0-9.]+) s", re.M)
CALLBACKS = json.dumps([{"class_path": "collab.training.callbacks.ModelCheckpoint", "init_args": {"save_last": True}}])


def run(algo: str, steps: int, accelerator: str, devices: int, extra: list[str]) -> tuple[list[float], float]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "collab.fit", "--algo", algo, "--trainer.max_steps", str(steps),
               "--trainer.accelerator", accelerator, "--trainer.callbacks", CALLBACKS,
               "--trainer.logger.init_args.save_dir", str(Path(tmp) / "runs"), *extra]
        if devices > 1:
            cmd += ["--trainer.strategy", "ddp", "--trainer.devices", str(devices)]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        start = time.perf_counter()
        out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if out.returncode != 0:
            raise SystemExit(f"{algo} on {devices} process(es) failed:\n{out.stderr[-3000:]}")
        return [float(m.group(3)) for m in STEP.finditer(out.stdout)], wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algos", nargs="+", default=["marft_a", "magrpo", "maporl"])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--devices", type=int, default=2)
    args, extra = p.parse_known_args()
    print(f"{'algo':8} {'procs':>5} {'steps (s)':40} {'median':>7} {'wall':>7}")
    for algo in args.algos:
        medians = {}
        for devices in (1, args.devices):
            times, wall = run(algo, args.steps, args.accelerator, devices, extra)
            medians[devices] = statistics.median(times[1:] or times)
            print(f"{algo:8} {devices:>5} {' '.join(f'{t:.1f}' for t in times):40} {medians[devices]:7.1f} {wall:7.0f}")
        print(f"{algo:8} ratio 1-process / {args.devices}-process seconds per step: "
              f"{medians[1] / medians[args.devices]:.2f}")


if __name__ == "__main__":
    main()
