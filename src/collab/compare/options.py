"""The command line of ``python -m collab.compare``: its options and their help. The options are read and the
grid is run by :mod:`collab.compare`; what is not an option here goes to every run's ``collab.fit``."""

from __future__ import annotations

import argparse

from collab.errors import OneLineParser


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m collab.compare",
        hint="python -m collab.compare --help: docs/evaluation.md",
        usage="%(prog)s --algos A [B ...] (--rollouts N | --tokens N) [options] [fit's options]\n"
        "       %(prog)s --defaults --algos A [B ...] [--seeds K ...] [options] [fit's options]",
        description="A grid of algorithms x envs x seeds trained at one budget, with the single-agent "
        "control and the prompt baselines evaluated on the same held-out tasks (docs/evaluation.md).",
        epilog="Every other option goes to each run's python -m collab.fit (--config FILE, "
        "--section.key value, e.g. --model.base.name tiny): python -m collab.fit --help lists them.",
    )
    p.add_argument("--algos", nargs="+", default=[], metavar="A", help="the algorithms to train (magrpo, ippo, ...)")
    p.add_argument(
        "--defaults",
        action="store_true",
        help="run each algorithm's main job as it is (its own env, budget and evaluation) on --seeds",
    )
    # None: not given (the defaults below are filled in by run(); --defaults refuses them given)
    p.add_argument("--envs", nargs="+", default=None, metavar="ENV", help="the envs (default writing)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], metavar="K", help="the seeds (default 0 1 2)")
    p.add_argument("--rollouts", type=int, default=None, metavar="N", help="the budget: N rollouts per training run")
    p.add_argument(
        "--tokens", type=int, default=None, metavar="N", help="the budget: N generated tokens per training run"
    )
    p.add_argument(
        "--controls",
        nargs="*",
        default=None,
        metavar="C",  # all five
        help="grpo (the single-agent control), single, parallel, pipeline, discussion (default all; "
        "--controls alone: none)",
    )
    p.add_argument(
        "--eval_samples",
        type=int,
        default=None,
        metavar="N",  # 2
        help="sampled episodes per held-out task (default 2)",
    )
    p.add_argument("--eval_tasks", type=int, default=None, metavar="N", help="the first N held-out tasks (default all)")
    p.add_argument(
        "--tasks_per_batch",
        type=int,
        default=None,
        metavar="N",  # 4
        help="held-out tasks decoded together (default 4)",
    )
    p.add_argument("--output", default="runs/compare", metavar="DIR", help="the grid's folder (default runs/compare)")
    p.add_argument(
        "--max_runs",
        type=int,
        default=None,
        metavar="N",
        help="run at most N more runs now, then write the outputs and stop",
    )
    p.add_argument("--retry_failed", action="store_true", help="run the failed runs again")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="runs at once (default 1)")
    p.add_argument(
        "--score",
        default=None,
        metavar="KEY",
        help="the held-out score: an info key of the env's last step (default: accuracy, else the return)",
    )
    p.add_argument(
        "--restore",
        nargs="+",
        default=None,
        metavar="CSV",  # RESULTS [STEPS]
        help="RESULTS [STEPS]: an earlier start's results.csv (and steps.csv), its finished runs carried",
    )
    return p
