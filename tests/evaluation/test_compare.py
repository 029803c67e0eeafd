"""``python -m collab.compare``: a tiny grid end to end (outputs, resume, budget, the control's one agent, the
comparison notebook on its output), a bad grid refused in one line before anything runs, and the summary's
statistics by hand.

The grid (``tiny_grid``, a module fixture) is MAGRPO, the grpo control and the parallel baseline on writing with
seeds 0 and 1 at 2 rollouts: six subprocesses of the tiny model.
"""

import csv
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.notebook_kernel import execute, png_size


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


SMALL = """
trainer: {accelerator: cpu}
model:
  base: {name: tiny}
  agents:
    - sampling: {temperature: 0.7, top_p: 0.9, top_k: 0, max_new_tokens: 8}
    - sampling: {temperature: 0.7, top_p: 0.9, top_k: 0, max_new_tokens: 8}
  num_generations: 2
data: {batch_size: 1}
"""
GRID = [
    "--algos",
    "magrpo",
    "--envs",
    "writing",
    "--seeds",
    "0",
    "1",
    "--rollouts",
    "2",
    "--controls",
    "grpo",
    "parallel",
    "--eval_tasks",
    "2",
    "--eval_samples",
    "2",
]
"""MAGRPO, the grpo control and the parallel baseline on writing, seeds 0 and 1: 6 runs of the tiny model."""


def _mtimes(out) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted((out / "records").glob("*.json"))}


@pytest.fixture(scope="module")
def tiny_grid(tmp_path_factory):
    """The grid run three times: stopped after its first run (``--max_runs 1``, as if killed), with a stale
    folder of a run killed midway added; started again (the other five runs, two at a time: ``--jobs 2``); and once
    more (nothing to do).
    ``out`` is its output folder; ``codes`` the three exit codes; ``mtimes`` the records' after each start;
    ``logs`` the log's lines after each start."""
    from collab.compare import main

    work = tmp_path_factory.mktemp("grid")
    (work / "small.yaml").write_text(SMALL)
    out = work / "compare"
    args = GRID + ["--output", str(out), "--config", str(work / "small.yaml")]
    codes, mtimes, logs = [], [], []
    for i, extra in enumerate((["--max_runs", "1"], ["--jobs", "2"], [])):
        if i == 1:  # a run killed midway leaves its folder without a record: it restarts from scratch
            stale = out / "cells" / "magrpo-writing-0" / "stale.txt"
            stale.parent.mkdir(parents=True)
            stale.write_text("killed midway")
        codes.append(main(args + extra))
        mtimes.append(_mtimes(out))
        logs.append((out / "compare.log").read_text().splitlines())
    return SimpleNamespace(out=out, codes=codes, mtimes=mtimes, logs=logs)


# The tiny grid.


def test_grid_resumes_and_redoes_nothing(tiny_grid):
    first, second, third = tiny_grid.mtimes
    assert tiny_grid.codes == [0, 0, 0]
    assert list(first) == ["grpo-writing-0.json"]  # --max_runs 1: one run, then the outputs
    assert any("stopped after 1 runs (--max_runs); 5 left" in line for line in tiny_grid.logs[0])
    assert len(second) == 6 and second["grpo-writing-0.json"] == first["grpo-writing-0.json"]  # not redone
    assert third == second  # the third start ran nothing
    started = tiny_grid.logs[1][len(tiny_grid.logs[0]) :]
    assert any(line.endswith("run 1 of 6: grpo-writing-0 done before") for line in started)
    assert sum(" done in " in line for line in started) == 5
    last = tiny_grid.logs[2][len(tiny_grid.logs[1]) :]
    assert sum(line.endswith(" done before") for line in last) == 6 and not any(" done in " in line for line in last)
    assert not (tiny_grid.out / "cells" / "magrpo-writing-0" / "stale.txt").exists()  # restarted from scratch
    jobs = {r["seed"] + r["method"]: r["jobs"] for r in _rows(tiny_grid.out / "results.csv")}
    assert jobs.pop("0grpo") == "1" and set(jobs.values()) == {"2"}  # the second start ran two at a time
    assert "runs made 2 at once (--jobs) shared the machine's cores" in (tiny_grid.out / "comparison.md").read_text()


def test_a_stopped_grid_ends_its_runs_and_records_nothing(tmp_path):
    """Ctrl-C or SIGTERM of the grid (``Running.stop``): every running cell's process is ended, and a cell that
    starts afterwards (``--jobs``: queued) raises before running, leaving no record."""
    import subprocess
    import sys

    from collab.compare import grid
    from collab.compare import running as runs

    running = runs.Running(jobs=2)
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    for proc in procs:
        running.start(proc)
    running.stop()
    assert [proc.wait(timeout=30) for proc in procs] == [-15, -15]
    cell = grid.Cell("grpo", "writing", 0)
    with pytest.raises(KeyboardInterrupt):
        runs.run_cell(cell, grid.Settings(rollouts=1, tokens=None), tmp_path, [], running)
    assert not grid.record_path(tmp_path, cell).exists() and not grid.cell_dir(tmp_path, cell).exists()


def test_grid_results(tiny_grid):
    rows = _rows(tiny_grid.out / "results.csv")
    assert [(r["method"], r["kind"], r["seed"]) for r in rows] == [
        (m, k, s) for s in "01" for m, k in (("grpo", "control"), ("magrpo", "algorithm"), ("parallel", "baseline"))
    ]
    for r in rows:
        assert r["returncode"] == "0" and r["env"] == "writing"
        assert (r["eval_problems"], r["eval_samples"]) == ("2", "2")  # the same eval split for every method
        assert float(r["peak_rss_bytes"]) > 100 * 2**20 and float(r["wall_s"]) > 0
        assert math.isfinite(float(r["score"]))
        if r["kind"] == "baseline":
            assert r["rollouts"] == r["tokens"] == r["run_dir"] == ""
        else:  # the budget: 2 rollouts of 1 task, K = 2, 8 tokens per agent (the control: one agent, 16)
            assert r["rollouts"] == r["steps"] == "2" and 0 < int(r["tokens"]) <= 2 * 2 * 16
    steps = _rows(tiny_grid.out / "steps.csv")
    assert {(r["method"], r["seed"]) for r in steps} == {("grpo", "0"), ("grpo", "1"), ("magrpo", "0"), ("magrpo", "1")}
    for r in rows[:2] + rows[3:5]:
        mine = [s for s in steps if (s["method"], s["seed"]) == (r["method"], r["seed"])]
        assert sorted(s["rollout"] for s in mine if s["tag"] == "reward/return") == ["1", "2"]  # stopped by the budget
        evals = {s["rollout"]: float(s["value"]) for s in mine if s["tag"] == "eval/score"}
        assert set(evals) == {"0", "2"}  # before and after training
        assert evals["2"] == pytest.approx(float(r["score"]), rel=1e-6, abs=1e-9)
        assert evals["0"] == pytest.approx(float(r["before"]), rel=1e-6, abs=1e-9)
        agents = {s["tag"] for s in mine if s["tag"].startswith("reward/turn0/agent")}
        assert agents == (
            {"reward/turn0/agent0"} if r["method"] == "grpo" else {"reward/turn0/agent0", "reward/turn0/agent1"}
        )


def test_grid_table_and_curves(tiny_grid):
    rows = _rows(tiny_grid.out / "results.csv")
    score = {(r["method"], r["seed"]): float(r["score"]) for r in rows}
    text = (tiny_grid.out / "comparison.md").read_text()
    assert text.startswith("Budget: 2 rollouts per training run")
    lines = {line.split(" | ")[0].removeprefix("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert {"grpo (control)", "magrpo", "parallel"} <= set(lines)
    number = r"([-+]?\d+\.\d+)"
    for method in ("magrpo", "parallel"):  # the paired difference, by hand (printed to 4 decimals)
        diffs = [score[(method, s)] - score[("grpo", s)] for s in "01"]
        mean = sum(diffs) / 2
        half = 12.706 * abs(diffs[0] - diffs[1]) / 2  # t(0.975, 1) x sample std / sqrt(2)
        found = re.search(rf"\| {number} \[{number}, {number}\] \|", lines[method])
        assert [float(x) for x in found.groups()] == pytest.approx([mean, mean - half, mean + half], abs=6e-5)
    found = re.search(rf"\| {number} ± {number} \(n=2\) \|", lines["magrpo"])
    spread = abs(score[("magrpo", "0")] - score[("magrpo", "1")]) / 2  # SE of two values
    assert [float(x) for x in found.groups()] == pytest.approx(
        [(score[("magrpo", "0")] + score[("magrpo", "1")]) / 2, spread], abs=6e-5
    )
    width, height = png_size(tiny_grid.out / "curves.png")
    assert width > 300 and height > 200


# A bad grid: one line, exit code 2, nothing run.


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algos", "nosuch", "--rollouts", "1"], "unknown algo 'nosuch'; valid: at_grpo, collm_cc"),
        (
            ["--algos", "maporl", "--envs", "writing", "--rollouts", "1"],
            "--algo maporl does not train on env 'writing'; it supports: debate",
        ),
        (
            ["--algos", "magrpo", "--envs", "nowhere", "--rollouts", "1"],
            "unknown env 'nowhere'; valid: classeval, coding",
        ),
        (
            ["--algos", "magrpo", "--controls", "solo", "--rollouts", "1"],
            "unknown control 'solo'; valid: discussion, grpo",
        ),
        (["--algos", "grpo", "--rollouts", "1"], "grpo is a control, not an algorithm: give it in --controls"),
        (["--algos", "magrpo"], "give the budget: --rollouts N or --tokens N"),
        (
            ["--algos", "magrpo", "--rollouts", "1", "--tokens", "5"],
            "give the budget: --rollouts N or --tokens N, not both (got --rollouts 1 and --tokens 5)",
        ),
        (["--algos", "magrpo", "--rollouts", "0"], "--rollouts must be >= 1 (rollouts per training run), got 0"),
        (["--algos", "magrpo", "--tokens", "0"], "--tokens must be >= 1 (generated tokens per training run), got 0"),
        (["--algos", "magrpo", "--rollouts", "1", "--eval_samples", "0"], "--eval_samples must be >= 1, got 0"),
        (["--algos", "magrpo", "--rollouts", "1", "--eval_tasks", "0"], "--eval_tasks must be >= 1, got 0"),
        (["--algos", "magrpo", "--rollouts", "1", "--tasks_per_batch", "0"], "--tasks_per_batch must be >= 1, got 0"),
        (["--algos", "magrpo", "--rollouts", "1", "--max_runs", "-1"], "--max_runs must be >= 0, got -1"),
        (["--algos", "magrpo", "--rollouts", "1", "--seeds", "0", "0"], "--seeds must be distinct"),
        (["--algos", "magrpo", "--rollouts", "1", "--jobs", "0"], "--jobs must be >= 1 (runs at once), got 0"),
        (
            ["--algos", "magrpo", "--rollouts", "1", "--seed_everything", "3"],
            "--seed_everything is set by collab.compare",
        ),
        (["--algos", "magrpo", "--rollouts", "1", "--model.base.name", "tiny", "--model.nosuch", "1"], "nosuch"),
        (
            ["--algos", "magrpo", "--envs", "debate", "--rollouts", "1", "--score", "majority@9"],
            "--score 'majority@9' is not reported by env 'debate'; it reports: accuracy, agent_accuracy, answered, "
            "majority@1, majority@2, return",
        ),
    ],
)
def test_bad_grid_is_one_line(tmp_path, capsys, args, message):
    from collab.compare import main

    out = tmp_path / "out"
    assert main(args + ["--output", str(out), "--controls", "grpo"] * ("--controls" not in args)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not out.exists()  # refused before anything ran or was written


def test_changed_settings_are_refused(tiny_grid, capsys):
    from collab.compare import main

    assert (
        main(
            [
                "--algos",
                "magrpo",
                "--rollouts",
                "3",
                "--controls",
                "grpo",
                "--output",
                str(tiny_grid.out),
                "--model.base.name",
                "tiny",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a grid with other settings" in err[0]


# Carried to another machine: --restore RESULTS [STEPS].


def _restore_args(tiny_grid, out, *extra, grid=GRID):
    return grid + [
        "--output",
        str(out),
        "--config",
        str(tiny_grid.out.parent / "small.yaml"),
        "--max_runs",
        "0",
        *extra,
    ]


def _write_rows(path, rows):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_a_restored_grid_is_the_grid_that_ran(tiny_grid, tmp_path):
    """The grid's results.csv and steps.csv, as on another machine (its run folders absent), restored into an
    empty folder: all six runs restored, none run, and the same results, steps.csv, table and curves; started again
    without --restore it still runs nothing; a seed more extends it (that seed's runs left to run); without the
    steps the restored runs have no curves."""
    from collab.compare import main

    rows = _rows(tiny_grid.out / "results.csv")
    results, steps = tmp_path / "results.csv", str(tiny_grid.out / "steps.csv")
    _write_rows(results, [{**r, "run_dir": r["run_dir"] and "elsewhere/" + r["run_dir"]} for r in rows])
    out = tmp_path / "moved"
    assert main(_restore_args(tiny_grid, out, "--restore", str(results), steps)) == 0
    assert len(_mtimes(out)) == 6 and not (out / "cells").exists()  # restored, nothing run
    assert (out / "results.csv").read_text() == results.read_text()
    for name in ("steps.csv", "comparison.md"):
        assert (out / name).read_text() == (tiny_grid.out / name).read_text(), name
    assert png_size(out / "curves.png") == png_size(tiny_grid.out / "curves.png")
    log = (out / "compare.log").read_text()
    assert f"restored 6 runs from {results} (their steps from {steps})" in log and "6 done before" in log
    assert main(_restore_args(tiny_grid, out)) == 0 and (out / "steps.csv").read_text() == Path(steps).read_text()

    wider = tmp_path / "wider"
    seeds = GRID.index("--seeds")
    three = GRID[: seeds + 1] + ["0", "1", "2"] + GRID[seeds + 3 :]
    assert main(_restore_args(tiny_grid, wider, "--restore", str(results), grid=three)) == 0
    log = (wider / "compare.log").read_text()
    assert "restored 6 runs" in log and "(no steps)" in log and "stopped after 0 runs (--max_runs); 3 left" in log
    assert _rows(wider / "steps.csv") == [] and not (wider / "curves.png").exists()


def test_restore_refuses_another_grids_runs_in_one_line(tiny_grid, tmp_path, capsys):
    """A row of this grid's cells made at another evaluation stops the command before anything is written; a
    failed row is not restored (the run runs again); a bad path or count of paths is one line too."""
    from collab.compare import main

    rows = _rows(tiny_grid.out / "results.csv")
    edited = tmp_path / "edited.csv"
    binary = tiny_grid.out / "curves.png"
    _write_rows(
        edited, [{**r, "eval_samples": "1"} if r["method"] == "parallel" and r["seed"] == "1" else r for r in rows]
    )
    cases = [
        (["--restore", str(edited)], "holds parallel-writing-1 at eval_samples 1, this grid's 2"),
        (["--restore", str(tmp_path / "none.csv")], "none.csv is not a file"),
        (["--restore", str(binary)], "curves.png is not a CSV file"),
        (["--restore"] + [str(edited)] * 3, "got 3 paths"),
        (["--restore", str(edited), str(edited)], "has no column step, rollout, tag, value"),
    ]
    for extra, message in cases:
        out = tmp_path / "out"
        assert main(_restore_args(tiny_grid, out, *extra)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: --restore") and message in err[0], err
        assert not out.exists()

    _write_rows(edited, [{**r, "returncode": "1"} if r["method"] == "magrpo" and r["seed"] == "0" else r for r in rows])
    out = tmp_path / "out"
    assert main(_restore_args(tiny_grid, out, "--restore", str(edited))) == 0
    assert "restored 5 runs" in (out / "compare.log").read_text() and "magrpo-writing-0.json" not in _mtimes(out)
    capsys.readouterr()


# The statistics and the budget, by hand.


def test_summary_pairs_seeds_against_the_control():
    from collab.compare.report import render_grid_markdown, summarize

    def row(method, seed, score, code=0, **more):
        return {
            "method": method,
            "kind": "",
            "env": "writing",
            "seed": seed,
            "returncode": code,
            "score": score,
            "wall_s": 10.0,
            "tokens": 100,
            "peak_rss_bytes": 2**30 * (1 + seed),
            **more,
        }

    rows = [
        row("grpo", 0, 0.5),
        row("grpo", 1, 0.6),
        row("grpo", 2, 0.7),
        row("magrpo", 0, 0.6),
        row("magrpo", 1, 0.9),
        row("magrpo", 2, 0.8),
        row("magrpo", 3, 0.0),  # seed 3: unpaired
        row("ippo", 0, None, code=1),
        row("ippo", 1, 0.4),
    ]
    by = {e["method"]: e for e in summarize(rows)}
    m = by["magrpo"]
    assert m["n"] == 4 and m["pairs"] == 3 and m["failed"] == 0
    diffs = [0.1, 0.3, 0.1]
    sd = math.sqrt(sum((d - sum(diffs) / 3) ** 2 for d in diffs) / 2)
    assert m["diff"] == pytest.approx(sum(diffs) / 3)
    assert m["diff_high"] - m["diff"] == pytest.approx(4.303 * sd / math.sqrt(3))  # t(0.975, 2)
    assert m["score"] == pytest.approx(2.3 / 4) and m["peak_rss_bytes"] == 4 * 2**30
    i = by["ippo"]
    assert (i["n"], i["failed"], i["pairs"], i["diff"], i["diff_low"]) == (1, 1, 1, pytest.approx(-0.2), None)
    assert by["grpo"]["diff"] is None and [e["method"] for e in summarize(rows)] == ["grpo", "magrpo", "ippo"]
    text = render_grid_markdown(summarize(rows), "3 rollouts", "2 tasks", failed=["ippo-writing-0 (exit 1)"])
    assert "| ippo | 0.4000 (n=1) | -0.2000 (1 seed) | 10 s | 100 | 2.00 GiB |" in text
    assert text.startswith("Budget: 3 rollouts per training run") and "Failed runs (left out): ippo-writing-0" in text


def test_budget_stops_at_rollouts_or_tokens():
    import torch

    from collab.compare.grid import StopAtBudget
    from collab.errors import UserError

    trainer = SimpleNamespace(callback_metrics={"rollout/tokens": torch.tensor(30.0)}, world_size=2, should_stop=False)
    tokens = StopAtBudget(tokens=100)
    for expected in (False, True):  # 60 then 120 tokens (30 per process, 2 processes)
        tokens.on_train_batch_end(trainer, None, None, None, 0)
        assert trainer.should_stop is expected
    trainer.should_stop = False
    rollouts = StopAtBudget(rollouts=3)
    for expected in (False, False, True):
        rollouts.on_train_batch_end(trainer, None, None, None, 0)
        assert trainer.should_stop is expected
    with pytest.raises(UserError):
        StopAtBudget(rollouts=1, tokens=1)


def test_plan_orders_and_dedupes():
    from collab.compare.grid import Cell, plan

    cells = plan(["magrpo", "ippo", "magrpo"], ["single", "grpo"], ["writing", "writing"], [0, 1])
    assert [c.name for c in cells[:4]] == ["grpo-writing-0", "magrpo-writing-0", "ippo-writing-0", "single-writing-0"]
    assert len(cells) == 8 and cells[4] == Cell("grpo", "writing", 1)
    assert [c.kind for c in cells[:4]] == ["control", "algorithm", "algorithm", "baseline"]


def test_one_agent_control_takes_the_summed_length():
    from collab.compare.grid import one_agent

    agents = [
        {"role": "a", "lora": {"r": 4}, "sampling": {"temperature": 0.7, "max_new_tokens": 8}},
        {"role": "b", "lora": {"r": 8}, "sampling": {"temperature": 0.9, "max_new_tokens": 24}},
    ]
    option, value = one_agent(agents)
    import json

    assert option == "--model.agents"
    assert json.loads(value) == [{"lora": {"r": 4}, "sampling": {"temperature": 0.7, "max_new_tokens": 32}}]
    agents[1]["sampling"]["max_new_tokens"] = None
    assert json.loads(one_agent(agents)[1])[0]["sampling"]["max_new_tokens"] is None
    assert one_agent(None) == []


def test_progress_lines(tmp_path):
    """On a terminal the running line is redrawn in place and kept out of the log; otherwise plain lines only."""
    import io

    from collab.compare.grid import Cell
    from collab.compare.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream in (Terminal(), io.StringIO()):
        log = tmp_path / f"{type(stream).__name__}.log"
        progress = Progress(log, stream)
        assert progress.left([Cell("magrpo", "writing", 0)]) == "time left unknown"
        progress.add({"kind": "algorithm", "wall_s": 90.0})
        progress.add({"kind": "baseline", "wall_s": 10.0})
        cells = [Cell("magrpo", "writing", 1), Cell("grpo", "writing", 1), Cell("single", "writing", 1)]
        assert progress.left(cells) == "about 3:10 left"  # two trained runs of 90 s, a baseline of 10 s
        progress.line("run 2 of 4: magrpo-writing-1 0:05 (about 3:10 left)", transient=True)
        progress.line("run 2 of 4: magrpo-writing-1 done in 1:30")
        assert log.read_text().count("\n") == 1 and log.read_text().endswith(
            "run 2 of 4: magrpo-writing-1 done in 1:30\n"
        )
        if stream.isatty():
            assert stream.getvalue() == (
                "\r\033[Krun 2 of 4: magrpo-writing-1 0:05 (about 3:10 left)"
                "\r\033[Krun 2 of 4: magrpo-writing-1 done in 1:30\n"
            )
        else:
            assert stream.getvalue() == "run 2 of 4: magrpo-writing-1 done in 1:30\n"


def test_a_named_score_reaches_the_evaluation_and_the_baselines_record(tmp_path):
    """--score KEY: the trained runs' evaluation callback scores by KEY, and a baseline's record reads eval/KEY."""
    from collab.compare import grid
    from collab.compare.running import Record, fill

    settings = grid.Settings(rollouts=1, tokens=None, score="majority@2")
    callbacks = grid.callbacks_config(grid.Cell("maporl", "debate", 3), settings)["trainer"]["callbacks"]
    (evaluation,) = [c for c in callbacks if c["class_path"].endswith("EvaluationCallback")]
    assert evaluation["init_args"]["score"] == "majority@2" and evaluation["init_args"]["seed"] == 3
    (tmp_path / "metrics.json").write_text('{"eval/return": 1.25, "eval/majority@2": 0.375, "eval/problems": 64}')
    record = Record("parallel", "baseline", "debate", 3, 0, 1.0, 0, [])
    fill(record, tmp_path, "majority@2")
    assert (record.score, record.score_key, record.eval_problems) == (0.375, "majority@2", 64)
    fill(record, tmp_path)  # no score named: the return (debate reports no solved)
    assert (record.score, record.score_key) == (1.25, "return")


def test_the_single_baseline_is_scored_by_the_last_step_info(tmp_path):
    """The single baseline's wrapper has no votes, so its metrics hold the info key's mean alone
    (``eval/env/majority@2``) and no ``eval/majority@2``: the record reads it (else the grid records no score
    for single), not ``eval/return``."""
    from collab.compare import grid
    from collab.compare.running import Record, fill

    cell = grid.Cell("single", "debate", 0)
    folder = grid.cell_dir(tmp_path, cell)
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text('{"eval/return": 0.4375, "eval/env/majority@2": 0.21875, "eval/problems": 64}')
    record = Record("single", "baseline", "debate", 0, 0, 1.0, 0, [])
    fill(record, folder, "majority@2")
    assert (record.score, record.score_key, record.eval_problems) == (0.21875, "majority@2", 64)


def test_comparison_notebook(tiny_grid, kernel_env, monkeypatch):
    """On the tiny grid of ``python -m collab.compare`` (the fixture above): the runs, the summary, both figures."""
    figures = kernel_env / "figures"
    monkeypatch.setenv("COLLAB_COMPARE", str(tiny_grid.out))
    text = "".join(execute("comparison", kernel_env, tiny_grid.out, figures, monkeypatch))
    assert "6 runs in" in text and "Budget: 2 rollouts per training run" in text and "grpo (control)" in text
    for name in ("comparison_heldout.png", "comparison_curves.png"):
        assert png_size(figures / name)[0] > 300


# The grids of conf/compare: their documented command builds every run.

COMPARE_CONFIGS = sorted((Path(__file__).resolve().parents[2] / "conf" / "compare").glob("*.yaml"))


def _documented_command(path: Path) -> list[str]:
    """The ``python -m collab.compare ...`` command in the file's header comment (with its continuation lines)."""
    lines = [line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")]
    start = next(i for i, line in enumerate(lines) if line.startswith("python -m collab.compare"))
    words = []
    for line in lines[start:]:
        words += line.rstrip("\\").split()
        if not line.endswith("\\"):
            break
    return words[3:]


@pytest.mark.parametrize("path", COMPARE_CONFIGS, ids=[p.stem for p in COMPARE_CONFIGS])
def test_compare_configs_build_every_run(path, tmp_path, capsys):
    """The documented grid with one seed, its runs built (not run: ``--max_runs 0``) on the tiny model: every
    algorithm and control takes the config's overrides."""
    import shlex

    from collab.compare import main

    args = _documented_command(path)
    assert "--config" in args and "--algos" in args and "--output" in args
    args[args.index("--config") + 1] = str(path)
    seeds = args.index("--seeds") + 1
    end = next(i for i in range(seeds, len(args)) if not args[i].isdigit())
    args[seeds:end] = ["0"]
    args[args.index("--output") + 1] = str(tmp_path / "out")
    assert main(args + ["--max_runs", "0", "--model.base.name", "tiny"]) == 0, shlex.join(args)
    out = capsys.readouterr().out
    assert "grid: " in out and "stopped after 0 runs" in out
    assert not list((tmp_path / "out" / "records").glob("*.json"))


# --defaults: each algorithm's main job as it is.


def test_defaults_runs_each_main_job_on_its_own_env(tmp_path):
    """``--defaults``: ``collab.fit --algo A`` with seed k and the overrides alone (here a config shortening the
    job to one rollout and two eval problems); the cell's env is the job's own (magrpo's default is math), and the
    table gives every seed's before/after/gain and the mean gain over seeds."""
    import json

    from collab.compare import main

    small = tmp_path / "small.yaml"
    evaluation = {"at_start": True, "greedy": True, "num_samples": 1, "ks": [1], "max_tasks": 2}
    small.write_text(
        json.dumps(
            {
                "trainer": {
                    "max_steps": 1,
                    "enable_checkpointing": False,
                    "callbacks": [
                        {"class_path": "collab.training.callbacks.RewardSummary"},
                        {"class_path": "collab.training.callbacks.EvaluationCallback", "init_args": evaluation},
                    ],
                }
            }
        )
    )
    out = tmp_path / "out"
    assert (
        main(
            [
                "--defaults",
                "--algos",
                "magrpo",
                "--seeds",
                "0",
                "1",
                "--output",
                str(out),
                "--jobs",
                "2",
                "--model.base.name",
                "tiny",
                "--config",
                str(small),
            ]
        )
        == 0
    )
    rows = _rows(out / "results.csv")
    assert [(r["method"], r["env"], r["seed"], r["returncode"]) for r in rows] == [
        ("magrpo", "math", "0", "0"),
        ("magrpo", "math", "1", "0"),
    ]
    assert all(r["score_key"] == "solved" and r["eval_problems"] == "2" and r["before_se"] != "" for r in rows)
    command = json.loads((out / "records" / "magrpo-math-1.json").read_text())["command"]
    assert command[command.index("--algo") + 1 :] == [
        "magrpo",
        "--model.base.name",
        "tiny",
        "--config",
        str(small),
        "--seed_everything",
        "1",
        "--data.seed",
        "1",
        "--trainer.default_root_dir",
        str(out / "cells" / "magrpo-math-1"),
    ]
    table = (out / "comparison.md").read_text()
    assert "### magrpo on math: held-out accuracy (2 eval problems x 1 episodes)" in table
    assert "Mean gain over 2 seeds" in table and "positive on" in table
    assert json.loads((out / "grid.json").read_text())["defaults"] is True


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--rollouts", "3"],
            "--defaults runs each main job as it is (its own env, budget and held-out evaluation): drop --rollouts",
        ),
        (["--envs", "writing", "--score", "return"], "drop --envs, --score, or drop --defaults"),
        (["--data.env", "writing"], "--data.env is set by collab.compare --defaults for each run"),
        (["--algos", "nosuch"], "unknown algo 'nosuch'; valid: at_grpo, collm_cc"),
    ],
)
def test_defaults_refuses_what_the_main_jobs_own(tmp_path, capsys, args, message):
    from collab.compare import main

    argv = ["--defaults", "--output", str(tmp_path / "out")] + args
    if "--algos" not in args:
        argv += ["--algos", "magrpo"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_seed_tables_by_hand():
    """Gains +0.2, -0.1, +0.5 over three seeds: mean +0.2, SE sqrt(((0)^2 + 0.3^2 + 0.3^2) / 2 / 3) = 0.1732."""
    from collab.compare.report import render_seed_tables

    rows = [
        {
            "method": "ippo",
            "env": "math",
            "seed": str(s),
            "returncode": "0",
            "score_key": "solved",
            "eval_problems": "64",
            "eval_samples": "1",
            "before": "0.25",
            "before_se": "0.05",
            "score": str(0.25 + g),
            "score_se": "0.06",
            "gain": str(g),
            "gain_se": "0.1",
            "wall_s": "300",
            "peak_rss_bytes": str(2**31),
        }
        for s, g in enumerate([0.2, -0.1, 0.5])
    ]
    rows.append({**rows[0], "seed": "3", "returncode": "1", "gain": ""})
    text = render_seed_tables(rows, ["ippo-math-3 (exit 1)"])
    assert "### ippo on math: held-out accuracy (64 eval problems x 1 episodes)" in text
    assert "| 1 | 0.2500 ± 0.0500 | 0.1500 ± 0.0600 | -0.1000 ± 0.1000 | -1.0 | 5.0 min | 2.00 GiB |" in text
    assert "Mean gain over 3 seeds +0.2000 ± 0.1732 (SE over seeds; 1.2 SE); positive on 2 of 3." in text
    assert "Failed runs (left out): ippo-math-3 (exit 1)" in text
