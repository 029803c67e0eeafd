"""What every entry point (``collab.fit``, ``collab.evaluate``, ``collab.compare``, ``collab.export``) shares:
``--help`` prints its usage and its own options, and nothing else, with exit code 0; a file the user names that
is not UTF-8 ends in one ``error:`` line naming the file, exit code 2 (the other bad inputs:
test_bad_input.py, tests/evaluation/test_compare.py, test_export.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOT_UTF8 = b"model:\n  agent_lr: 1\xe9\n"
"""A config whose byte 20 is Latin-1's e-acute: not UTF-8."""

HELP = {
    "collab.fit": [
        "--algo NAME",
        "--explain",
        "--print_config",
        "--config",
        "--ckpt_path",
        "--seed_everything",
        "--model.agent_lr",
        "--data.env",
        "--trainer.max_steps",
    ],
    "collab.evaluate": [
        "--algo NAME",
        "--num_samples",
        "--k",
        "--adapters",
        "--ckpt_path",
        "--split",
        "--max_tasks",
        "--tasks_per_batch",
        "--output",
        "--baseline",
        "--table",
        "python -m collab.fit --help",
    ],
    "collab.compare": [
        "--algos",
        "--defaults",
        "--rollouts",
        "--tokens",
        "--envs",
        "--seeds",
        "--controls",
        "--eval_samples",
        "--max_runs",
        "--jobs",
        "--restore",
        "python -m collab.fit --help",
    ],
    "collab.export": ["run_dir", "out", "--adapters", "--merge", "--base-id", "--algo"],
}


@pytest.mark.parametrize("module", sorted(HELP))
def test_help_is_the_usage_and_the_options_alone(module, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == ""
    assert result.stdout.startswith(f"usage: python -m {module} "), result.stdout[:500]
    missing = [option for option in HELP[module] if option not in result.stdout]
    assert not missing, f"{module} --help does not list {missing}"
    assert list(tmp_path.iterdir()) == []  # nothing run, nothing written


def _one_line(capsys, code: int, *words: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and all(w in lines[0] for w in words), lines[0]
    return lines[0]


@pytest.mark.parametrize("module", ["collab.fit", "collab.evaluate"])
def test_a_config_that_is_not_utf8_is_one_line(module, tmp_path, capsys):
    import importlib

    (tmp_path / "bad.yaml").write_bytes(NOT_UTF8)
    code = importlib.import_module(module).main(
        ["--algo", "magrpo", "--model.base.name", "tiny", "--config", str(tmp_path / "bad.yaml")]
    )
    _one_line(capsys, code, f"--config {tmp_path / 'bad.yaml'}: not UTF-8 text (byte 20)")


def test_compare_passes_a_config_that_is_not_utf8_to_fit_and_stops_in_one_line(tmp_path, capsys):
    from collab.compare import main

    (tmp_path / "bad.yaml").write_bytes(NOT_UTF8)
    out = tmp_path / "out"
    code = main(
        [
            "--algos",
            "magrpo",
            "--envs",
            "matrix",
            "--rollouts",
            "1",
            "--controls",
            "grpo",
            "--output",
            str(out),
            "--model.base.name",
            "tiny",
            "--config",
            str(tmp_path / "bad.yaml"),
        ]
    )
    _one_line(capsys, code, f"--config {tmp_path / 'bad.yaml'}: not UTF-8 text (byte 20)")
    assert not out.exists()


def _run_folder(root: Path, config: bytes, adapter_config: bytes) -> Path:
    """A run folder as far as collab.export reads it before loading anything: config.yaml and one agent's adapter."""
    run = root / "run"
    (run / "adapters" / "last" / "agent0").mkdir(parents=True)
    (run / "config.yaml").write_bytes(config)
    (run / "adapters" / "last" / "agent0" / "adapter_model.safetensors").write_bytes(b"")
    (run / "adapters" / "last" / "agent0" / "adapter_config.json").write_bytes(adapter_config)
    return run


@pytest.mark.parametrize("broken", ["config.yaml", "adapter_config.json", "adapter_config.json missing"])
def test_export_of_a_run_whose_files_are_not_utf8_is_one_line(broken, tmp_path, capsys):
    from collab.export import main

    run = _run_folder(
        tmp_path,
        NOT_UTF8 if broken == "config.yaml" else b"model: {}\n",
        b'{"r": 8, "lora_alpha": 1\xe9}' if broken == "adapter_config.json" else b'{"r": 8}',
    )
    adapter = run / "adapters" / "last" / "agent0" / "adapter_config.json"
    if broken.endswith("missing"):
        adapter.unlink()
    code = main([str(run), str(tmp_path / "out")])
    if broken == "config.yaml":
        _one_line(capsys, code, f"the run's config {run / 'config.yaml'}: not UTF-8 text (byte 20)")
    elif broken == "adapter_config.json":
        _one_line(capsys, code, f"{adapter}: not UTF-8 text (byte 24); adapter_config.json is JSON in UTF-8")
    else:
        _one_line(capsys, code, f"{adapter}: cannot be read (No such file or directory)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing written
