"""Where a run reads its configs and writes its files: the packaged configs from any directory (also from
an installed wheel), ``--trainer.default_root_dir`` for logs, checkpoints and adapters, Lightning's options,
every preset's checkpoint/resume contract and every config's seeds."""

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import yaml

from collab.algos import algo_registry
from tests.training.test_cli import ROOT, TINY

PRESETS = sorted((ROOT / "conf" / "presets").glob("*.yaml"))


def test_every_config_is_seeded():
    from collab.config import packaged_config

    for algo in algo_registry():
        config = packaged_config(algo)
        assert config["seed_everything"] == 0 and config["data"]["seed"] == 0, algo


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_preset_checkpoints_with_collabs_callback(preset):
    """collab's ModelCheckpoint (last.ckpt at the last step and on SIGTERM, what --ckpt_path resumes from),
    never Lightning's, in every preset that names its callbacks (the others keep their algorithm's)."""
    callbacks = (yaml.safe_load(preset.read_text()).get("trainer") or {}).get("callbacks")
    for config in [preset] if callbacks else []:
        paths = [c["class_path"] for c in callbacks]
        assert "lightning.pytorch.callbacks.ModelCheckpoint" not in paths, config
        ours = [c for c in callbacks if c["class_path"] == "collab.training.callbacks.ModelCheckpoint"]
        assert len(ours) == 1 and ours[0]["init_args"]["save_last"] is True, config


def test_root_dir_takes_the_run_and_a_preset_saves_last(tmp_path, monkeypatch, capsys):
    """From one directory with the root elsewhere: logs, checkpoints and adapters under the root, nothing in
    ./runs; the run uses a preset that named Lightning's checkpoint before (one step on the tiny model, in this
    process)."""
    from collab.fit import main

    cwd, root = tmp_path / "cwd", tmp_path / "elsewhere" / "root"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    code = main(
        [
            "--algo",
            "magrpo",
            "--config",
            str(ROOT / "conf" / "presets" / "magrpo_coding.yaml"),
            "--data.env",
            "matrix",
            "--data.env_options",
            "{}",
            "--data.batch_size",
            "1",
            "--model.agents",
            "null",
            "--model.num_generations",
            "2",
            "--trainer.max_steps",
            "1",
            *TINY,
            "--trainer.default_root_dir",
            str(root),
        ]
    )
    stderr = capsys.readouterr().err
    assert code == 0, stderr[-3000:]
    run = root / "magrpo" / "version_0"
    assert list(run.glob("events.out.tfevents.*")), "no TensorBoard log under the root"
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert (run / "adapters" / "last" / "agent0" / "adapter_config.json").is_file()
    assert json.loads((run / "reward_summary.json").read_text())["rollouts"] == 1
    assert not (cwd / "runs").exists() and not (cwd / "lightning_logs").exists()
    configs = [line for line in stderr.splitlines() if line.startswith("config: ")]
    assert len(configs) == 1, stderr[-2000:]
    assert "base.yaml + env/matrix.yaml + algo/magrpo.yaml + --config" in configs[0], stderr[-2000:]


def trainer_of(*args: str):
    from collab.fit import build_cli

    return build_cli("magrpo", ["--model.base.name", "tiny", "--data.env", "matrix", *args]).trainer


def test_lightning_options_take_effect(tmp_path, monkeypatch):
    from lightning.pytorch.callbacks import ProgressBar

    from collab.training.callbacks import RewardSummary

    monkeypatch.chdir(tmp_path)
    trainer = trainer_of(
        "--trainer.max_steps",
        "3",
        "--trainer.precision",
        "bf16-mixed",
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "1",
        "--trainer.num_nodes",
        "2",
        "--trainer.strategy",
        "ddp",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.default_root_dir",
        "root",
    )
    assert trainer.max_steps == 3 and trainer.precision == "bf16-mixed" and trainer.num_nodes == 2
    assert type(trainer.accelerator).__name__ == "CPUAccelerator" and trainer.num_devices == 1
    assert type(trainer.strategy).__name__ == "DDPStrategy" and trainer.default_root_dir.endswith("root")
    assert not any(isinstance(c, ProgressBar) for c in trainer.callbacks)
    assert trainer.logger.save_dir.endswith("root")  # the packaged logger follows the root
    trainer = trainer_of(
        "--trainer.logger",
        "false",
        "--trainer.callbacks",
        "[{class_path: collab.training.callbacks.RewardSummary, init_args: {window: 2}}]",
        "--trainer.logger",
        "false",
    )
    assert trainer.logger is None and [c.window for c in trainer.callbacks if isinstance(c, RewardSummary)] == [2]
    assert not any(
        type(c).__module__.startswith("collab") and type(c).__name__ == "ModelCheckpoint" for c in trainer.callbacks
    )  # the list was replaced (Lightning adds its own default checkpoint)
    trainer = trainer_of("--trainer.default_root_dir", "root", "--trainer.logger.init_args.save_dir", "logs")
    assert trainer.logger.save_dir == "logs" and trainer.default_root_dir.endswith("root")  # both given: both taken


def test_the_wheel_ships_the_configs(tmp_path):
    """The wheel holds conf/ as package data; unpacked on its own (no source tree, not editable) it runs
    ``--print_config`` from a directory whose ./conf would break the run if it were read."""
    source = tmp_path / "source"  # a copy: the build writes build/ and *.egg-info beside setup.cfg
    for name in ("src", "conf"):
        shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "whl"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
        cwd=tmp_path,
    )
    wheel = next((tmp_path / "whl").glob("collab-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for algo in algo_registry():
        assert f"collab/conf/algo/{algo}.yaml" in names
    assert {f"collab/conf/{p.relative_to(ROOT / 'conf')}" for p in (ROOT / "conf").rglob("*.yaml")} <= set(names)
    installed = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(installed)
    work = tmp_path / "work"
    (work / "conf" / "algo").mkdir(parents=True)
    (work / "conf" / "algo" / "magrpo.yaml").write_text("model: {agent_lr: not a number}\n")  # a decoy ./conf
    env = {**os.environ, "PYTHONPATH": str(installed)}
    result = subprocess.run(
        [sys.executable, "-m", "collab.fit", "--algo", "magrpo", "--print_config"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert yaml.safe_load(result.stdout)["model"]["agent_lr"] == 1e-3
    assert result.stderr.strip().splitlines()[-1] == (
        f"config: {installed / 'collab' / 'conf' / 'base.yaml'}"
        " + env/math.yaml + algo/magrpo.yaml + env/math.yaml algos.magrpo"
    )
