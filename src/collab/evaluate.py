"""``python -m collab.evaluate --algo NAME [--ckpt_path CKPT | --adapters DIR] [options] [config overrides]``.

Builds the team and environment exactly as ``collab.fit`` would, loads trained weights if given, and runs
:func:`collab.evaluation.heldout.evaluate` on a split; ``--baseline`` plays a CoLLM 5.2 baseline's protocol
(:mod:`collab.evaluation.baselines`) and ``--table`` upserts a Table 1 row (:mod:`collab.evaluation.comparison`).
Options, row names and examples: docs/evaluation.md. Time and cost are printed, not written to ``--output``,
which stays the evaluation's metrics (a wall time differs between two runs of the same weights).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from collab.errors import OneLineParser, UserError, require, unknown


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m collab.evaluate",
        usage="%(prog)s [--algo NAME] [--ckpt_path CKPT | --adapters DIR] [options] [fit's options]",
        description="Evaluate a team (trained or not) on an env's held-out split, built as python -m "
        "collab.fit builds it.",
        epilog="Every other option is collab.fit's, as for a run (--config "
        "FILE, --section.key value, e.g. --data.env coding): python -m collab.fit --help lists them.",
    )
    # --algo is read before this parser (collab.config.read_command_line): here for --help
    p.add_argument("--algo", metavar="NAME", help="the algorithm whose team and protocol are built (default magrpo)")
    p.add_argument("--ckpt_path", default=None, metavar="CKPT", help="a Lightning checkpoint written by collab.fit")
    p.add_argument(
        "--adapters",
        default=None,
        metavar="DIR",
        help="a folder of peft adapters, e.g. runs/magrpo/version_0/adapters/last",
    )
    p.add_argument("--num_samples", type=int, default=10, metavar="N", help="episodes per task (default 10)")
    p.add_argument(
        "--k", type=int, nargs="+", default=[1, 3, 5, 10], help="the k of pass@k and acc@k (default 1 3 5 10)"
    )
    p.add_argument("--split", default="eval", help="eval or train (default eval)")
    p.add_argument(
        "--max_tasks", type=int, default=None, metavar="N", help="the first N tasks of the split (default all)"
    )
    p.add_argument("--tasks_per_batch", type=int, default=4, metavar="N", help="tasks decoded together (default 4)")
    p.add_argument("--output", default=None, metavar="FILE", help="write the metrics as JSON")
    p.add_argument(
        "--baseline", default=None, help="play a prompt baseline's protocol: single, parallel, pipeline or discussion"
    )
    p.add_argument(
        "--table",
        default=None,
        metavar="PATH.csv",
        help="upsert the run's row into the csv and rewrite the markdown table PATH.md",
    )
    p.add_argument("--method", default=None, help="the row's name (default: the algo, the baseline or both)")
    p.add_argument("--task", default=None, help="the row's column group (default: the env's name)")
    return p


def method_name(algo: str, baseline: str | None, weights: str | None) -> str:
    """The comparison row of a run: the baseline, the algo, or both (a baseline with trained weights)."""
    if baseline:
        return f"{baseline}+{algo}" if weights else baseline
    return algo if weights else f"{algo} (untrained)"


def load_weights(model, ckpt_path: str) -> int:
    """Load the trainable tensors of a ``collab.fit`` checkpoint into the built ``model``; their count."""
    from collab.cli.checkpoint import (
        match_checkpoint,
        read_checkpoint,
    )  # missing, truncated, not collab's, another team

    checkpoint = read_checkpoint(ckpt_path)
    match_checkpoint(model, checkpoint, ckpt_path, complete=False)
    state = checkpoint["state_dict"]
    model.load_state_dict(state, strict=False)
    return len(state)


def team_model(team) -> str:
    """The base model(s) of a team, for the comparison table (``a+b`` for a heterogeneous team)."""
    return "+".join(dict.fromkeys(spec.base or team.base_config.name for spec in team.specs))


def check_options(options) -> None:
    """Each option in range and each named file there, before anything is built (one line each)."""
    from collab.evaluation.baselines import BASELINES

    require(options.num_samples >= 1, f"--num_samples must be >= 1, got {options.num_samples}")
    require(all(k >= 1 for k in options.k), f"--k values must be >= 1, got {options.k}")
    require(options.max_tasks is None or options.max_tasks >= 1, f"--max_tasks must be >= 1, got {options.max_tasks}")
    require(not (options.ckpt_path and options.adapters), "give --ckpt_path or --adapters, not both")
    require(
        any(k <= options.num_samples for k in options.k),
        f"no k of --k {options.k} is <= --num_samples {options.num_samples}; give --num_samples >= the smallest k",
    )
    require(options.tasks_per_batch >= 1, f"--tasks_per_batch must be >= 1, got {options.tasks_per_batch}")
    require(options.split in ("train", "eval"), f"unknown --split {options.split!r}; valid: eval, train")
    if options.ckpt_path:
        from collab.cli.checkpoint import read_checkpoint

        read_checkpoint(options.ckpt_path)  # the file now; its tensors against the team once built
    if options.adapters and not Path(options.adapters).is_dir():
        raise UserError(
            f"adapter folder not found: {options.adapters} (expected e.g. runs/magrpo/version_0/adapters/last)"
        )
    if options.baseline is not None and options.baseline not in BASELINES:
        raise unknown("baseline", options.baseline, BASELINES)
    require(
        options.table is None or options.table.endswith(".csv"),
        f"--table must name a .csv file (the markdown table is written next to it), got {options.table}",
    )
    require(options.method is None or bool(options.method.strip()), "--method must not be empty")


def built_team(algo: str, options, overrides: list[str]):
    """The module (its team with the given weights) and env that ``collab.fit`` would build."""
    from collab.fit import build_cli

    cli = build_cli(algo, overrides)
    model, env = cli.model, cli.datamodule.env
    model.build(env)
    if options.ckpt_path:
        load_weights(model, options.ckpt_path)
    elif options.adapters:
        model.team.load_adapters(options.adapters)
    return model, env


def run(argv: list[str]) -> dict[str, float]:
    import torch

    from collab.cli.output import release_logs
    from collab.config import read_command_line
    from collab.evaluation.baselines import Protocol, prepare
    from collab.evaluation.comparison import make_row

    line = read_command_line(argv)
    algo, rest = line.algo, line.args
    options, overrides = _parser().parse_known_args(rest)
    check_options(options)
    from collab.evaluation.heldout import evaluate  # after the checks: bad input fails fast

    model, env = built_team(algo, options, overrides)
    tasks = list(env.tasks(options.split))[: options.max_tasks]
    require(len(tasks) > 0, f"split {options.split!r} of env {env.name!r} has no tasks")
    weights = options.ckpt_path or options.adapters or "untrained"
    protocol = prepare(options.baseline, env) if options.baseline else Protocol(algo, env, model.protocol)
    method = options.method or method_name(algo, options.baseline, options.ckpt_path or options.adapters)
    model.eval()
    release_logs()  # Lightning's start-up messages, held until now (collab.cli.output)
    start = time.perf_counter()
    with torch.no_grad(), protocol.applied(model.team, model.max_new_tokens):
        metrics, episodes = evaluate(
            model.team,
            protocol.env,
            tasks,
            options.num_samples,
            options.k,
            model.max_new_tokens,
            model.team.device,
            options.tasks_per_batch,
            protocol.dependency,
        )
    seconds = time.perf_counter() - start
    task, model_name = options.task or env.name, team_model(model.team)
    row = make_row(method, task, env, metrics, seconds, episodes, model_name, options.split, weights)
    report(algo, options, env, len(tasks), weights, metrics, row, method)
    return metrics


def report(algo: str, options, env, tasks: int, weights: str, metrics: dict, row: dict, method: str) -> None:
    """The run's lines, and its row in ``--table`` and metrics in ``--output`` where given."""
    from collab.evaluation.comparison import score_columns, update_table
    from collab.evaluation.heldout import format_metrics

    label = f"{options.baseline} baseline ({algo} team)" if options.baseline else algo
    print(f"{label} on {env.name} ({options.split}: {tasks} tasks x {options.num_samples} samples; weights: {weights})")
    print(format_metrics(metrics))
    scores = "  ".join(f"{c.title} {row[c.key] or 'n/a'}" for c in score_columns(env.name))
    print(f"time {row['time_s'] or 'n/a'} s/episode  cost {row['cost_tokens'] or 'n/a'} tokens/agent/turn  {scores}")
    if options.table:
        _, md = update_table(options.table, row)
        print(f"table: row {method!r} / {row['task']!r} in {options.table} and {md}")
    if options.output:
        Path(options.output).parent.mkdir(parents=True, exist_ok=True)
        Path(options.output).write_text(json.dumps(metrics, indent=2))


def main(argv: list[str] | None = None) -> int:
    from collab.runtime.threads import choose_wait

    choose_wait()  # before torch's import, as collab.fit (collab.runtime.threads)
    from collab.fit import report_errors

    return report_errors(lambda: run(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
