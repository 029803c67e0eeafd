"""The quick start's phases on two commits in one run: rollout, update and held-out evaluation seconds.

Runs the quick start's job (``python -m collab.fit --algo marft_a``, cut to ``--steps`` optimizer steps) on this
checkout's working tree and on ``--against REV`` (extracted with ``git archive`` into a temporary folder), A B A B
... for ``--repeats`` rounds, each run a fresh process importing collab from its own tree through the same
``collab.fit.main`` entry the command uses (so each commit chooses its own threads and OpenMP wait). Each run
times, on the module and the evaluation callback:

- rollout: the algorithm's ``rollout`` (generation, rewards), per step;
- update: the rest of each training step (log-prob forwards, losses, backward, optimizer);
- evaluation: the held-out evaluation at the start of training (greedy decoding of the eval problems); the one at
  the end decodes the same problems and is skipped unless ``--end-evaluation`` (then each run prints its held-out
  line).

The table gives each phase's median over the runs and steps, and the ratio REV / this checkout, pair by pair,
since the machine's speed drifts; the held-out line each run printed is kept to show both did the same work.
``--isa avx2`` forces the AVX2 kernels of ATen, oneDNN and MKL on an AVX-512 machine (``ATEN_CPU_CAPABILITY``,
``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS``), as a Zen 3 machine runs them.

    PYTHONPATH=src .venv/bin/python benchmarks/quickstart_phases.py --against 50660fc
    PYTHONPATH=src .venv/bin/python benchmarks/quickstart_phases.py --against HEAD~3 --isa avx2 --steps 1

Run it alone on the machine: two torch processes on two cores slow each other several-fold.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("rollout", "update", "evaluation")
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def extract(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (a commit of this repository) under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def child(tree: Path, steps: int, out: Path, end_evaluation: bool) -> None:
    """One run of the quick start's job from ``tree``'s sources, its phases written to ``out`` as JSON."""
    sys.path.insert(0, str(tree / "src"))
    try:  # before torch's import, as collab.fit's main does on the commits that have it
        from collab.runtime import threads

        getattr(threads, "choose_wait", getattr(threads, "spin_briefly", lambda: None))()
    except ImportError:
        pass
    import lightning as L

    record: dict = {"steps": [], "evaluation": []}
    real_fit = L.Trainer.fit

    def timed(fn, sink):
        @functools.wraps(fn)  # Lightning reads training_step's signature
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                sink(time.perf_counter() - start)

        return wrapper

    def fit(trainer, model, *args, **kwargs):
        rollouts: list[float] = []
        model.rollout = timed(model.rollout, rollouts.append)

        def step_done(seconds: float) -> None:
            inside = sum(rollouts)  # a rollout run inside the step (or just before it, by the data module)
            rollouts.clear()
            record["steps"].append({"rollout": inside, "update": max(seconds - inside, 0.0) if inside else seconds})

        model.training_step = timed(model.training_step, step_done)
        for callback in trainer.callbacks:
            if type(callback).__name__ == "EvaluationCallback":
                callback.on_train_start = timed(callback.on_train_start, record["evaluation"].append)
                if not end_evaluation:  # the same decoding as the start's
                    callback.on_train_end = lambda *args, **kwargs: None
        record["fit_start"] = time.perf_counter()
        return real_fit(trainer, model, *args, **kwargs)

    L.Trainer.fit = fit
    from collab.fit import main

    with tempfile.TemporaryDirectory() as root:
        start = time.perf_counter()
        code = main(["--algo", "marft_a", "--trainer.max_steps", str(steps), "--trainer.default_root_dir", root])
        record["wall"] = time.perf_counter() - start
        record["load"] = record.pop("fit_start", start) - start
    record["exit"] = code
    out.write_text(json.dumps(record))


def run(tree: Path, steps: int, env: dict, end_evaluation: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "phases.json"
        proc = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--child",
                str(tree),
                "--steps",
                str(steps),
                "--out",
                str(out),
                *(["--end-evaluation"] if end_evaluation else []),
            ],
            env=env,
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 or not out.exists():
            sys.exit(f"error: the run of {tree} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        record = json.loads(out.read_text())
    record["held_out"] = [line for line in proc.stdout.splitlines() if line.startswith("held-out")]
    steps_ = record["steps"][1:] or record["steps"]  # the first step holds the micro-batch probe's warm-up
    return {
        "rollout": statistics.median(s["rollout"] for s in steps_),
        "update": statistics.median(s["update"] for s in steps_),
        "evaluation": statistics.median(record["evaluation"]) if record["evaluation"] else float("nan"),
        "wall": record["wall"],
        "held_out": record["held_out"],
    }


def table(this: str, against: str, runs: dict[str, list[dict]], command: str) -> str:
    a, b = runs["this"], runs["against"]
    lines = [
        f"`{command}`",
        "",
        f"| phase (s) | {this} | {against} | {against} / {this} (median of pairs) |",
        "|---|---|---|---|",
    ]
    for phase in (*PHASES, "wall"):
        ratios = [y[phase] / x[phase] for x, y in zip(a, b) if x[phase] > 0]
        lines.append(
            f"| {phase} | {statistics.median(r[phase] for r in a):.2f} | {statistics.median(r[phase] for r in b):.2f}"
            f" | {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |"
        )
    held = {name: sorted({line for r in rs for line in r["held_out"]}) for name, rs in runs.items()}
    lines += ["", "held-out lines printed (the job cut to its steps):"]
    for name, label in (("this", this), ("against", against)):
        lines += [f"- {label}: {line}" for line in held[name]] or [f"- {label}: none"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", help="the other commit (any git revision of this repository)")
    ap.add_argument("--this", default=None, help="a revision instead of this checkout's working tree")
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps a run (the first is not counted)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each side, alternated")
    ap.add_argument("--isa", choices=("native", "avx2"), default="native")
    ap.add_argument("--end-evaluation", action="store_true", help="also evaluate at the end (the held-out line)")
    ap.add_argument("--out", type=Path, help="also write the table here")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.steps, args.out, args.end_evaluation)
        return 0
    if not args.against:
        ap.error("--against REV is required")
    if args.steps < 1 or args.repeats < 1:
        ap.error("--steps and --repeats are at least 1")
    env = dict(os.environ, **(AVX2 if args.isa == "avx2" else {}))
    env.pop("PYTHONPATH", None)  # each run imports collab from its own tree
    with tempfile.TemporaryDirectory() as tmp:
        trees = {
            "this": extract(args.this, Path(tmp) / "this") if args.this else ROOT,
            "against": extract(args.against, Path(tmp) / "against"),
        }
        runs: dict[str, list[dict]] = {"this": [], "against": []}
        for i in range(args.repeats):
            for name in ("this", "against"):
                runs[name].append(run(trees[name], args.steps, env, args.end_evaluation))
                r = runs[name][-1]
                print(f"{name} {i + 1}: " + ", ".join(f"{p} {r[p]:.2f} s" for p in (*PHASES, "wall")), flush=True)
    command = " ".join(["quickstart_phases.py", *sys.argv[1:]])
    text = table(args.this or "this checkout", args.against, runs, command)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
