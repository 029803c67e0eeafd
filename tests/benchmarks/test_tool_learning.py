"""benchmarks/tool_learning.py reads a comparison folder of tool-using cells: per run, the accuracy of results.csv
and the right calls of steps.csv at the first and last step; per method, the gains across seeds. Checked on a
folder written here, against hand-computed figures."""

from __future__ import annotations

import csv

from tests.support.benchmarks import load

RESULT = ("method", "seed", "returncode", "before", "score", "gain", "gain_se")
STEP = ("method", "seed", "step", "tag", "value")


def write(path, fields, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def test_the_gains_across_seeds_by_hand(tmp_path, capsys):
    runs = [("0", 0.25, 0.5, 0.5, 0.75), ("1", 0.5, 0.5, 0.25, 0.75), ("2", 0.25, 0.75, 0.5, 0.25)]
    write(
        tmp_path / "results.csv",
        RESULT,
        [dict(zip(RESULT, ("marft_a", s, "0", b, a, a - b, 0.05))) for s, b, a, _, _ in runs]
        + [dict(zip(RESULT, ("marft_a", "3", "1", "", "", "", "")))],  # a failed run: left out
    )
    steps = []
    for s, _, _, right_before, right_after in runs:
        steps += [
            dict(zip(STEP, ("marft_a", s, 10, "eval/env/tool_right", right_after))),  # the rows in any order
            dict(zip(STEP, ("marft_a", s, 0, "eval/env/tool_right", right_before))),
            dict(zip(STEP, ("marft_a", s, 10, "eval/env/tool_calls", 1.0))),
        ]
    write(tmp_path / "steps.csv", STEP, steps)
    load("tool_learning").main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "| marft_a | 2 | 0.2500 | 0.7500 | +0.5000 ± 0.0500 | 0.5000 | 0.2500 | 1.0000 |" in out
    # accuracy gains 0.25, 0, 0.5: mean 0.25, sd 0.25, SE 0.25 / sqrt(3) = 0.1443
    assert "marft_a accuracy: gain positive on 2 of 3 seeds, mean +0.2500 ± 0.1443 (1.7 SE)" in out
    # right-call gains 0.25, 0.5, -0.25: mean 0.1667, sd 0.3819, SE 0.2205
    assert "marft_a right calls: gain positive on 2 of 3 seeds, mean +0.1667 ± 0.2205 (0.8 SE)" in out
