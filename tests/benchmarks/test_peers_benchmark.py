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


def test_collab_options_are_yaml_values_and_a_malformed_pair_ends_in_one_line():
    peers = load("peers")
    got = peers.collab_options(["log_kl_every=0", "micro_batch_tokens=null", "ppo.num_epochs=2", "ppo.clip=0.1"])
    assert got == {"log_kl_every": 0, "micro_batch_tokens": None, "ppo": {"num_epochs": 2, "clip": 0.1}}
    assert peers.collab_options([]) == {}
    with pytest.raises(SystemExit, match="KEY=VALUE pairs.*got 'log_kl_every'"):
        peers.collab_options(["log_kl_every"])


def test_team_scaling_scores_each_agent_against_its_own_length_and_tabulates_the_ratios():
    scaling = load("team_scaling")
    words = lambda n: " ".join(["w"] * n)  # noqa: E731
    assert scaling.team_reward([words(10), words(20), words(30)]) == 0.0  # agent i aims at 10 (i + 1) words
    # 5 words (-0.5) and 40 (+1.0 off: -1.0): the mean
    assert scaling.team_reward([words(5), words(40)]) == pytest.approx(-0.75)
    assert scaling.point("k", 16) == {"agents": 2, "k": 16, "length": 64}
    ran = lambda s, gb: {"status": "ran", "s_per_step": s, "rss_gb": gb}  # noqa: E731
    results = {(2, "collab"): ran(10.0, 2.0), (2, "comlrl"): ran(40.0, 8.0), (4, "collab"): ran(12.0, 2.2)}
    results[4, "comlrl"] = {"status": "failed (exit -9)", "error": "killed"}
    lines = scaling.table("agents", results, ["collab", "comlrl"])
    assert lines[0] == (
        "| agents | collab LoRA s/step | collab LoRA GiB | CoMLRL full s/step | CoMLRL full GiB | "
        "collab / CoMLRL full time | collab / CoMLRL full memory |"
    )
    assert lines[2] == "| 2 | 10.00 | 2.00 | 40.00 | 8.00 | 0.25 | 0.25 |"
    assert lines[3] == "| 4 | 12.00 | 2.20 | failed (exit -9) |  |  |  |"
    assert len(lines) == 4  # no row for N = 8: not run (--values, or a run stopped part-way)
