"""Resume across world sizes: a checkpoint of 2 processes resumes on 1, one of 1 on 2.

Each direction runs the uninterrupted run and the resumed one on the same tasks (the probe of
``tests/support/ddp_probe.py``, every rank rewarded):

- 2 -> 1 (MARFT-A, its critic): 2 processes train 3 steps, keeping the step-2 checkpoint and capturing
  the step-3 rollouts of both ranks and their synchronised gradient; 1 process resumes from step 2 and
  is fed those rollouts at its first step. 2 processes resume from step 2 too: bitwise the run that did
  not stop (each rank's random state is in the checkpoint).
- 1 -> 2 (MAPoRL, its value heads): 1 process trains 2 steps; 2 processes resume from its checkpoint and
  capture their step-3 rollouts and gradient; 1 process trains 3 steps straight (its steps 1-2 bitwise
  the first run's), fed the 2 processes' rollouts at step 3.

After the load, every rank holds bitwise the checkpoint's adapters, critic / value heads, AdamW moments
and task position, and the random state of its own rank when the checkpoint has one (a new rank
starts a stream of its own, as at a fresh start); the step-3 tasks of the resumed run are the
uninterrupted run's (sharded by rank); and the first gradient after the resume equals the
uninterrupted run's to a relative 1e-5 of each tensor's largest entry (above a floor of 1e-5 of the
largest entry of all). Every forward holds one row at
both world sizes (``micro_batch_tokens`` 1), so the only difference is the order of the float32 sum
over the rows (two per rank, then the ranks, against four in a row). What differs otherwise (the
sampled responses of a resumed run on another number of processes): docs/resume.md.
"""

import hashlib
import json
from pathlib import Path

import torch

from tests.support import assert_same_tensors, warm

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "COLLAB_DDP_PROBE",
    "COLLAB_DDP_SIGNAL_RANKS",
    "COLLAB_DDP_CAPTURE",
    "COLLAB_DDP_CAPTURE_ROLLOUT",
    "COLLAB_DDP_REPLAY",
    "COLLAB_DDP_REPLAY_ROLLOUT",
    "COLLAB_DDP_LOADED",
)

RUNS = {  # one update per rollout (num_epochs 1, minibatch null in both configs): steps = rollouts
    "marft_a": ["--data.env", "math", "--data.env_options", "{dataset: addition, profile: duo}"],
    "maporl": [
        "--data.env",
        "debate",
        "--data.env_options",
        "{dataset: addition, agents: 2}",
        "--data.num_turns",
        "2",
        "--model.per_turn",
        "false",
        "--model.train_from_turn",
        "1",
    ],  # one adapter per agent, every turn trained
}
CALLBACKS = json.dumps(
    [  # the step-2 checkpoint is kept (step=2.ckpt) beside last.ckpt
        {
            "class_path": "collab.training.callbacks.ModelCheckpoint",
            "init_args": {"save_last": True, "every_n_train_steps": 2, "save_top_k": -1},
        },
        {"class_path": "tests.support.ddp_probe.Probe"},
    ]
)
TWO = ["--trainer.strategy", "ddp", "--trainer.devices", "2"]
TOLERANCE = 1e-5


def args(algo: str, tmp: Path, steps: int, extra: list[str]) -> list[str]:
    return [
        "--algo",
        algo,
        *RUNS[algo],
        "--model.base.name",
        "tiny",
        "--model.agents",
        json.dumps([{"sampling": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 6}}] * 2),
        "--model.micro_batch_tokens",
        "1",
        "--data.batch_size",
        "4",
        "--trainer.max_steps",
        str(steps),
        "--trainer.accelerator",
        "cpu",
        "--trainer.logger.init_args.save_dir",
        str(tmp / "runs"),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.callbacks",
        CALLBACKS,
        *extra,
    ]


def start_two(algo: str, tmp: Path, steps: int, extra: list[str], **probe: str) -> list[warm.Child]:
    """A 2-process run started (forked warm, as Lightning's launcher starts its children: tests/support/warm.py);
    :func:`wait` ends it."""
    tmp.mkdir()
    env = {k: v for k, v in warm.child_env().items() if k not in PROBE}
    env.update({"OMP_NUM_THREADS": "1", "COLLAB_DDP_PROBE": str(tmp), "COLLAB_DDP_SIGNAL_RANKS": "0,1", **probe})
    return warm.start_ranks(args(algo, tmp, steps, [*TWO, *extra]), tmp, env)


def wait(run: list[warm.Child], tmp: Path) -> Path:
    """The run to its end, which must be a clean one; its folder ``tmp``."""
    result = warm.finish(run)
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp


def fit_two(algo: str, tmp: Path, steps: int, extra: list[str], **probe: str) -> None:
    """A 2-process run, to its end."""
    wait(start_two(algo, tmp, steps, extra, **probe), tmp)


def fit_one(algo: str, tmp: Path, steps: int, extra: list[str], monkeypatch, **probe: str) -> None:
    """A 1-process run in this process."""
    from collab.fit import main

    tmp.mkdir()
    for key in PROBE:
        monkeypatch.delenv(key, raising=False)
    for key, value in {"COLLAB_DDP_PROBE": str(tmp), "COLLAB_DDP_SIGNAL_RANKS": "0", **probe}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp)
    assert main(args(algo, tmp, steps, extra)) == 0


def ranks(tmp: Path, n: int) -> list[dict]:
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(n)]


def checkpoint(tmp: Path, name: str) -> tuple[Path, dict]:
    (path,) = (tmp / "runs").rglob(name)
    return path, torch.load(path, map_location="cpu", weights_only=True)


def assert_loaded(tmp: Path, world: int, ckpt: dict) -> None:
    """Every rank holds bitwise the checkpoint's weights, AdamW state and task position, and the random
    state of its rank (none for a rank the checkpoint had no process for)."""
    streams, rngs = ckpt["RolloutDataModule"]["streams"], ckpt["collab"]["rng"]
    assert all(s == streams[0] for s in streams)  # the task stream is global: the same on every process
    for rank in range(world):
        loaded = torch.load(tmp / f"loaded{rank}.pt", weights_only=False)
        assert loaded["params"].keys() == ckpt["state_dict"].keys()
        assert any("critic" in k or "value" in k for k in loaded["params"])  # the critic / value heads are there
        assert_same_tensors(loaded["params"], ckpt["state_dict"], f"rank {rank} weights")
        assert_same_tensors(loaded["optimizer"], ckpt["optimizer_states"][0], f"rank {rank} AdamW")
        assert loaded["optimizer"]["state"] and all("exp_avg_sq" in s for s in loaded["optimizer"]["state"].values())
        assert_same_tensors(loaded["stream"], streams[0], f"rank {rank} task stream")
        if rank < len(rngs):
            assert_same_tensors(loaded["rng"], rngs[rank], f"rank {rank} random state")
        else:
            assert loaded["rng"] is None


def sampling(rng: dict) -> str:
    """The probe's digest of a torch random state."""
    return hashlib.sha256(rng["torch"].numpy().tobytes()).hexdigest()


def assert_same_gradient(resumed: dict, straight: dict) -> float:
    """Equal to a relative ``TOLERANCE`` of each tensor's largest entry, above a floor of ``TOLERANCE`` of the largest
    entry of all: a tensor whose terms nearly cancel (a LoRA A of layer 0, 1.4e-5 of its own largest entry in the
    other sum order) keeps their rounding. Returns the largest difference relative to the tensor's entry."""
    assert sorted(resumed) == sorted(straight) and resumed
    assert sum(float(g.abs().sum()) for g in straight.values()) > 0
    floor = TOLERANCE * max(float(g.abs().max()) for g in straight.values())
    worst = 0.0
    for name, g in straight.items():
        scale = float(g.abs().max())
        diff = float((resumed[name] - g).abs().max())
        assert diff <= TOLERANCE * scale + floor, (name, diff, scale, floor)
        worst = max(worst, diff / max(scale, 1e-30))
    return worst


def test_two_processes_resume_on_one(tmp_path, monkeypatch, one_thread):
    two, one = tmp_path / "two", tmp_path / "one"
    fit_two("marft_a", two, 3, [], COLLAB_DDP_CAPTURE="1", COLLAB_DDP_CAPTURE_ROLLOUT="3")
    path, ckpt = checkpoint(two, "*step=2.ckpt")
    assert ckpt["global_step"] == 2 and len(ckpt["collab"]["rng"]) == 2
    # on 2 processes again (checked below), started now: its ranks wait on each other while this process runs
    again = tmp_path / "again"
    run_again = start_two("marft_a", again, 3, ["--ckpt_path", str(path)])
    fit_one(
        "marft_a",
        one,
        3,
        ["--ckpt_path", str(path)],
        monkeypatch,
        COLLAB_DDP_REPLAY=str(two),
        COLLAB_DDP_CAPTURE="1",
        COLLAB_DDP_LOADED="1",
    )
    assert_loaded(one, 1, ckpt)
    (resumed,), straight = ranks(one, 1), ranks(two, 2)
    assert resumed["step"] == straight[0]["step"] == straight[1]["step"] == 3
    # the data position: the resumed step's tasks are the straight run's step-3 tasks, rank r's every 2nd from r
    assert [resumed["tasks"][0][r::2] for r in (0, 1)] == [straight[r]["tasks"][2] for r in (0, 1)]
    assert resumed["sampling"] == sampling(ckpt["collab"]["rng"][0])  # rank 0's stream goes on; rank 1's is left
    synced = torch.load(two / "grads0.pt")
    assert_same_tensors(synced, torch.load(two / "grads1.pt"), "synchronised gradient")
    print("2 -> 1: max relative gradient difference", assert_same_gradient(torch.load(one / "grads0.pt"), synced))
    # and on 2 processes again: every rank's random state is in the checkpoint, the resume is bitwise
    wait(run_again, again)
    _, ends = checkpoint(again, "last.ckpt")
    _, straight_end = checkpoint(two, "last.ckpt")
    for key in ("state_dict", "optimizer_states", "collab", "RolloutDataModule"):
        assert_same_tensors(ends[key], straight_end[key], f"2 -> 2 {key}")
    assert [r["sampling"] for r in ranks(again, 2)] == [sampling(rng) for rng in ckpt["collab"]["rng"]]


def test_one_process_resumes_on_two(tmp_path, monkeypatch, one_thread):
    one, two, straight_dir = tmp_path / "one", tmp_path / "two", tmp_path / "straight"
    fit_one("maporl", one, 2, [], monkeypatch)
    path, ckpt = checkpoint(one, "last.ckpt")
    assert ckpt["global_step"] == 2 and len(ckpt["collab"]["rng"]) == 1
    fit_two("maporl", two, 3, ["--ckpt_path", str(path)], COLLAB_DDP_CAPTURE="1", COLLAB_DDP_LOADED="1")
    assert_loaded(two, 2, ckpt)
    # the run that did not stop, fed the 2 processes' step-3 rollouts at its step 3
    fit_one(
        "maporl",
        straight_dir,
        3,
        [],
        monkeypatch,
        COLLAB_DDP_REPLAY=str(two),
        COLLAB_DDP_REPLAY_ROLLOUT="3",
        COLLAB_DDP_CAPTURE="1",
        COLLAB_DDP_CAPTURE_ROLLOUT="3",
    )
    _, passing = checkpoint(straight_dir, "*step=2.ckpt")  # it went through the checkpoint's state, bitwise
    assert_same_tensors(passing["state_dict"], ckpt["state_dict"], "step 2")
    assert_same_tensors(passing["optimizer_states"], ckpt["optimizer_states"], "step 2")
    resumed, (straight,) = ranks(two, 2), ranks(straight_dir, 1)
    assert resumed[0]["step"] == resumed[1]["step"] == straight["step"] == 3
    assert [straight["tasks"][2][r::2] for r in (0, 1)] == [resumed[r]["tasks"][0] for r in (0, 1)]
    assert resumed[0]["digests"] == resumed[1]["digests"]  # the ranks stay in lockstep after the resume
    assert resumed[0]["sampling"] == sampling(ckpt["collab"]["rng"][0])  # rank 0 goes on with the saved stream
    assert resumed[1]["sampling"] != resumed[0]["sampling"]  # rank 1: a stream of its own (seed + 1)
    synced = torch.load(two / "grads0.pt")
    assert_same_tensors(synced, torch.load(two / "grads1.pt"), "synchronised gradient")
    print(
        "1 -> 2: max relative gradient difference", assert_same_gradient(synced, torch.load(straight_dir / "grads0.pt"))
    )
