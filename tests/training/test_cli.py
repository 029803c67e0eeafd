"""``python -m collab.fit``: configs, overrides, logs, checkpoints and resumption (bad input: test_bad_input.py,
whose cases run in forked children of one warm interpreter)."""

import json
from pathlib import Path

import pytest
import yaml

from tests.support import warm
from tests.support.presets import config_algos, preset_runs

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model.base.name", "tiny", "--trainer.accelerator", "cpu"]


def fit(*args, cwd, timeout=300):
    """``python -m collab.fit args``, forked warm (tests/support/warm.py)."""
    return warm.run(list(args), cwd, warm.child_env(), timeout=timeout)


@pytest.mark.parametrize(
    "config,algo",
    [(p, a) for p in sorted(ROOT.glob("conf/algo/*.yaml")) for a in config_algos(p)] + preset_runs(),
    ids=lambda v: v.name if isinstance(v, Path) else v,
)
def test_every_shipped_config_parses(config, algo, tmp_path, monkeypatch, capsys):
    from collab.fit import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:  # in-process: --print_config exits after printing
        main(["--algo", algo, "--config", str(config), "--print_config"])
    assert exit_.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert {"trainer", "model", "data"} <= set(printed)


def test_overrides_reach_the_config(tmp_path):
    result = fit(
        "--algo",
        "magrpo",
        "--model.agent_lr",
        "1e-5",
        "--data.env",
        "matrix",
        "--trainer.max_steps",
        "30",
        "--print_config",
        cwd=tmp_path,
    )
    printed = yaml.safe_load(result.stdout)
    assert printed["model"]["agent_lr"] == 1e-5
    assert printed["data"]["env"] == "matrix" and printed["trainer"]["max_steps"] == 30


def test_fit_writes_logs_and_adapters_and_resumes(tmp_path, monkeypatch):
    args = [
        "--algo",
        "magrpo",
        "--data.env",
        "matrix",
        "--data.batch_size",
        "2",
        "--model.agent_lr",
        "1e-2",
        "--model.ppo.num_epochs",
        "1",
        *TINY,
    ]
    first = fit(*args, "--trainer.max_steps", "3", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    run = tmp_path / "runs" / "magrpo" / "version_0"
    assert list(run.glob("events.out.tfevents.*")), "no TensorBoard log"
    assert (run / "adapters" / "last" / "agent0" / "adapter_model.safetensors").is_file()
    assert (run / "adapters" / "last" / "agent1" / "adapter_config.json").is_file()
    summary = json.loads((run / "reward_summary.json").read_text())
    assert summary["rollouts"] == 3
    ckpt = run / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    assert state and all("lora_" in k for k in state), "checkpoint must hold adapters only"
    from collab.fit import main  # the resume in this process: the first run was the command line's

    monkeypatch.chdir(tmp_path)
    assert main([*args, "--trainer.max_steps", "5", "--ckpt_path", str(ckpt)]) == 0
    summary = json.loads((tmp_path / "runs" / "magrpo" / "version_1" / "reward_summary.json").read_text())
    assert summary["rollouts"] == 5  # one summary across the resume: steps 1-3 (from the checkpoint), 4 and 5


@pytest.mark.parametrize("algo, env", [("magrpo", "minecraft"), ("magrpo", "str_build"), ("maporl", "debate")])
def test_new_envs_train_from_the_command_line(algo, env, tmp_path):
    """``python -m collab.fit --algo magrpo --data.env minecraft`` (4 turns, K from the env: 2), the same on
    str_build and the MAPoRL debate, on the tiny model with short responses: the run ends and logs the env's own
    scalars. Without the configs' held-out evaluations (two thirds of the time; test_ddp.py evaluates on minecraft
    and the debate)."""
    from collab.evaluation.analysis import read_scalars

    result = fit(
        "--algo",
        algo,
        "--data.env",
        env,
        "--model.agents",
        "null",
        "--data.env_options",
        "{max_new_tokens: 4}",
        "--data.batch_size",
        "1",
        "--trainer.max_steps",
        "1",
        "--trainer.callbacks",
        "[]",
        *TINY,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "evaluation at step" not in result.stdout
    scalars = read_scalars(tmp_path / "runs" / algo / "version_0")
    key = "env/majority@2" if env == "debate" else "env/iou"
    assert key in scalars, sorted(scalars)
    if env != "debate":
        assert len(scalars["reward/turn3/agent0"]) == 1  # the 4th turn was played


def test_default_main_job_evaluates_at_least_64_problems_before_and_after():
    """The shipped default's held-out comparison: an evaluation at the start and the end, on the whole eval
    split of the math env (64 problems or more; test_quiet.py runs it cut to 8 to stay short)."""
    from collab.config import packaged_config
    from collab.envs import make_env

    config = packaged_config("marft_a")  # conf/base.yaml, conf/env/math.yaml, conf/algo/marft_a.yaml
    evaluation = [
        c["init_args"] for c in config["trainer"]["callbacks"] if c["class_path"].endswith("EvaluationCallback")
    ]
    assert len(evaluation) == 1 and evaluation[0]["at_start"] and evaluation[0].get("max_tasks") is None
    env = make_env(config["data"]["env"], **config["data"]["env_options"])
    assert len(env.tasks("eval")) >= 64
