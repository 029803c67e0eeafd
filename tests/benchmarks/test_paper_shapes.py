"""benchmarks/paper_shapes.py where the papers' shapes cannot run: its ``--smoke`` run of MAGRPO's writing preset
(the tiny shape of Qwen3, 2 optimizer steps) writes every section of the report and one JSON line, times every phase
and trains every sample (the rewards it varies); the papers' models it counts on the meta device have their
published sizes and the parameters counted by hand; the memory projection's arithmetic is checked against figures
computed by hand; the phase clock counts each second once."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.benchmarks import load, rows, section

ROOT = Path(__file__).resolve().parents[2]
QWEN3_1_7B = 1_720_574_976
"""Qwen3-1.7B's parameters (its config.json's shape, tied embeddings counted once)."""


@pytest.fixture(scope="module")
def bench():
    return load("paper_shapes")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[subprocess.CompletedProcess, str]:
    """The script's ``--smoke`` run of one preset in a process of its own: (the process, the report)."""
    out = tmp_path_factory.mktemp("paper_shapes") / "report.md"
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "benchmarks/paper_shapes.py", "--smoke", "--preset", "magrpo_writing_paper"]
    proc = subprocess.run([*command, "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.is_file(), proc.stderr[-3000:]
    return proc, out.read_text()


def test_the_smoke_run_writes_every_section_and_one_json_line(smoke):
    proc, report = smoke
    assert proc.returncode == 0, proc.stderr[-3000:]
    titles = re.findall(r"^#+ (.+)$", report, re.M)
    assert titles == [
        "collab presets at their papers' shapes",
        "Models",
        "Presets",
        "Training steps",
        "Memory",
        "Projected memory per GPU",
        "Projected memory per GPU under fsdp, by part",
        "Not run here",
    ]
    assert "- mode: smoke" in report and "2 optimizer steps" in report
    (line,) = proc.stdout.splitlines()  # stdout: the JSON lines alone
    record = json.loads(line)
    assert record["preset"] == "magrpo_writing_paper" and record["agents"] == ["Qwen3-1.7B", "Qwen3-1.7B"]
    assert record["run"]["command"].startswith("python -m collab.fit --algo magrpo --config ")
    assert rows(section(report, "Models"))["Qwen3-1.7B"][1] == "qwen3"


def test_the_smoke_run_times_every_phase_of_its_two_steps(smoke, bench):
    proc, report = smoke
    run = json.loads(proc.stdout)["run"]
    assert run["status"] == "ran" and run["optimizer_steps"] == 2
    steps = run["steps"]
    assert sum(s["updates"] for s in steps) == 2  # MAGRPO's 2 epochs: one rollout, two updates
    for phase in bench.PHASES:
        assert sum(s["phases"][phase] for s in steps) > 0, phase
    for s in steps:
        assert sum(s["phases"].values()) == pytest.approx(s["seconds"], rel=1e-6)
        # 2 posts x 2 agents x K=4 x 8 tokens at most; every sample trains (the varied rewards)
        assert 0 < s["rollout_tokens"] <= 128 and s["trained"] == 16
    assert 0 < run["rss_before_gib"] <= run["peak_rss_gib"]
    row = rows(section(report, "Training steps"))["magrpo_writing_paper"]
    assert row[1:3] == ["ran", "2"] and float(row[3]) > 0 and row[-1] == "-"  # no GPU: no GPU peak


def test_the_models_have_their_published_sizes(bench):
    for arch, published in bench.PUBLISHED.items():
        counted = bench.count(arch)["params"]
        assert abs(counted / published - 1) < 0.03, (arch, counted)


def test_qwen3_1_7b_counted_by_hand(bench):
    h, layers, heads, kv, d, inter, vocab = 2048, 28, 16, 8, 128, 6144, 151936
    attention = h * heads * d + 2 * h * kv * d + heads * d * h + 2 * d  # q, k, v, o; q and k norms
    layer = attention + 3 * h * inter + 2 * h  # gate, up, down; two RMSNorms
    assert vocab * h + layers * layer + h == QWEN3_1_7B  # tied embeddings once; the final norm
    counted = bench.count("Qwen3-1.7B", lora_ranks=(8,))
    assert counted["params"] == QWEN3_1_7B and counted["linear"] == layers * (attention - 2 * d + 3 * h * inter)
    # LoRA all-linear: r x (in + out) for q, k, v, o, gate, up, down
    per_layer = (h + heads * d) + 2 * (h + kv * d) + (heads * d + h) + 2 * (h + inter) + (inter + h)
    assert counted["lora"][8] == 8 * layers * per_layer
    assert counted["embedding"] == vocab * h and counted["unit"] == vocab * h  # the embedding is the largest unit


def hand_plan(act: float = 1000.0, kv: float = 100.0) -> dict:
    """MAGRPO's writing preset by hand: two agents on one Qwen3-1.7B, 4 tasks x K=4, one turn of 256 tokens after a
    744-token prompt."""
    linear, embedding, adapter = 1_409_286_144, 311_164_928, 8_716_288
    per_token = {key: (act, kv) for key in ("lora", "full", "lora+ckpt", "full+ckpt")}
    return {
        "agents": ["M", "M"],
        "counts": {"M": {"params": QWEN3_1_7B, "linear": linear, "embedding": embedding, "unit": embedding}},
        "trainable": {"agents": 2 * adapter, "critics": 0},
        "lora_bases": ["M"],
        "full_frozen": [],
        "checkpointing": False,
        "work": {"length": 1000, "critic_length": 0, "train_rows": 16, "decode_rows": 16, "agents": 2},
        "per_token": {"M": per_token},
    }


@pytest.mark.parametrize("world", [1, 2, 8])
def test_full_fine_tuning_holds_16_bytes_a_parameter_in_float32(bench, world):
    """ddp: every process holds both agents whole. collab's fsdp: each keeps 1/world of both, and a backward pass
    gathers one agent's weights and gradients whole (2 x 4 bytes a parameter; MAPoRL's passes: both agents); a KL
    reference stays whole on every process (fsdp does not shard it) and gathers nothing."""
    p = hand_plan()
    full = 2 * 16 * QWEN3_1_7B  # two agents: weights, gradients, two AdamW moments
    assert bench.state(p, "full", "ddp", world, 4) == (full, 0)  # each DDP process holds every full agent
    assert bench.state_bytes(p, "full", "ddp", world, 2) == full // 2  # bfloat16: 8 bytes a parameter
    sharded = (full // world, 8 * QWEN3_1_7B) if world > 1 else (full, 0)
    assert bench.state(p, "full", "fsdp", world, 4) == sharded
    assert bench.state({**p, "algo": "maporl"}, "full", "fsdp", world, 4)[1] == 2 * sharded[1]
    p["full_frozen"] = p["references"] = ["M"]  # a KL reference: the untrained base once more
    assert bench.state(p, "full", "ddp", world, 4) == (full + 4 * QWEN3_1_7B, 0)
    assert bench.state(p, "full", "fsdp", world, 4) == (sharded[0] + 4 * QWEN3_1_7B, sharded[1])


@pytest.mark.parametrize("world", [1, 2, 8])
def test_lora_and_qlora_hold_the_base_once_and_fsdp_gathers_it_whole_in_backward(bench, world):
    p = hand_plan()
    c = p["counts"]["M"]
    adapters = 16 * p["trainable"]["agents"]  # float32 weights, gradients and two moments
    assert bench.state(p, "lora", "ddp", world, 2) == (2 * QWEN3_1_7B + adapters, 0)
    qlora = 0.55 * c["linear"] + 2 * (QWEN3_1_7B - c["linear"])  # bitsandbytes keeps the embedding and norms
    assert bench.state(p, "qlora", "ddp", world, 2) == (int(qlora) + adapters, 0)
    assert bench.state(p, "qlora", "fsdp", world, 2) is None  # collab's fsdp refuses a quantized base
    # each process keeps 1/world of the base (rounded up), the backward gathers it whole; adapters whole
    kept = (-(-2 * QWEN3_1_7B // world), 2 * QWEN3_1_7B) if world > 1 else (2 * QWEN3_1_7B, 0)
    assert bench.state(p, "lora", "fsdp", world, 2) == (kept[0] + adapters, kept[1])


def test_activations_are_capped_by_collabs_budgets_but_hold_one_sequence(bench):
    p = hand_plan(act=1000.0, kv=100.0)
    one = 1.5 * 1000 * 1000  # SAFETY x bytes a token x the longest sequence
    assert bench.activation_bytes(p, "lora", 1, None, False) == (int(16 * one), 100 * 1000 * 16 * 2)
    assert bench.activation_bytes(p, "lora", 8, None, False) == (int(2 * one), 100 * 1000 * 4)
    assert bench.activation_bytes(p, "lora", 1, 4 * one, False) == (int(4 * one), 100 * 1000 * 32)
    assert bench.activation_bytes(p, "lora", 1, one / 10, False) == (int(one), int(one / 10))  # one sequence at least
    p["work"]["critic_length"] = 2000  # a centralized critic reads both agents' sequences
    assert bench.activation_bytes(p, "lora", 1, None, False)[0] == int(16 * 2 * one)
    gpu = 80 * 2**30
    update, rollout = bench.activation_bytes(p, "full", 2, gpu / 4, False)
    assert bench.project(p, "full", "ddp", 2, 4, gpu) == 2 * 16 * QWEN3_1_7B + max(update, rollout)
    assert bench.project(p, "qlora", "fsdp", 2, 2, gpu) is None
    # fsdp: a quarter of both agents, and one agent's weights and gradients whole alive with the update's activations
    update, rollout = bench.activation_bytes(p, "full", 4, gpu / 4, False)
    assert bench.project(p, "full", "fsdp", 4, 4, gpu) == 8 * QWEN3_1_7B + max(update + 8 * QWEN3_1_7B, rollout)


def test_rewards_vary_with_the_responses_and_stay_equal_for_equal_ones(bench):
    from collab.envs import make_env

    env = make_env("writing")
    state = env.reset(env.tasks("train")[0])
    before = [r.rewards for r in env.step_batch([state] * 3, [["a", "b"], ["a", "b"], ["a", "c"]])]
    bench.vary_rewards(env)
    after = [r.rewards for r in env.step_batch([state] * 3, [["a", "b"], ["a", "b"], ["a", "c"]])]
    assert after[0] == after[1] and after[0] != after[2]
    for old, new in zip(before, after):
        terms = [n - o for n, o in zip(new, old)]
        assert all(0 <= t < 0.1 for t in terms) and len(set(terms)) == 1  # a team reward: one term a joint action


def test_the_phase_clock_counts_each_second_once_in_the_innermost_phase(bench, monkeypatch):
    now = iter([0.0, 1.0, 3.0, 6.0])  # outer starts, inner starts, inner ends, outer ends
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(now))
    clock = bench.PhaseClock()
    with clock.phase("rollout"):
        with clock.phase("log-prob forwards"):
            pass
    assert clock.totals["rollout"] == 4.0 and clock.totals["log-prob forwards"] == 2.0
    assert math.isclose(sum(clock.totals.values()), 6.0)


def test_every_preset_composed_with_its_override_names_only_the_random_weight_folders(bench, tmp_path):
    """No model of a composed preset is left at its hub id (which would try the network): the agents' bases and
    an LLM critic's, also where the critic is on agent 0's model and the preset names it (CoLLM's coding critic)."""
    import yaml

    from tests.support.presets import composed

    opt = bench.Options("bfloat16", "lora", None, 1, None, None, True, str(tmp_path))
    for name, paper in bench.PAPERS.items():
        path = tmp_path / f"{name}.override.yaml"
        path.write_text(yaml.safe_dump(bench.override(name, opt)))
        model = composed(paper.algo, ["--config", str(bench.preset_file(name)), "--config", str(path)])["model"]
        names = [model["base"]["name"], *(a.get("base") for a in model["agents"])]
        names.append((model.get("critic_spec") or {}).get("base"))
        for named in filter(None, names):
            assert named.startswith(str(tmp_path)), f"{name}: {named}"
