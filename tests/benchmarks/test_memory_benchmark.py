"""benchmarks/memory.py on the ``tiny`` base, in this process: both methods build, take a training step,
and account their tensors as the designs say (collab: one base + adapters; reference: full copies, all trained)."""

from __future__ import annotations

import pytest

from tests.support.benchmarks import load


@pytest.fixture(scope="module")
def bench():
    return load("memory")


def run(bench, method: str) -> dict:
    args = bench.parse_args(
        ["--model", "tiny", "--batch", "1", "--prompt-tokens", "16", "--response-tokens", "8", "--method", method]
    )
    return bench.measure(args)


def test_collab_and_reference_figures(bench):
    import math

    c, r = run(bench, "collab"), run(bench, "reference")
    for x in (c, r):
        assert math.isfinite(x["loss"]) and x["activations"] > 0 and x["rss_peak_kib"] > 0
        assert x["optim"] >= 2 * x["grads"] > 0  # AdamW: exp_avg + exp_avg_sq (+ step) per trained tensor
    # reference: 3 full models, every parameter trained
    assert r["grads"] == r["params"]
    assert 2.9 * c["params"] < r["params"] < 3.1 * c["params"]
    # collab: one base; grads only for the 3 adapters and the value head
    assert c["grads"] < 0.05 * c["params"]
    assert c["params"] + c["grads"] + c["optim"] < 0.35 * (r["params"] + r["grads"] + r["optim"])


def test_report_prints_ratios(bench, capsys):
    fake = {
        "threads": 2,
        "rss_import_kib": 1000,
        "rss_built_kib": 1200,
        "params": 4 * 2**20,
        "grads": 2**20,
        "optim": 2 * 2**20,
        "activations": 2**20,
        "trainable": 10,
        "build_s": 1.0,
        "step_s": 2.0,
    }
    res = {"collab": {**fake, "rss_peak_kib": 2000}, "reference": {**fake, "rss_peak_kib": 5000}}
    bench.report(bench.parse_args(["--model", "tiny"]), res)
    out = capsys.readouterr().out
    assert "ratio collab / reference: peak RSS 0.400" in out
    assert "(peak RSS above the import RSS: 0.250)" in out
