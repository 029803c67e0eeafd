"""benchmarks/decode_parts.py: the call it times is the tree's deepest decode (32 requests x 2 samples), its cache
size is the hand-computed one, and a budget splits the call into the parts the budget allows."""

from __future__ import annotations

import math

from tests.support.benchmarks import load


def test_one_call_in_parts_on_the_tiny_model():
    bench = load("decode_parts")
    whole = bench.measure("tiny", prompt=300, requests=32, new=4, budget_gb=None)
    assert whole["parts"] == 1
    assert whole["cache_gib"] * 2**30 == 2 * 32 * (300 + 4) * 512  # samples x tokens x 512 bytes (the tiny Llama)
    # 8 samples of 304 tokens a part (the requests' 2 samples stay together): 64 samples in 8 parts
    parted = bench.measure("tiny", prompt=300, requests=32, new=4, budget_gb=8 * 304 * 512 / 2**30)
    assert parted["parts"] == math.ceil(64 / 8)


def test_the_prefill_chunk_is_set_for_the_call_and_restored():
    import collab.policy.prefill as prefill_module

    bench = load("decode_parts")
    before = prefill_module.PREFILL_CHUNK
    pieces = bench.measure("tiny", prompt=300, requests=4, new=2, budget_gb=None, chunk=64)
    assert pieces["parts"] == 1 and prefill_module.PREFILL_CHUNK == before
