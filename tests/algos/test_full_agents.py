"""Full-parameter agents (``finetune: full``) through ``collab.fit`` on the tiny model: every algorithm trains one
step with full agents beside LoRA agents or alone (critics on the untrained base: shared, or a copy of their own);
a full-agent team learns the matrix game's joint optimum; a resumed run repeats the uninterrupted one bitwise; two
DDP processes keep the full agent bitwise equal; the refusals are one line each. (``collab.export`` and
``collab.evaluate`` of such a run: tests/training/test_export.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch

from collab.policy.models import BaseConfig, load_tokenizer, tiny_llama
from tests.support import (
    SAMPLE_THE_POLICY,
    SAMPLE_THE_POLICY_ARGS,
    TINY_CLI,
    assert_same_tensors,
    fit,
    load,
    prob_of_first_option,
    quiet_fit,
    warm,
)

ROOT = Path(__file__).resolve().parents[2]
MATRIX = ["--data.env", "matrix", "--data.env_options", "{}"]
FULL, LORA = {"finetune": "full"}, {}

pytestmark = pytest.mark.usefixtures("one_thread")


def seven(folder: Path) -> str:
    """The debate of tests/training/test_resume.py: the answer is the one token "7"."""
    path = folder / "seven.json"
    path.write_text(json.dumps([{"problem": f"Question {i}: say 7.", "answer": "7"} for i in range(4)]))
    return str(path)


def agents(*specs: dict) -> list[str]:
    """``--model.agents`` of ``specs``, sampling from the policy (a step's group must disagree to move a weight)."""
    return ["--model.agents", json.dumps(list(specs)), *SAMPLE_THE_POLICY_ARGS]


# algo -> its run and which agents are full. Mixed teams put the critics (CoLLM-CC's, MARFT-A's head) on the shared
# base; full-only teams load the untrained copy (MARFT-T's head) or give each LLM critic a base of its own (CoLLM-DC).
RUNS = {
    "magrpo": lambda tmp: [*MATRIX, *agents(FULL, LORA), "--model.kl_coef", "0.05", "--model.num_generations", "2"],
    "collm_cc": lambda tmp: [*MATRIX, *agents(FULL, LORA)],
    "collm_dc": lambda tmp: [*MATRIX, *agents(FULL, FULL)],
    "ippo": lambda tmp: [*MATRIX, *agents(LORA, FULL), "--data.num_turns", "2"],
    "marft_a": lambda tmp: [*MATRIX, *agents(FULL, LORA)],
    "marft_t": lambda tmp: [*MATRIX, *agents(FULL, FULL)],
    # a member per (turn, agent): turn 1's frozen (a full one among them), turn 2's trained
    "maporl": lambda tmp: [
        "--data.env_options",
        json.dumps(
            {"dataset": seven(tmp), "agents": 2, "train_split": "0:4", "eval_split": "0:4", "stop_on_consensus": False}
        ),
        *agents({**FULL, "choices": ["7", "3"]}, {"choices": ["7", "3"]}),
        "--model.per_turn",
        "true",
        "--data.batch_size",
        "2",
    ],
}


def untrained() -> dict[str, torch.Tensor]:
    return dict(tiny_llama(len(load_tokenizer("tiny")), seed=0).named_parameters())


def full_weights(state: dict, key: str) -> dict[str, torch.Tensor]:
    prefix = f"team.models.{key}."
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


@pytest.mark.parametrize("algo", list(RUNS))
def test_every_algorithm_trains_full_agents(algo, tmp_path, monkeypatch, capsys):
    """One update (MAPoRL: two): the checkpoint holds each trained full agent's whole model, moved from the base in
    every tensor the step reached, the frozen ones (MAPoRL's turn-1 members) not at all; the start of the run says what
    each full agent holds; ``adapters/last`` has a model folder per full agent and a peft folder per LoRA agent."""
    monkeypatch.chdir(tmp_path)
    run = fit(tmp_path, algo, RUNS[algo](tmp_path), 2 if algo == "maporl" else 1)  # MAPoRL's first: no signal here
    state = load(run)["state_dict"]
    base = untrained()
    keys = sorted({k.split(".")[2] for k in state if k.startswith("team.models.full")})
    expected = {"maporl": ["full2"], "collm_dc": ["full0", "full1"], "marft_t": ["full0", "full1"]}
    assert keys == expected.get(algo, ["full1"] if algo == "ippo" else ["full0"])
    for key in keys:
        weights = full_weights(state, key)
        assert weights.keys() == base.keys()
        moved = [n for n, w in weights.items() if not torch.equal(w, base[n])]
        assert len(moved) >= len(base) - 1, (key, sorted(set(base) - set(moved)))  # the unused head rows may stay
    out = capsys.readouterr().out
    assert "full-parameter agents: agent" in out and "4 x 4 bytes a parameter" in out
    folders = sorted((run / "adapters" / "last").iterdir())
    for folder in folders:
        whole = json.loads((folder / "agent.json").read_text())["finetune"] == "full"
        assert (folder / ("config.json" if whole else "adapter_model.safetensors")).is_file(), folder


def test_float32_weights_keep_an_update_that_bfloat16_weights_round_away(tmp_path, monkeypatch):
    """The papers' 5e-6 on a full agent: with bfloat16 weights (and AdamW moments) AdamW's first step, about lr per
    weight, is far below bfloat16's resolution at weights of ~0.02 and leaves nearly every weight as it was (only those
    near 0 move); float32 weights under Lightning's ``bf16-mixed`` autocast (16-bit compute) keep it (models.md)."""
    monkeypatch.chdir(tmp_path)
    moved = {}
    for dtype, extra in (("bfloat16", []), ("float32", ["--trainer.precision", "bf16-mixed"])):
        args = [*MATRIX, *agents({**FULL, "lr": 5e-6}, LORA), "--model.kl_coef", "0.05", "--model.num_generations", "2"]
        run = fit(tmp_path / dtype, "magrpo", [*args, "--model.base.dtype", dtype, *extra], 1)
        weights = full_weights(load(run)["state_dict"], "full0")
        # the layers' weights: the embedding (nearly all of the tiny model) moves only in the rows of tokens used
        base = {k: v.to(getattr(torch, dtype)) for k, v in untrained().items() if ".layers." in k}
        changed = sum(int((weights[k] != base[k]).sum()) for k in base)
        moved[dtype] = changed / sum(v.numel() for v in base.values())
    assert moved["bfloat16"] < 0.2 and moved["float32"] > 0.95, moved  # measured: 0.077 and 0.999


def test_a_full_agent_team_learns_the_matrix_games_joint_optimum():
    """MAGRPO with two full agents (tiny base, lr 1e-3) on Table 1 (joint reward): from 0.55 at the start, both
    agents prefer A, the joint optimum, after 10 updates, on each of 3 seeds."""
    from collab.algos import data_from_config, from_config
    from collab.policy.team import AgentSpec

    for seed in range(3):
        L.seed_everything(seed, verbose=False)
        dm = data_from_config("magrpo", env="matrix", env_options={"preset": "table1"}, batch_size=4, seed=seed)
        module = from_config(
            "magrpo",
            agents=[AgentSpec(finetune="full"), AgentSpec(finetune="full")],
            agent_defaults=SAMPLE_THE_POLICY,
            base=BaseConfig(name="tiny", seed=seed),
            agent_lr=1e-3,
            num_generations=4,
            log_kl_every=0,
        )
        quiet_fit(module, dm, 10)
        assert all(agent.adapter is None for agent in module.team.agents)
        probs = prob_of_first_option(module, dm.env)
        assert all(p > 0.8 for p in probs), (seed, probs)


@pytest.mark.parametrize(
    "algo,args",
    [
        ("magrpo", [*MATRIX, *agents(FULL, LORA), "--model.kl_coef", "0.05"]),  # the reference: the shared base
        ("marft_a", [*MATRIX, *agents(FULL, FULL), "--data.num_turns", "2"]),  # the head's base: a copy, loaded late
    ],
)
def test_resume_is_bitwise(algo, args, tmp_path, monkeypatch):
    """2 updates straight, and 1 then ``--ckpt_path last.ckpt`` to 2: the same full models, adapters, heads, AdamW
    moments, random and task state, and saved model folders, bitwise; the same reward at every rollout."""
    from safetensors.torch import load_file

    monkeypatch.chdir(tmp_path)
    straight = fit(tmp_path / "straight", algo, args, 2)
    part = fit(tmp_path / "parts", algo, args, 1)
    resumed = fit(tmp_path / "parts", algo, args, 2, part / "checkpoints" / "last.ckpt")
    a, r = load(straight), load(resumed)
    assert full_weights(a["state_dict"], "full0") and (a["global_step"], r["global_step"]) == (2, 2)
    for key in ("state_dict", "optimizer_states", "collab", "RolloutDataModule"):
        assert_same_tensors(a[key], r[key], key)
    for folder in (straight / "adapters" / "last").iterdir():
        files = sorted(p.name for p in folder.glob("*.safetensors"))
        assert files
        for name in files:
            assert_same_tensors(
                load_file(folder / name), load_file(resumed / "adapters/last" / folder.name / name), name
            )
    rewards = [json.loads((run / "reward_summary.json").read_text())["rewards"] for run in (straight, resumed)]
    assert rewards[0] == rewards[1] and len(rewards[0]) == 2


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(
    "extra,expected",
    [
        (["--model.base.quantization", "4bit"], "quantization none, or finetune: lora"),
        (["--model.critic_spec", "{share_agent_adapter: true}", "--model.critic", "decentralized"], "share_agent"),
        ([], "more than the 1.0 MB of cpu: train them as LoRA agents"),  # a device of 1 MB, before loading
    ],
)
def test_refusals_are_one_line(extra, expected, tmp_path, monkeypatch, capsys):
    from collab.fit import main
    from collab.policy import full

    monkeypatch.chdir(tmp_path)
    if not extra:
        monkeypatch.setattr(full, "device_bytes", lambda device: 2**20)
    algo = "ippo" if "share" in expected else "magrpo"
    argv = ["--algo", algo, *TINY_CLI, *MATRIX, *agents(FULL, LORA), "--trainer.max_steps", "1", *extra]
    assert main([*argv, "--trainer.logger.init_args.save_dir", str(tmp_path)]) == 2
    errors = error_lines(capsys)
    assert len(errors) == 1 and expected in errors[0], errors


def test_two_processes_keep_a_full_agent_bitwise_equal(tmp_path, monkeypatch):
    """MAGRPO with a full and a LoRA agent on 2 gloo processes, 2 updates: both ranks hold bitwise the same weights
    (the full model's among them) after every update, moved from the start; the checkpoint resumes on 1 process."""
    callbacks = [
        {"class_path": "collab.training.callbacks.ModelCheckpoint", "init_args": {"save_last": True}},
        {"class_path": "tests.support.ddp_probe.Probe"},
    ]
    argv = [
        "--algo",
        "magrpo",
        *TINY_CLI,
        *MATRIX,
        *agents(FULL, LORA),
        "--data.batch_size",
        "2",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "runs"),
        "--trainer.callbacks",
        json.dumps(callbacks),
    ]
    env = warm.child_env(COLLAB_DDP_PROBE=str(tmp_path), OMP_NUM_THREADS="1")
    ddp = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.max_steps", "2"]
    run = warm.ranks([*argv, *ddp], tmp_path, env)  # forked warm, as Lightning's launcher starts its children
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"] == 2
    assert ranks[0]["digests"] == ranks[1]["digests"] and len(ranks[0]["digests"]) == 2
    assert ranks[0]["start"] == ranks[1]["start"] != ranks[0]["digests"][-1]
    (ckpt,) = list((tmp_path / "runs").rglob("last.ckpt"))
    assert full_weights(torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"], "full0")
    from collab.fit import main

    monkeypatch.setenv("COLLAB_DDP_PROBE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--trainer.max_steps", "3", "--ckpt_path", str(ckpt)]) == 0
