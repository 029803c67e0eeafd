"""benchmarks/peers.py's pure parts: the reward every side is scored by, and which sides a ``--peers`` list runs
(the peers themselves are benchmark-only installs, not run here)."""

from __future__ import annotations

import pytest

from tests.support.benchmarks import load


def test_the_joint_reward_is_zero_at_the_target_lengths_and_falls_linearly():
    peers = load("peers")
    assert peers.joint_reward(" ".join(["w"] * 20), " ".join(["w"] * 40)) == 0.0
    # concise 10 words (-10/20), detailed 60 words (-20/40): mean of -0.5 and -0.5
    assert peers.joint_reward(" ".join(["w"] * 10), " ".join(["w"] * 60)) == pytest.approx(-0.5)
    assert peers.reward(" ".join(["w"] * 25)) == pytest.approx(-0.25)


def test_collab_runs_beside_each_named_peer_once_per_comparison():
    peers = load("peers")
    assert peers.plan(["collab", "comlrl-lora"]) == [("magrpo", "collab"), ("magrpo", "comlrl-lora")]
    assert peers.plan(["collab", "trl", "comlrl"]) == [
        ("magrpo", "collab"),
        ("magrpo", "comlrl"),
        ("grpo", "collab"),
        ("grpo", "trl"),
    ]
    assert peers.plan(["trl"]) == [("grpo", "trl")]
