"""Resume under ``--trainer.strategy fsdp`` (FSDP2, collab.training.fsdp): its checkpoint is DDP's, and it resumes at
the same and at other numbers of processes as a DDP checkpoint does (tests/training/test_ddp_resume.py).

One run of 2 sharded processes (MAGRPO, two LoRA agents on a 4-layer tiny base: FSDP2 over 4 processes needs 4
decoder layers, ``tiny`` has 2) trains 3 steps and keeps a checkpoint of every step. Its first rollout has no
learning signal (every reward 0: the update is an empty optimizer step and AdamW has no state yet); the probe of
``tests/support/ddp_probe.py`` rewards the others on every rank.

- DDP's format: step 1's checkpoint holds no optimizer state, as a 1-process run's (the same parameter groups), and
  step 2's holds AdamW's state of its first update (step count 1) for the same parameters as the 1-process run's.
  torch's ``get_optimizer_state_dict``, which Lightning's ``ModelParallelStrategy`` saves with, would have taken a
  zero-learning-rate step on the empty optimizer (step count 1 with zero moments, in the file and in the running
  optimizer): the first real update would have been AdamW's second (collab.training.fsdp_checkpoint).
- The same number of processes (2 -> 2): resumed from step 1 (no optimizer state), the run repeats the one that did
  not stop bitwise: the rollouts of step 3 (tokens, log-probs, rewards), the logged rewards, the weights after every
  step, the gradient of step 3, and at the end the weights, AdamW's moments and step counts, every rank's random
  state and the task position.
- Other numbers, as tests/training/test_ddp_resume.py asserts for DDP: every rank holds bitwise the checkpoint's
  weights, AdamW state and task position, and its own rank's random state where the checkpoint has one (a new rank
  starts a stream of its own); the resumed step plays the same tasks, sharded anew; the first gradient after the
  resume equals that of a run at the other world size fed the same rollouts (the sampled responses differ with the
  number of random streams: docs/resume.md), to a relative 1e-5 of each tensor's largest entry. 2 -> 4 (4 sharded
  processes) and 2 -> 1 are checked through one 1-process run resumed from the same checkpoint and fed
  the 4 processes' rollouts; 1 -> 2: a 1-process checkpoint resumed by 2 sharded processes, against a 1-process
  resume fed their rollouts. Every forward holds one row (``micro_batch_tokens`` 1).
"""

import json
from pathlib import Path

import pytest
import torch

from tests.support import assert_same_tensors, tiny_base_folder, warm
from tests.training.test_ddp_resume import assert_same_gradient, sampling, wait

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "COLLAB_DDP_PROBE",
    "COLLAB_DDP_SIGNAL_RANKS",
    "COLLAB_DDP_SIGNAL",
    "COLLAB_DDP_SIGNAL_FROM",
    "COLLAB_DDP_CAPTURE",
    "COLLAB_DDP_CAPTURE_ROLLOUT",
    "COLLAB_DDP_REPLAY",
    "COLLAB_DDP_REPLAY_ROLLOUT",
    "COLLAB_DDP_LOADED",
)
SIGNAL = {"COLLAB_DDP_SIGNAL_RANKS": "0,1,2,3", "COLLAB_DDP_SIGNAL": "text", "COLLAB_DDP_SIGNAL_FROM": "2"}
CALLBACKS = json.dumps(
    [
        {
            "class_path": "collab.training.callbacks.ModelCheckpoint",
            "init_args": {"save_last": True, "every_n_train_steps": 1, "save_top_k": -1},
        },
        {"class_path": "collab.training.callbacks.RewardSummary"},
        {"class_path": "tests.support.ddp_probe.Probe"},
    ]
)
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 6}


def args(base: Path, tmp: Path, steps: int, extra: list[str]) -> list[str]:
    return [
        *("--algo", "magrpo", "--data.env", "math", "--data.env_options", "{dataset: addition, profile: duo}"),
        *("--model.base.name", str(base), "--model.agents", json.dumps([{"sampling": SAMPLING}] * 2)),
        *("--model.micro_batch_tokens", "1", "--data.batch_size", "4", "--trainer.max_steps", str(steps)),
        *("--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false"),
        *("--trainer.logger.init_args.save_dir", str(tmp / "runs"), "--trainer.callbacks", CALLBACKS),
        *extra,
    ]


def start(base: Path, tmp: Path, steps: int, world: int, extra: list[str], **probe: str) -> list[warm.Child]:
    """A run of ``world`` sharded processes, forked warm (tests/support/warm.py: as Lightning's launcher starts its
    children, so 4 processes on 2 cores pass as a cluster's would)."""
    tmp.mkdir()
    env = {k: v for k, v in warm.child_env().items() if k not in PROBE}
    env.update({"OMP_NUM_THREADS": "1", "COLLAB_DDP_PROBE": str(tmp), **SIGNAL, **probe})
    fsdp = ["--trainer.strategy", "fsdp", "--trainer.devices", str(world)]
    return warm.start_ranks(args(base, tmp, steps, [*fsdp, *extra]), tmp, env, world)


def fit_one(base: Path, tmp: Path, steps: int, extra: list[str], monkeypatch, **probe: str) -> Path:
    """A 1-process run (no strategy) in this process."""
    from collab.fit import main

    tmp.mkdir()
    for key in PROBE:
        monkeypatch.delenv(key, raising=False)
    for key, value in {"COLLAB_DDP_PROBE": str(tmp), **SIGNAL, **probe}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp)
    assert main(args(base, tmp, steps, extra)) == 0
    return tmp


def ranks(tmp: Path, n: int) -> list[dict]:
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(n)]


def saved(tmp: Path, name: str) -> tuple[Path, dict]:
    (path,) = (tmp / "runs").rglob(name)
    return path, torch.load(path, map_location="cpu", weights_only=True)


def rewards(tmp: Path) -> list[float]:
    (path,) = (tmp / "runs").rglob("reward_summary.json")
    return json.loads(path.read_text())["rewards"]


def played(tmp: Path, rank: int) -> list:
    """A captured rollout's decisions: who, prompt, tokens, behaviour log-probs, reward."""
    experience = torch.load(tmp / f"rollout{rank}.pt", weights_only=False)
    return [(d.member, d.prompt_ids, d.completion_ids, d.old_logprobs, d.reward) for d in experience.items]


def assert_loaded(tmp: Path, world: int, ckpt: dict) -> None:
    """Every rank holds bitwise the checkpoint's weights, AdamW state and task position, and the random state of its
    rank (none for a rank the checkpoint had no process for)."""
    streams, rngs = ckpt["RolloutDataModule"]["streams"], ckpt["collab"]["rng"]
    for rank in range(world):
        loaded = torch.load(tmp / f"loaded{rank}.pt", weights_only=False)
        assert_same_tensors(loaded["params"], ckpt["state_dict"], f"rank {rank} weights")
        assert_same_tensors(loaded["optimizer"], ckpt["optimizer_states"][0], f"rank {rank} AdamW")
        assert_same_tensors(loaded["stream"], streams[0], f"rank {rank} task stream")
        assert_same_tensors(loaded["rng"], rngs[rank] if rank < len(rngs) else None, f"rank {rank} random state")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tiny_base_folder(tmp_path_factory.mktemp("base"), 4)


@pytest.fixture(scope="module")
def straight(base, tmp_path_factory) -> Path:
    """2 sharded processes, 3 steps, every checkpoint kept; step 3's rollouts and gradient captured."""
    tmp = tmp_path_factory.mktemp("straight") / "run"
    return wait(start(base, tmp, 3, 2, [], COLLAB_DDP_CAPTURE="1", COLLAB_DDP_CAPTURE_ROLLOUT="3"), tmp)


def test_checkpoint_is_ddps_and_resumes_bitwise_at_two(base, straight, tmp_path, monkeypatch, one_thread):
    first, ckpt1 = saved(straight, "*step=1.ckpt")
    again = start(
        base,
        tmp_path / "again",
        3,
        2,
        ["--ckpt_path", str(first)],
        COLLAB_DDP_CAPTURE="1",
        COLLAB_DDP_CAPTURE_ROLLOUT="2",
        COLLAB_DDP_LOADED="1",
    )
    # meanwhile, DDP's format: one process, the same two steps
    one = fit_one(base, tmp_path / "one", 2, [], monkeypatch)
    assert ckpt1["optimizer_states"][0]["state"] == {}  # the empty step wrote no state
    assert_same_tensors(ckpt1["optimizer_states"], saved(one, "*step=1.ckpt")[1]["optimizer_states"], "step 1 AdamW")
    (_, ckpt2), (_, one2) = saved(straight, "*step=2.ckpt"), saved(one, "*step=2.ckpt")
    state, reference = ckpt2["optimizer_states"][0]["state"], one2["optimizer_states"][0]["state"]
    assert sorted(state) == sorted(reference) and state
    for index, moments in state.items():  # AdamW's first update: step 1, whole moments
        assert moments["step"].item() == reference[index]["step"].item() == 1.0
        assert {k: v.shape for k, v in moments.items()} == {k: v.shape for k, v in reference[index].items()}
    assert ckpt2["state_dict"].keys() == one2["state_dict"].keys()
    # 2 -> 2: bitwise the run that did not stop
    wait(again, tmp_path / "again")
    resumed = tmp_path / "again"
    assert_loaded(resumed, 2, ckpt1)
    (_, end), (_, straight_end) = saved(resumed, "last.ckpt"), saved(straight, "last.ckpt")
    assert end["global_step"] == straight_end["global_step"] == 3
    for key in ("state_dict", "optimizer_states", "collab", "RolloutDataModule"):
        assert_same_tensors(end[key], straight_end[key], f"2 -> 2 {key}")
    assert rewards(resumed) == rewards(straight) and len(rewards(straight)) == 3 and rewards(straight)[0] == 0.0
    for rank, (r, s) in enumerate(zip(ranks(resumed, 2), ranks(straight, 2))):
        assert r["tasks"] == s["tasks"][1:] and r["digests"] == s["digests"][1:], rank
        assert_same_tensors(played(resumed, rank), played(straight, rank), f"rank {rank} step-3 rollout")
    assert_same_tensors(torch.load(resumed / "grads0.pt"), torch.load(straight / "grads0.pt"), "step-3 gradient")
    # 1 -> 2: the 1-process checkpoint of step 2 under fsdp, against one process fed the same rollouts
    path = saved(one, "*step=2.ckpt")[0]
    two = wait(
        start(base, tmp_path / "two", 3, 2, ["--ckpt_path", str(path)], COLLAB_DDP_CAPTURE="1", COLLAB_DDP_LOADED="1"),
        tmp_path / "two",
    )
    assert_loaded(two, 2, one2)
    fed = fit_one(
        base,
        tmp_path / "fed",
        3,
        ["--ckpt_path", str(path)],
        monkeypatch,
        COLLAB_DDP_REPLAY=str(two),
        COLLAB_DDP_CAPTURE="1",
    )
    (step3,), sharded = ranks(fed, 1), ranks(two, 2)
    assert [step3["tasks"][0][r::2] for r in (0, 1)] == [sharded[r]["tasks"][0] for r in (0, 1)]
    assert sharded[0]["digests"] == sharded[1]["digests"]
    assert sharded[0]["sampling"] == sampling(one2["collab"]["rng"][0]) != sharded[1]["sampling"]
    synced = torch.load(two / "grads0.pt")
    assert_same_tensors(synced, torch.load(two / "grads1.pt"), "gathered gradient")
    print("1 -> 2: max relative gradient difference", assert_same_gradient(synced, torch.load(fed / "grads0.pt")))


def test_two_process_checkpoint_resumes_at_four_and_one(base, straight, tmp_path, monkeypatch, one_thread):
    path, ckpt = saved(straight, "*step=2.ckpt")
    four = wait(
        start(base, tmp_path / "four", 3, 4, ["--ckpt_path", str(path)], COLLAB_DDP_CAPTURE="1", COLLAB_DDP_LOADED="1"),
        tmp_path / "four",
    )
    assert_loaded(four, 4, ckpt)
    one = fit_one(
        base,
        tmp_path / "one",
        3,
        ["--ckpt_path", str(path)],
        monkeypatch,
        COLLAB_DDP_REPLAY=str(four),
        COLLAB_DDP_CAPTURE="1",
        COLLAB_DDP_LOADED="1",
    )
    assert_loaded(one, 1, ckpt)
    (step3,), sharded, before = ranks(one, 1), ranks(four, 4), ranks(straight, 2)
    # the task position: step 3's tasks are the run's that did not stop, sharded by the world size
    assert [step3["tasks"][0][r::2] for r in (0, 1)] == [before[r]["tasks"][2] for r in (0, 1)]
    assert [step3["tasks"][0][r::4] for r in range(4)] == [sharded[r]["tasks"][0] for r in range(4)]
    assert all(r["digests"] == sharded[0]["digests"] for r in sharded)  # the 4 ranks stay equal
    rngs = ckpt["collab"]["rng"]
    assert (
        [r["sampling"] for r in sharded[:2]]
        == [sampling(rng) for rng in rngs]
        == [step3["sampling"], sampling(rngs[1])]
    )
    assert len({r["sampling"] for r in sharded}) == 4  # ranks 2 and 3: streams of their own
    synced = torch.load(four / "grads0.pt")
    for rank in (1, 2, 3):
        assert_same_tensors(synced, torch.load(four / f"grads{rank}.pt"), f"rank {rank} gathered gradient")
    print("2 -> 4 / 1: max relative gradient difference", assert_same_gradient(torch.load(one / "grads0.pt"), synced))
