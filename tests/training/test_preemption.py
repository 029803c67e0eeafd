"""SIGTERM inside a step: honoured within 30 s wherever the run is, in one line, exit 143.

``collab.fit`` runs as a command (MAGRPO, math, the tiny model, 6-token answers) with the test hook of
:mod:`collab.preemption`: ``COLLAB_SIGTERM_AT=<phase>@<n>`` sends SIGTERM to the launching
process (rank 0) at the first check point inside the n-th evaluation, rollout or update, and writes the
time it sent it; ``COLLAB_SIGTERM_GRACE=0`` stops at that check point (the default grace lets a step end,
which ``tests/training/test_signals.py`` covers). Each run must end with 143 within 30 s of the signal,
with the one line and no traceback, write nothing of the stopped step (only the step before's ``last.ckpt``
where that step's end wrote none), leave no process behind (the second rank under DDP), and its last checkpoint
must load and (1 process) resume to the end. One launch per case: 1 process for the evaluation and the update, 2
gloo processes for the same two, and the rollout in this process (``collab.fit.main(argv)``, as a notebook calls
it).
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from collab import preemption
from collab.errors import UserError
from collab.preemption import state
from tests.support import warm

ROOT = Path(__file__).resolve().parents[2]
RARELY = 100
"""``every_n_train_steps`` of the runs whose step-end checkpoints come only from a stop
(``collab.training.resume.Snapshot``)."""


def callbacks(every: int = 1) -> str:
    return json.dumps(
        [
            {
                "class_path": "collab.training.callbacks.ModelCheckpoint",
                "init_args": {"save_last": True, "every_n_train_steps": every},
            },
            {"class_path": "collab.training.callbacks.AdapterCheckpoint"},
            {"class_path": "collab.training.callbacks.RewardSummary"},
            {
                "class_path": "collab.training.callbacks.EvaluationCallback",
                "init_args": {
                    "at_start": True,
                    "at_end": False,
                    "num_samples": 2,
                    "ks": [1],
                    "seed": 7,
                    "max_tasks": 3,
                    "tasks_per_batch": 1,
                },
            },
        ]
    )


ARGS = [
    "--algo",
    "magrpo",
    "--data.env",
    "math",
    "--data.env_options",
    "{dataset: addition, profile: solo}",
    "--model.base.name",
    "tiny",
    "--model.agents",
    json.dumps([{"sampling": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 6}}]),
    "--data.batch_size",
    "4",
    "--trainer.accelerator",
    "cpu",
    "--trainer.enable_model_summary",
    "false",
]
LINE = re.compile(
    r"stopped by SIGTERM (.*?); (no checkpoint yet|last checkpoint: step (\d+) (\S+) "
    r"\(resume with --ckpt_path (\S+)\))$"
)


def left_behind(folder: Path) -> list[int]:
    """Processes working in ``folder`` (a run's ranks)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if Path(os.readlink(proc / "cwd")) == folder:
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


def stop_at(
    tmp: Path, at: str, devices: int, steps: int = 4, grace: str = "0", every: int = 1, strategy: str = "ddp"
) -> tuple[str, float, Path]:
    """Run until the hook's SIGTERM at ``at`` (checkpoints every ``every`` steps; 2 processes under ``strategy``);
    the run's line, the seconds from the signal to the exit and its folder."""
    sent = tmp / "sent"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "OMP_NUM_THREADS": "1",
        "COLLAB_SIGTERM_AT": at,
        "COLLAB_SIGTERM_FILE": str(sent),
        "COLLAB_SIGTERM_GRACE": grace,
    }
    ddp = ["--trainer.strategy", strategy, "--trainer.devices", "2"] if devices == 2 else []
    argv = [*ARGS, *ddp, "--trainer.callbacks", callbacks(every), "--trainer.max_steps", str(steps)]
    argv += ["--trainer.logger.init_args.save_dir", str(tmp / "runs")]
    if devices == 1:  # forked warm (tests/support/warm.py); 2 processes start as a user's command starts them
        child = warm.server().start(argv, tmp, env, timeout=400)
        code, err = child.wait(400), child.stderr.read_text()
    else:
        proc = subprocess.Popen(
            [sys.executable, "-m", "collab.fit", *argv],
            cwd=tmp,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            err = proc.communicate(timeout=400)[1]
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"no stop: {proc.communicate()[1][-3000:]}")
        code = proc.returncode
    ended = time.time()
    assert sent.exists(), f"the hook never fired: rc {code}\n{err[-3000:]}"
    seconds = ended - float(sent.read_text())
    assert code == preemption.SIGTERM_EXIT_CODE, err[-3000:]
    assert "Traceback" not in err and "Error" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if "SIGTERM" in line]
    assert len(lines) == 1 and (grace != "0" or LINE.fullmatch(lines[0])), err[-3000:]
    deadline = time.monotonic() + 5
    while left_behind(tmp) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left_behind(tmp)
    print(f"{at} at {devices} process(es): exit {seconds:.2f} s after the signal")
    assert seconds < 30
    run = tmp / "runs" / "magrpo" / "version_0"
    written = [
        p
        for p in run.rglob("*")
        if p.is_file() and p.suffix in (".ckpt", ".safetensors") and p.stat().st_mtime > float(sent.read_text())
    ]
    if grace == "0":  # nothing saved of the stopped step; the step before's checkpoint when its end wrote none
        before = int(LINE.fullmatch(lines[0]).group(3) or 0)
        assert [p.name for p in written] == (["last.ckpt"] if every > 1 and before > 0 else []), written
        for p in written:
            assert torch.load(p, map_location="cpu", weights_only=True)["global_step"] == before
    return lines[0], seconds, run


def resumes(tmp: Path, line: str, step: int, monkeypatch, every: int = 1) -> None:
    """The line names the checkpoint of ``step``, which resumes to the end (in this process)."""
    from collab.fit import main

    match = LINE.fullmatch(line)
    assert match and int(match.group(3)) == step and match.group(4) == match.group(5)
    ckpt = Path(match.group(4))
    assert torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"] == step
    monkeypatch.chdir(tmp)
    root = tmp / "resumed"
    assert (
        main(
            [
                *ARGS,
                "--trainer.callbacks",
                callbacks(every),
                "--trainer.max_steps",
                str(step + 1),
                "--trainer.enable_progress_bar",
                "false",
                "--trainer.logger.init_args.save_dir",
                str(root),
                "--ckpt_path",
                str(ckpt),
            ]
        )
        == 0
    )
    last = torch.load(
        root / "magrpo" / "version_0" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True
    )
    assert last["global_step"] == step + 1


@pytest.mark.parametrize("devices", [1, 2])
def test_sigterm_inside_the_first_evaluation(devices, tmp_path, one_thread):
    line, seconds, run = stop_at(tmp_path, "evaluation", devices)
    assert line == "stopped by SIGTERM inside the evaluation at step 0; no checkpoint yet"
    assert not list(run.rglob("*.ckpt"))


def same_state(a, b, where: str = "") -> None:
    """Two checkpoint parts equal, tensors bitwise."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), where
        for key in a:
            same_state(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def test_sigterm_inside_a_rollout_in_this_process(tmp_path, monkeypatch, capsys, one_thread):
    """``collab.fit.main(argv)`` called in a process that goes on (a notebook): SystemExit(143) with the line,
    the signal handler and the watchdog gone afterwards (the process is not ended 20 s later). No step end
    wrote a checkpoint (every 100 steps): the stop inside step 2 writes step 1's from its snapshot, the
    checkpoint a run of one step writes at its end, which resumes."""
    from collab.fit import main

    sent, handler = tmp_path / "sent", signal.getsignal(signal.SIGTERM)
    for key, value in {
        "COLLAB_SIGTERM_AT": "rollout@2",
        "COLLAB_SIGTERM_FILE": str(sent),
        "COLLAB_SIGTERM_GRACE": "0",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    runs = ["--trainer.logger.init_args.save_dir", str(tmp_path / "runs")]
    with pytest.raises(SystemExit) as stop:
        main([*ARGS, "--trainer.callbacks", callbacks(RARELY), "--trainer.max_steps", "4", *runs])
    seconds = time.time() - float(sent.read_text())
    with capsys.disabled():
        print(f"rollout@2 in this process: SystemExit {seconds:.2f} s after the signal")
    assert stop.value.code == 143 and seconds < 30
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "SIGTERM" in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0].startswith("stopped by SIGTERM inside the rollout of step 2; last checkpoint: step 1 ")
    assert signal.getsignal(signal.SIGTERM) == handler and not preemption.received()
    for timer in [t for t in threading.enumerate() if isinstance(t, threading.Timer)]:
        timer.join(timeout=2)
        assert not timer.is_alive()  # the watchdog was cancelled
    for key in ("COLLAB_SIGTERM_AT", "COLLAB_SIGTERM_FILE", "COLLAB_SIGTERM_GRACE"):
        monkeypatch.delenv(key)
    one = tmp_path / "one"
    assert (
        main(
            [
                *ARGS,
                "--trainer.callbacks",
                callbacks(),
                "--trainer.max_steps",
                "1",
                "--trainer.logger.init_args.save_dir",
                str(one),
            ]
        )
        == 0
    )
    snapshot = torch.load(LINE.fullmatch(lines[0]).group(4), map_location="cpu", weights_only=True)
    ended = torch.load(
        one / "magrpo" / "version_0" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True
    )
    for key in (
        "global_step",
        "epoch",
        "state_dict",
        "optimizer_states",
        "lr_schedulers",
        "collab",
        "loops",
        "RolloutDataModule",
    ):
        same_state(snapshot[key], ended[key], key)
    rewards = [v for k, v in snapshot["callbacks"].items() if k.startswith("RewardSummary")]
    assert rewards == [v for k, v in ended["callbacks"].items() if k.startswith("RewardSummary")] and rewards
    resumes(tmp_path, lines[0], 1, monkeypatch, RARELY)


@pytest.mark.parametrize("devices", [1, 2])
def test_sigterm_inside_an_update(devices, tmp_path, monkeypatch, one_thread):
    """1 process: step 2's end wrote a checkpoint. 2 processes: none did (every 100 steps); rank 0 writes step 2's
    from its snapshot (every rank's random state and task stream, gathered at the step's end)."""
    every = 1 if devices == 1 else RARELY
    line, seconds, run = stop_at(tmp_path, "update@3", devices, every=every)
    assert line.startswith("stopped by SIGTERM inside the update of step 3; last checkpoint: step 2 ")
    summary = json.loads((run / "reward_summary.json").read_text())
    assert summary["rollouts"] == 2  # the completed rollouts
    if devices == 1:
        resumes(tmp_path, line, 2, monkeypatch)
    else:  # a step-end checkpoint of 2 processes (resuming one at any world size: tests/training/test_ddp_resume.py)
        saved = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        assert saved["global_step"] == 2 and len(saved["collab"]["rng"]) == 2
        assert len(saved["RolloutDataModule"]["streams"]) == 2


def test_sigterm_inside_an_update_of_sharded_processes(tmp_path, monkeypatch, one_thread):
    """2 processes under fsdp (FSDP2: a forward or backward of the sharded base is a collective): rank 0 stops inside
    the update of step 3, where rank 1 may wait on it in one of them; no step end wrote a checkpoint (every 100
    steps), so rank 0 alone writes step 2's from its snapshot (the weights and AdamW's moments gathered whole at
    the step's end, every rank's random state), which resumes."""
    line, seconds, run = stop_at(tmp_path, "update@3", 2, every=RARELY, strategy="fsdp")
    assert line.startswith("stopped by SIGTERM inside the update of step 3; last checkpoint: step 2 ")
    saved = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert len(saved["collab"]["rng"]) == 2 and saved["state_dict"]
    resumes(tmp_path, line, 2, monkeypatch, RARELY)


# -- the module alone ----------------------------------------------------------------------------------
def test_grace_lets_a_step_end_and_a_new_step_does_not_start(monkeypatch):
    """The grace, the evaluation before training without one, no new step, and the hook's spelling."""
    monkeypatch.setattr(state, "_state", state._State(grace=5.0))
    with preemption.phase("rollout"):
        preemption.check()  # no signal: nothing
        state._state.received_at = time.monotonic()
        preemption.check()  # within the grace: the step goes on
        state._state.received_at -= 5.0
        with pytest.raises(preemption.Preempted) as stop:
            preemption.check()
    assert (stop.value.phase, stop.value.code) == ("rollout", 143)
    state._state.received_at = time.monotonic()
    with preemption.phase("evaluation"), pytest.raises(preemption.Preempted):
        preemption.check()  # the evaluation before the first step has nothing to reach: no grace
    state._state.steps = 1
    with preemption.phase("evaluation"):
        preemption.check()  # a periodic evaluation: its step's checkpoint comes after it, within the grace
    with pytest.raises(preemption.Preempted):
        preemption.check_step()
    with pytest.raises(UserError, match="COLLAB_SIGTERM_AT"):
        preemption._hook("decode@0")
    assert preemption._hook("update@3") == ("update", 3)


def test_a_process_blocked_in_c_exits_by_the_watchdog(tmp_path):
    """The main thread waits in C (a store's wait, as in a gloo collective) where Python runs no signal
    handler: the wakeup-fd reader notices the signal and the watchdog ends the process with 143 and the line."""
    child = (
        "import signal, time, datetime, torch.distributed as dist\n"
        "from collab.preemption import state, watchdog\n"
        "state._state = state._State(hard_exit=1.0)\n"
        "signal.signal(signal.SIGTERM, lambda *a: watchdog.notice())\n"
        "watchdog._watch(state._state)\n"
        "store = dist.TCPStore('127.0.0.1', 0, 1, True, timeout=datetime.timedelta(seconds=60))\n"
        "print('ready', flush=True)\n"
        "store.wait(['never'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-c", child], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)  # inside store.wait
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err[-2000:]
    assert time.monotonic() - sent < 10
    assert err.strip().startswith("stopped by SIGTERM at step 0 (forced: no orderly stop 1 s after the signal)"), err


@pytest.mark.parametrize("noticed", [True, False])
def test_lightnings_child_observer_stands_down_once_the_signal_is_noticed(noticed, tmp_path):
    """Rank 0 forwards the SIGTERM and its children end with a non-zero status on purpose; Lightning's
    child-process observer (it looks every few seconds) would SIGKILL rank 0 on seeing that, so a stopped
    DDP run ended with -9 instead of 143 whenever it looked before rank 0 exited. Once rank 0 notices the
    signal the observer stands down; without a notice it still kills (the control: it is armed here)."""
    child = (
        "import os, subprocess, sys, time, weakref\n"
        "from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver\n"
        "from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher\n"
        "from collab.preemption import state, watchdog\n"
        "rank1 = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "launcher = _SubprocessScriptLauncher(None, 2, 1)\n"
        "launcher.procs = [rank1]\n"
        "class Trainer: strategy = type('Strategy', (), {'launcher': launcher})\n"
        "trainer = Trainer()\n"
        "state._state = state._State(hard_exit=60.0, trainer=weakref.ref(trainer))\n"
        "_ChildProcessObserver(os.getpid(), launcher.procs, sleep_period=0.1).start()\n"
        f"if {noticed}:\n"
        "    watchdog.notice()  # forwards SIGTERM to rank1\n"
        "else:\n"
        "    launcher.kill(15)\n"
        "rank1.wait()\n"
        "time.sleep(1.0)  # ten of the observer's looks\n"
        "os._exit(0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", child], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == (0 if noticed else -signal.SIGKILL), proc.stderr[-2000:]


def test_two_processes_stop_together_at_the_step_end_within_the_grace(tmp_path, one_thread):
    """With the default grace the update goes on and the step ends (the tiny model's takes a second): both
    ranks agree at its end and save it together (each rank's random state in ``last.ckpt``)."""
    line, seconds, run = stop_at(tmp_path, "update@3", 2, grace="")
    ckpt = run / "checkpoints" / "last.ckpt"
    assert line == f"stopped by SIGTERM at step 3; saved {ckpt} (resume with --ckpt_path {ckpt})"
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert saved["global_step"] == 3 and saved["collab"]["rollouts"] == 3 and len(saved["collab"]["rng"]) == 2
