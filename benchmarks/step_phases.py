"""Where a default job's step goes: seconds by phase for ``python -m collab.fit --algo X`` on the embedded model.

The job is composed as the command composes it (:func:`collab.fit.build_cli`, the algorithm's defaults and any
``-- ARGS`` overrides), then trained for ``--steps`` optimizer steps by a Lightning Trainer of this script's own
without the config's callbacks (no held-out evaluation, checkpoints or logs), its methods timed by
``paper_shapes.PhaseClock``: rollout (generation and scoring), log-prob forwards (old log-probs, references and
critic values, without gradients), loss forwards (each backward pass's forward), backward, optimizer (clipping and
AdamW), other (logging, freeing memory, the first update's micro-batch probe). Each phase is counted once, in the
innermost phase running. The table gives each step and the median of the steps after the first (which holds the
warm-up and the probe).

    PYTHONPATH=src .venv/bin/python benchmarks/step_phases.py --algo marft_a --steps 4      # the quick start's job
    PYTHONPATH=src .venv/bin/python benchmarks/step_phases.py --algo magrpo --steps 3 -- --data.batch_size 4

Alone on the machine: the figures are seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from paper_shapes import PHASES, PhaseClock, peak_rss, step_callback  # noqa: E402

GIB = 2**30


def run(algo: str, steps: int, extra: list[str]) -> tuple[list[dict], float]:
    import lightning as L

    from collab.fit import build_cli

    with tempfile.TemporaryDirectory() as tmp:
        cli = build_cli(algo, ["--trainer.default_root_dir", tmp, *extra])
        clock, records = PhaseClock(), []
        clock.wrap(cli.model)
        trainer = L.Trainer(
            max_steps=steps,
            max_epochs=-1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            devices=1,
            callbacks=[step_callback(clock, records)],
            default_root_dir=tmp,
        )
        trainer.fit(cli.model, cli.datamodule)
    return records, peak_rss() / GIB


def table(algo: str, records: list[dict], peak: float, command: str) -> str:
    head = ["step", "s", *PHASES]
    lines = [
        f"`{command}`: seconds by phase, peak RSS {peak:.2f} GiB",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for i, r in enumerate(records, 1):
        lines.append(f"| {i} | {r['seconds']:.1f} | " + " | ".join(f"{r['phases'][p]:.1f}" for p in PHASES) + " |")
    later = records[1:] or records
    median = {p: statistics.median(r["phases"][p] for r in later) for p in PHASES}
    seconds = statistics.median(r["seconds"] for r in later)
    lines.append(
        f"| median of {len(later)} | {seconds:.1f} | "
        + " | ".join(f"{median[p]:.1f} ({median[p] / seconds:.0%})" for p in PHASES)
        + " |"
    )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algo", default="marft_a")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", type=Path)
    ap.add_argument("extra", nargs="*", help="collab.fit overrides, after --")
    args = ap.parse_args()
    start = time.perf_counter()
    records, peak = run(args.algo, args.steps, args.extra)
    command = " ".join(["step_phases.py", "--algo", args.algo, "--steps", str(args.steps), *args.extra])
    text = table(args.algo, records, peak, command) + f"\nwall {time.perf_counter() - start:.0f} s\n"
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
