"""The tiny comparison grid (``python -m collab.compare``), shared by test_compare.py and test_notebooks.py."""

from types import SimpleNamespace

import pytest

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
GRID = ["--algos", "magrpo", "--envs", "writing", "--seeds", "0", "1", "--rollouts", "2", "--controls", "grpo",
        "parallel", "--eval_tasks", "2", "--eval_samples", "2"]
"""MAGRPO, the grpo control and the parallel baseline on writing, seeds 0 and 1: 6 runs of the tiny model."""


def _mtimes(out) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted((out / "records").glob("*.json"))}


@pytest.fixture(scope="session")
def tiny_grid(tmp_path_factory):
    """The grid run three times: stopped after its first run (``--max_runs 1``, as if killed), with a stale
    folder of a run killed midway added; started again (the other five runs, two at a time: ``--jobs 2``); and once more (nothing to do).
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
