"""Interrupting ``python -m collab.fit``, on a real child process with the tiny model.

The child is ``collab.fit`` run as ``__main__`` after a global optimizer pre-step hook that, at the
``AT``-th optimizer step (0-based), creates a marker file and sleeps ``PAUSE`` seconds: the test
signals the child while it is inside that update.

- SIGTERM: the run finishes the rollout, saves ``last.ckpt`` at that step, ``adapters/last`` and
  ``reward_summary.json``, and exits with 143; resuming from it repeats the uninterrupted run;
- SIGKILL: the checkpoint of step 5 loads (``weights_only``), the TensorBoard events parse, the
  summary is valid json, and the run resumes from the checkpoint.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support import adapters, assert_same_tensors, fit, load

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "--data.env",
    "matrix",
    "--model.base.name",
    "tiny",
    "--trainer.accelerator",
    "cpu",
    "--trainer.enable_model_summary",
    "false",
]

CHILD = r"""
import os, runpy, sys, time
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

torch.set_num_threads(1)
marker, at, pause = os.environ["MARKER"], int(os.environ["AT"]), float(os.environ["PAUSE"])
steps = [0]

def pause_inside_update(optimizer, args, kwargs):
    if steps[0] == at:
        open(marker, "w").close()
        time.sleep(pause)
    steps[0] += 1

register_optimizer_step_pre_hook(pause_inside_update)
sys.argv = ["collab.fit", *sys.argv[1:]]
runpy.run_module("collab.fit", run_name="__main__", alter_sys=True)
"""

pytestmark = pytest.mark.usefixtures("one_thread")


def start(tmp_path: Path, at: int, pause: float, steps: int = 50) -> tuple[subprocess.Popen, Path]:
    marker = tmp_path / "inside_update"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "MARKER": str(marker),
        "AT": str(at),
        "PAUSE": str(pause),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, "--algo", "magrpo", *ARGS, "--trainer.max_steps", str(steps)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the child never reached update {at}: rc {proc.returncode}\n{err[-3000:]}")
        time.sleep(0.05)
    return proc, tmp_path / "runs" / "magrpo" / "version_0"


def test_sigterm_mid_update_saves_the_step_and_exits_143(tmp_path, monkeypatch):
    proc, run = start(tmp_path, at=2, pause=2.0)  # inside the third update
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "stopped by SIGTERM at step 3" in err, err[-3000:]

    ckpt = load(run)  # last.ckpt at the step the run stopped at (the periodic save is every 5)
    assert ckpt["global_step"] == 3 and ckpt["collab"]["rollouts"] == 3
    summary = json.loads((run / "reward_summary.json").read_text())
    assert summary["rollouts"] == 3 and summary["rewards"] == ckpt["callbacks"]["RewardSummary"]["rewards"]
    saved = adapters(run)  # adapters/last: the checkpoint's adapters
    for agent, tensors in saved.items():
        for key, value in tensors.items():
            name = key.removesuffix(".weight") + f".{agent}.weight"
            [match] = [v for k, v in ckpt["state_dict"].items() if k.endswith(name)]
            assert torch.equal(value, match), (agent, key)

    # ... and resuming from it repeats the uninterrupted run
    monkeypatch.chdir(tmp_path)
    args = ["--data.env", "matrix"]
    resumed = fit(tmp_path / "runs", "magrpo", args, 4, run / "checkpoints" / "last.ckpt")
    straight = fit(tmp_path / "straight", "magrpo", args, 4)
    assert_same_tensors(load(straight)["state_dict"], load(resumed)["state_dict"], "state_dict")
    assert (
        json.loads((resumed / "reward_summary.json").read_text())["rewards"]
        == json.loads((straight / "reward_summary.json").read_text())["rewards"]
    )


def test_sigkill_mid_update_leaves_a_loadable_run(tmp_path, monkeypatch):
    from collab.evaluation.analysis import read_scalars

    proc, run = start(tmp_path, at=5, pause=120.0)  # inside the sixth update, after the step-5 checkpoint
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    ckpt = load(run)  # weights_only: the checkpoint is whole and holds plain tensors and values
    assert ckpt["global_step"] == 5
    scalars = read_scalars(run)
    assert len(scalars["reward/return"]) >= 5
    summary = json.loads((run / "reward_summary.json").read_text())  # whole: written, then renamed
    assert summary["rollouts"] == 5 and summary["rewards"] == ckpt["callbacks"]["RewardSummary"]["rewards"]
    assert [p.name for p in run.iterdir() if p.name.endswith(".tmp")] == []

    monkeypatch.chdir(tmp_path)
    resumed = fit(tmp_path / "runs", "magrpo", ["--data.env", "matrix"], 6, run / "checkpoints" / "last.ckpt")
    assert load(resumed)["global_step"] == 6
    continued = json.loads((resumed / "reward_summary.json").read_text())
    assert continued["rollouts"] == 6 and continued["rewards"][:5] == summary["rewards"]
