"""benchmarks/sampling.py: one line per kind and shape, and both sides draw inside the same nucleus."""

from __future__ import annotations

import json

import torch

from tests.support.benchmarks import load


def test_a_smoke_run_prints_a_line_per_kind_and_shape(capsys):
    load("sampling").main(["--rows", "2", "3", "--vocab", "3000", "--repeats", "2"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [(d["kind"], d["rows"]) for d in lines] == [(k, r) for k in ("flat", "t1", "peaked") for r in (2, 3)]
    assert all(d["before_ms"] > 0 and d["sample_tokens_ms"] > 0 for d in lines)


def test_the_baseline_draws_in_the_nucleus():
    from collab.policy.draw import truncate

    bench = load("sampling")
    torch.manual_seed(0)
    logits = torch.randn(500, 3000) * 0.16 / 0.7
    top_p, top_k = torch.full((500,), 0.9), torch.zeros(500, dtype=torch.long)
    inside = truncate(logits, top_p, top_k) > float("-inf")
    tokens = bench.before(logits, top_p, top_k)
    assert inside.gather(-1, tokens[:, None]).all()
