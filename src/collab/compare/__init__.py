"""``python -m collab.compare --algos A [B ...] --rollouts N | --tokens N [options] [config overrides]``.

A grid of algorithms x envs x seeds trained at one budget, with the controls on the same eval split (the
single-agent ``grpo`` and the untrained prompt baselines), or with ``--defaults`` each algorithm's main job as
it is; each run is one subprocess (:mod:`collab.compare.grid`, :mod:`collab.compare.running`). The options, the
outputs under ``--output``, resuming and the exit codes: docs/evaluation.md (``python -m collab.compare``).

    python -m collab.compare --algos magrpo ippo --envs writing --seeds 0 1 2 --rollouts 10
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from collab.compare import checks, grid
from collab.compare.grid import BASELINES, CONTROL, Cell, Settings
from collab.compare.options import parser
from collab.compare.progress import Progress, clock_time
from collab.compare.running import Running, read_record, run_cell
from collab.errors import UserError
from collab.runtime.threads import SPIN_COUNT, WAIT_VARIABLES, usable_cores


def run(argv: list[str]) -> int:
    options, overrides = parser().parse_known_args(argv)
    settings, cells = plan_runs(options, overrides)
    out = Path(options.output)
    with tempfile.TemporaryDirectory() as tmp:  # every run built (not run) before the first starts
        extra = checks.check_cells(cells, settings, Path(tmp))
    from collab.cli.output import release_logs

    release_logs(show=False)  # the builds' Lightning messages: not this command's
    progress = open_output(options, cells, settings, out)
    records = {c: read_record(out, c) for c in cells}
    for record in records.values():
        if record:
            progress.add(record)
    todo = [c for c in cells if records[c] is None or (options.retry_failed and records[c]["returncode"] != 0)]
    progress.line(
        f"grid: {len(cells)} runs ({len(cells) - len(todo)} done before), budget {settings.budget()}, output {out}"
    )
    queue = runs_to_start(cells, records, todo, options.max_runs, progress)
    run_queue(queue, cells, records, todo, settings, out, extra, options.jobs, progress)
    if len(todo) > 0 and options.max_runs is not None:
        progress.line(f"stopped after {len(queue)} runs (--max_runs); {len(todo)} left: start again to finish")
    write_outputs(out, [r for r in (records[c] for c in cells) if r], settings)
    failed = [c.name for c in cells if records[c] and records[c]["returncode"] != 0]
    return 1 if failed else 0


GRID_OPTIONS = ("envs", "rollouts", "tokens", "controls", "eval_samples", "eval_tasks", "tasks_per_batch", "score")
"""The options of a grid at one budget, which ``--defaults`` (each main job as it is) refuses."""


def plan_runs(options, overrides: list[str]) -> tuple[Settings, list[Cell]]:
    """The settings and runs of the grid (or of ``--defaults``), every name and option checked."""
    if options.defaults:
        given = [f"--{name}" for name in GRID_OPTIONS if getattr(options, name) is not None]
        if given:
            raise UserError(
                f"--defaults runs each main job as it is (its own env, budget and held-out evaluation): "
                f"drop {', '.join(given)}, or drop --defaults for a grid at one budget"
            )
        settings = Settings(None, None, overrides=tuple(overrides), defaults=True)
        checks.check_defaults(options.algos, options.seeds, settings)
        cells = grid.plan_defaults(options.algos, options.seeds, settings)
    else:
        settings = Settings(
            options.rollouts,
            options.tokens,
            2 if options.eval_samples is None else options.eval_samples,
            options.eval_tasks,
            4 if options.tasks_per_batch is None else options.tasks_per_batch,
            tuple(overrides),
            options.score,
        )
        controls = [CONTROL, *BASELINES] if options.controls is None else options.controls
        envs = ["writing"] if options.envs is None else options.envs
        checks.check_names(options.algos, controls, envs, options.seeds, settings)
        cells = grid.plan(options.algos, controls, envs, options.seeds)
    if options.max_runs is not None and options.max_runs < 0:
        raise UserError(f"--max_runs must be >= 0, got {options.max_runs}")
    if options.jobs < 1:
        raise UserError(f"--jobs must be >= 1 (runs at once), got {options.jobs}")
    return settings, cells


def open_output(options, cells: list[Cell], settings: Settings, out: Path) -> Progress:
    """The output folder checked against an earlier start's settings (and ``--restore``'s runs carried into it,
    read and checked before anything is written), and the progress lines of this start."""
    if options.restore is not None:
        from collab.compare import restore

        carried = restore.restored(options.restore, cells, settings, out)
    checks.check_settings(out, settings)
    progress = Progress(out / "compare.log", jobs=options.jobs)
    if options.restore is not None:
        restore.write(carried, out)
        progress.line(
            f"restored {len(carried)} runs from {options.restore[0]}"
            + (f" (their steps from {options.restore[1]})" if len(options.restore) == 2 else " (no steps)")
        )
    return progress


def runs_to_start(
    cells: list[Cell], records: dict, todo: list[Cell], max_runs: int | None, progress: Progress
) -> list[tuple[int, Cell]]:
    """(i, cell) of the runs to start now, in grid order (at most ``max_runs``); a line for each run done before."""
    queue = []
    for i, cell in enumerate(cells, 1):
        if cell not in todo:
            code = records[cell]["returncode"]
            progress.line(
                f"run {i} of {len(cells)}: {cell.name} "
                + ("done before" if code == 0 else f"failed before (exit {code}; --retry_failed runs it again)")
            )
        elif max_runs is None or len(queue) < max_runs:
            queue.append((i, cell))
    return queue


def run_queue(
    queue: list[tuple[int, Cell]],
    cells: list[Cell],
    records: dict,
    todo: list[Cell],
    settings: Settings,
    out: Path,
    extra: dict,
    jobs: int,
    progress: Progress,
) -> None:
    """Run the queued cells, ``jobs`` at once, each record into ``records`` and its line into ``progress``; a cell
    run leaves ``todo``."""
    running = Running(jobs)
    environment = job_environment(jobs)
    lock = threading.Lock()

    def one(i: int, cell: Cell) -> None:
        with lock:
            todo.remove(cell)
            progress.line(f"run {i} of {len(cells)}: {cell.name} ({progress.left([cell, *todo])})")
        record = _run_with_clock(
            progress, i, len(cells), cell, settings, out, extra[(cell.method, cell.env)], todo, running, environment
        )
        with lock:
            records[cell] = record
            progress.add(record)
            how = (
                "done"
                if record["returncode"] == 0
                else f"FAILED (exit {record['returncode']}, log {grid.cell_dir(out, cell) / 'log.txt'})"
            )
            progress.line(
                f"run {i} of {len(cells)}: {cell.name} {how} in {clock_time(record['wall_s'])}, "
                f"held-out {_score(record)}; {progress.left(todo)}"
            )

    with ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(one, i, cell) for i, cell in queue]
        try:
            for future in futures:
                future.result()
        except BaseException:  # Ctrl-C or SIGTERM: end every running cell, start no other, leave no record
            running.stop()
            for future in futures:
                future.cancel()
            raise


def _score(record: dict) -> str:
    score = record.get("score")
    return "n/a" if score is None else f"{score:.4f}"


def _run_with_clock(
    progress: Progress,
    i: int,
    n: int,
    cell: Cell,
    settings: Settings,
    out: Path,
    extra,
    todo,
    running: Running,
    environment: dict[str, str],
) -> dict:
    """Run the cell; on a terminal, one run at a time, redraw its line every second with the elapsed and the time
    left."""
    stop = threading.Event()
    start = time.perf_counter()

    def tick() -> None:
        while not stop.wait(1.0):
            elapsed = time.perf_counter() - start
            progress.line(
                f"run {i} of {n}: {cell.name} {clock_time(elapsed)} ({progress.left([cell, *todo])})", transient=True
            )

    clock = threading.Thread(target=tick, daemon=True)
    if progress.tty and running.jobs == 1:
        clock.start()
    try:
        return asdict(run_cell(cell, settings, out, extra, running, environment))
    finally:
        stop.set()


def write_outputs(out: Path, records: list[dict], settings: Settings) -> None:
    """results.csv, steps.csv, comparison.md and curves.png from the records so far."""
    from collab.compare import report

    rows = report.result_rows(records)
    report.write_csv(out / "results.csv", rows, report.RESULT_COLUMNS)
    steps = []
    for record in records:
        if record.get("run_dir") and Path(record["run_dir"]).is_dir():
            from collab.evaluation.analysis import read_scalars

            steps += report.step_rows(record, read_scalars(record["run_dir"]))
        else:  # restored from another machine's CSVs (--restore), or its folder removed
            steps += record.get("step_rows") or []
    report.write_csv(out / "steps.csv", steps, report.STEP_COLUMNS)
    failed = [f"{r['method']}-{r['env']}-{r['seed']} (exit {r['returncode']})" for r in records if r["returncode"] != 0]
    if settings.defaults:
        markdown = report.render_seed_tables(rows, failed)
    else:
        tasks = f"the first {settings.eval_tasks}" if settings.eval_tasks else "all"
        scored = (
            f"score: {settings.score} (--score)"
            if settings.score
            else "score: accuracy (solved) where the env reports it, else the episode return"
        )
        evaluation = (
            f"{tasks} tasks of each env's eval split x {settings.eval_samples} sampled episodes, seed k for seed k; "
            f"{scored}"
        )
        markdown = report.render_grid_markdown(report.summarize(rows), settings.budget(), evaluation, CONTROL, failed)
    shared = sorted({int(r.get("jobs", 1)) for r in records} - {1})
    if shared:
        markdown += (
            f"\nWall times: runs made {' or '.join(map(str, shared))} at once (--jobs) shared the machine's "
            f"cores; compare them with runs made the same way.\n"
        )
    (out / "comparison.md").write_text(markdown)
    figure = None
    if steps:
        import matplotlib

        matplotlib.use("Agg")
        figure = report.grid_figure(steps)
    if figure is not None:
        figure.savefig(out / "curves.png", dpi=120, bbox_inches="tight")
    print(
        markdown
        + f"\nwritten: {out / 'results.csv'}, {out / 'steps.csv'}, {out / 'comparison.md'}"
        + (f", {out / 'curves.png'}" if figure is not None else ""),
        flush=True,
    )


def job_environment(jobs: int) -> dict[str, str]:
    """What each run's environment gets with ``jobs`` at once: ``OMP_NUM_THREADS``, the cores this process may use
    over ``jobs``, and the brief spin of runs that share the cores (``GOMP_SPINCOUNT``: collab.runtime.threads; a
    run's own look at the load could start before the others are busy); nothing for one job, and the user's own
    settings stand."""
    if jobs == 1:
        return {}
    env = {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": str(max(1, usable_cores()[0] // jobs))}
    if not any(name in os.environ for name in WAIT_VARIABLES):
        env["GOMP_SPINCOUNT"] = SPIN_COUNT
    return env


def main(argv: list[str] | None = None) -> int:
    from collab.fit import report_errors

    code = [0]

    def job() -> None:
        code[0] = run(list(sys.argv[1:] if argv is None else argv))

    def stop(signum, frame):  # SIGTERM: end the current run's subprocess (run_cell), leave no record
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return report_errors(job) or code[0]
    except KeyboardInterrupt:
        print(
            "stopped: the run in progress was ended and left no record; start the same command again to finish "
            "the grid",
            file=sys.stderr,
            flush=True,
        )
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
