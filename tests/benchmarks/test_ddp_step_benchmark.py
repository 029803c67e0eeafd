"""benchmarks/ddp_step.py reads the figures it reports from collab.fit's plain progress lines: checked on
lines written by the progress callback itself (so a change of the line's format breaks this test)."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from tests.support.benchmarks import load


@pytest.fixture(scope="module")
def bench():
    return load("ddp_step")


def test_figures_come_from_the_progress_lines(bench):
    from collab.training.progress import RolloutLines

    out = io.StringIO()
    lines = RolloutLines(stream=out)
    trainer = SimpleNamespace(is_global_zero=True, global_step=0, max_steps=3, callback_metrics={})
    lines.on_train_start(trainer, None)
    for step, (tokens, rollout) in enumerate([(41.25, 17.5), (40.0, 16.0), (50.0, 12.0)], start=1):
        trainer.global_step = step
        trainer.callback_metrics = {"reward/return": 0.25, "rollout/tokens_per_s": tokens, "rollout/seconds": rollout}
        lines.on_train_batch_end(trainer, None, None, None, 0)
    rows = bench.parse("training from step 0 of 3\nevaluation at step 0 (3 eval tasks)\n" + out.getvalue())
    assert [r["tokens"] for r in rows] == [41.2, 40.0, 50.0]  # printed with one decimal
    assert [r["rollout"] for r in rows] == [17.5, 16.0, 12.0]
    assert all(r["step"] >= 0 for r in rows) and len(rows) == 3
    # the first step is a warm-up: the median of the others
    assert bench.median(rows, "tokens") == 45.0 and bench.median(rows, "rollout") == 14.0
