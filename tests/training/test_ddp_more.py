"""The rest of tests/training/test_ddp.py's runs (its module docstring), and a stalled rank: a file of their own so
that the two halves of the multi-process runs go to pytest-xdist's two workers."""

import json
import os
import subprocess
import sys

import pytest

from tests.training.test_ddp import AGENTS, CASES, HALF, ROOT, RUNS, fit, lockstep


@pytest.mark.parametrize("case", CASES[HALF:])
def test_two_processes_train_in_lockstep_and_resume_on_one(case, tmp_path, monkeypatch, one_thread):
    lockstep(case, tmp_path, monkeypatch)


def test_two_machines_of_one_process_each_train_a_step(tmp_path):
    """Several machines as docs/distributed.md starts them, simulated here: the same command on each, with
    ``--trainer.num_nodes 2 --trainer.devices 1`` and the cluster's ``MASTER_ADDR``, ``MASTER_PORT`` and
    ``NODE_RANK`` (0 and 1). The two form one world of two ranks: disjoint shares of the step's tasks, one
    synchronised update (bitwise the same weights after it, moved by rank 0's signal), one checkpoint."""
    extra = ["--trainer.strategy", "ddp", "--trainer.num_nodes", "2", "--trainer.devices", "1"]
    run = fit("magrpo", tmp_path, [*extra, "--trainer.max_steps", "1"], "nodes", COLLAB_DDP_SIGNAL_RANKS="0")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr.count("config: ") == 1
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"] == 1
    assert ranks[0]["digests"] == ranks[1]["digests"] and ranks[0]["start"] != ranks[0]["digests"][0]
    (a, b) = (ranks[0]["tasks"][0], ranks[1]["tasks"][0])
    assert len(a) == len(b) == 2 and not set(a) & set(b)
    assert [c.name for c in (tmp_path / "runs").rglob("*.ckpt")] == ["last.ckpt"]


def test_a_stalled_rank_ends_the_run_at_the_timeout_in_one_line(tmp_path):
    """One rank sleeps before its rollout of step 1 while the other waits in the step's first collective:
    the run ends ``--distributed_timeout`` seconds later (not the default 30 minutes), exit code non-zero,
    with one line naming the waiting rank and the step. Rank 1 stalled: rank 0 reports and stops it; rank 0
    stalled: rank 1 reports and exits, and Lightning's observer stops rank 0. The two runs start together: each
    spends most of its time waiting out the timeout."""
    import re
    import threading
    import time

    timeout = 10
    argv = [
        "--algo",
        "magrpo",
        *RUNS["magrpo"],
        "--model.base.name",
        "tiny",
        "--model.agents",
        AGENTS["magrpo"],
        "--data.batch_size",
        "2",
        "--trainer.max_steps",
        "3",
        "--trainer.accelerator",
        "cpu",
        "--trainer.strategy",
        "ddp",
        "--trainer.devices",
        "2",
        "--trainer.callbacks",
        json.dumps([{"class_path": "tests.support.ddp_probe.Probe"}]),
        "--distributed_timeout",
        str(timeout),
    ]
    runs, ended = {}, {}

    def run(stalled: int) -> None:
        tmp = tmp_path / f"stalled{stalled}"
        tmp.mkdir()
        env = {
            **os.environ,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}",
            "COLLAB_DDP_PROBE": str(tmp),
            "OMP_NUM_THREADS": "1",
            "COLLAB_DDP_STALL": f"{stalled}:1",
            "COLLAB_DDP_STALL_SECONDS": "600",
        }
        command = [sys.executable, "-m", "collab.fit", *argv, "--trainer.default_root_dir", str(tmp / "runs")]
        runs[stalled] = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
        ended[stalled] = time.time()

    threads = [threading.Thread(target=run, args=(stalled,)) for stalled in (1, 0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for stalled in (1, 0):
        out = runs[stalled]
        assert out.returncode != 0, out.stderr[-3000:]
        errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
        waiting = 1 - stalled
        assert len(errors) == 1 and re.match(
            rf"error: rank {waiting} at step 1: a collective did not complete within "
            rf"{timeout} s \(another process stopped or diverged\)",
            errors[0],
        ), out.stderr[-3000:]
        assert "Traceback" not in out.stderr
        # from the stall to the end of every process: the timeout, the report and the stopping of the other rank
        waited = ended[stalled] - float((tmp_path / f"stalled{stalled}" / f"stall{stalled}.txt").read_text())
        print(f"stalled rank {stalled}: ended {waited:.1f} s after the stall began (timeout {timeout} s)")
        assert timeout <= waited < timeout + 60
