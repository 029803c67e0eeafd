"""Multi-process training (issue 15): 2 CPU processes on gloo through Lightning's DDP, every algorithm.

Each run checks that the ranks played disjoint shares of every step's tasks, that after every
optimizer step both ranks hold bitwise the same trainable weights (one gradient synchronisation per
step, the same number of steps and backward passes on each rank: ``collab.distributed``), that the
run ends cleanly with one checkpoint, and that the checkpoint resumes on one process.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# algo -> the env and options of a fast run on the tiny model
RUNS = {
    "magrpo": ["--data.env", "math", "--data.env_options", "{dataset: addition, profile: solo}"],
    "collm_cc": ["--data.env", "math", "--data.env_options", "{dataset: addition, profile: duo}"],
    "collm_dc": ["--data.env", "math", "--data.env_options", "{dataset: addition, profile: duo}"],
    "ippo": ["--data.env", "math", "--data.env_options", "{dataset: addition, profile: duo}"],
    "marft_a": ["--data.env", "math", "--data.env_options", "{dataset: addition, profile: duo}"],
    "marft_t": ["--data.env", "math", "--data.env_options", "{dataset: addition, profile: duo}"],
    "maporl": ["--data.env", "debate", "--data.env_options", "{dataset: addition, agents: 2}", "--data.num_turns", "2"],
}


# checkpoints and the probe only (no held-out evaluation: the defaults' evaluation would dominate the time)
CALLBACKS = json.dumps([{"class_path": "collab.callbacks.ModelCheckpoint", "init_args": {"save_last": True}},
                        {"class_path": "tests.ddp_probe.Probe"}])


def fit(algo: str, tmp: Path, extra: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "collab.fit", "--algo", algo, *RUNS[algo], "--model.base.name", "tiny",
           "--model.agents", "null", "--model.max_new_tokens", "6", "--data.batch_size", "4",
           "--trainer.logger.init_args.save_dir", str(tmp / "runs"), *extra]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}", "COLLAB_DDP_PROBE": str(tmp),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("algo", sorted(RUNS))
def test_two_processes_train_in_lockstep_and_resume_on_one(algo, tmp_path):
    run = fit(algo, tmp_path, ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu",
                               "--trainer.max_steps", "2", "--trainer.callbacks", CALLBACKS])
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"] == 2
    # bitwise the same weights on both ranks after every optimizer step
    assert ranks[0]["digests"] == ranks[1]["digests"] and len(ranks[0]["digests"]) >= 1
    # disjoint shares of every step's tasks (2 of the global 4 each)
    for a, b in zip(ranks[0]["tasks"], ranks[1]["tasks"]):
        assert len(a) == len(b) == 2 and not set(a) & set(b)
    ckpts = list((tmp_path / "runs").rglob("*.ckpt"))
    assert [c.name for c in ckpts] == ["last.ckpt"], ckpts
    resumed = fit(algo, tmp_path, ["--trainer.accelerator", "cpu", "--trainer.max_steps", "3", "--trainer.callbacks",
                                   CALLBACKS, "--ckpt_path", str(ckpts[0])])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
