"""``--trainer.strategy fsdp`` (FSDP2: every model of the team sharded, collab.training.fsdp) on 2 gloo processes
against 1 process on the same data.

Each case runs 2 processes under fsdp whose rollouts differ in length (rank 1's agents write at most 3 tokens a
reply, rank 0's 6: the processes decode for unequal numbers of steps, and with small micro-batches score their
items in unequal numbers of forwards, so that the lockstep rounds of collab.runtime.lockstep must serve the others'
forwards), then 1 process fed the union of both ranks' first rollouts from the same starting weights
(``tests/support/ddp_probe.py``'s capture and replay). The first optimizer step's gradients and the weights it made
must be the same to a relative 1e-5 of each tensor's largest entry: the LoRA adapters, the full agents' whole models
and the heads outside every model (CoLLM-CC's value head, MARFT-A's MLP critic, MAPoRL's per-agent value heads), which
FSDP2 leaves whole on every process. Both ranks must hold bitwise the
same weights after every step, each only its half of every sharded one. The teams with a full agent hold two or
three sharded models (the full agents' copies, the LoRA agents' base, the critic's own base), whose collectives
:meth:`collab.runtime.lockstep.Lockstep.backward` keeps in one order on every process; MAGRPO's two full agents with
micro-batches holding both agents' samples split its term into one per model (each pass gathers one).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.algos import settings

ROOT = Path(__file__).resolve().parents[2]

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 6}
FULL = {"finetune": "full", "lr": 1e-4, "sampling": SAMPLING}
LORA = {"sampling": SAMPLING}

WRITING = ["--data.env", "writing"]

# each case: its algorithm, team and env (a full agent and a LoRA agent on one base: the full agent's own copy and
# the LoRA agents' shared base are two sharded models)
CASES = {
    "magrpo-full+lora": ["--algo", "magrpo", "--model.agents", json.dumps([FULL, LORA]), *WRITING],
    # two full agents with micro-batches holding both agents' samples: MAGRPO's term split into one per model
    "magrpo-full+full": ["--algo", "magrpo", "--model.agents", json.dumps([FULL, FULL]), *WRITING],
    "collm_cc-lora": ["--algo", "collm_cc", "--model.agents", json.dumps([LORA, LORA]), *WRITING],
    # the critic reads agent 0, a full agent: a base of its own (with the critic's LoRA), a third sharded model
    "collm_cc-full+full": ["--algo", "collm_cc", "--model.agents", json.dumps([FULL, FULL]), *WRITING],
    # MARFT-A: a central MLP critic head on the frozen (shared, sharded) base
    "marft_a-lora": ["--algo", "marft_a", "--model.agents", json.dumps([LORA, LORA]), *WRITING],
    # IPPO: an LLM critic per agent (adapters on the shared base)
    "ippo-lora": ["--algo", "ippo", "--model.agents", json.dumps([LORA, LORA]), *WRITING],
    # MAPoRL: per-agent value heads, a 2-turn debate
    "maporl-lora": [
        "--algo",
        "maporl",
        "--model.agents",
        json.dumps([LORA, LORA]),
        *settings("maporl").ddp,  # the debate of its DDP run: 2 agents, 2 turns
    ],
}


MICRO = {"magrpo-full+full": "4096"}
"""Cases whose micro-batches hold every item of a rank (both agents' samples in one micro-batch)."""


def args(case: str, tmp: Path, extra: list[str]) -> list[str]:
    return [
        *CASES[case],
        "--model.base.name",
        "tiny",
        "--model.micro_batch_tokens",
        MICRO.get(case, "48"),  # a few items a forward: rank 0's longer items take more of them
        "--data.batch_size",
        "4",
        "--trainer.accelerator",
        "cpu",
        "--trainer.logger.init_args.save_dir",
        str(tmp / "runs"),
        "--trainer.callbacks",
        json.dumps([{"class_path": "tests.support.ddp_probe.Probe"}]),
        *extra,
    ]


def close(a: dict, b: dict, rel: float, floor: float, where: dict | None = None) -> list[str]:
    """The names whose tensors differ by more than ``rel`` of the reference's (``b``'s) largest entry plus ``floor``
    (only at the entries ``where`` holds True, when given)."""
    out = []
    for n in b:
        diff = (a[n] - b[n]).abs()
        diff = diff[where[n]] if where is not None else diff
        if diff.numel() and float(diff.max()) > rel * float(b[n].abs().max()) + floor:
            out.append(n)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_sharded_processes_take_one_process_step(case, tmp_path, monkeypatch, one_thread):
    probe = {"COLLAB_DDP_SIGNAL_RANKS": "0,1", "COLLAB_DDP_SIGNAL": "text", "COLLAB_DDP_CAPTURE": "1"}
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}",
        "COLLAB_DDP_PROBE": str(tmp_path),
        "COLLAB_DDP_RANK_TOKENS": "1:3",
        "OMP_NUM_THREADS": "1",
        **probe,
    }
    two = ["--trainer.strategy", "fsdp", "--trainer.devices", "2", "--trainer.max_steps", "2"]
    run = subprocess.run(
        [sys.executable, "-m", "collab.fit", *args(case, tmp_path, two)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"] == 2
    assert ranks[0]["digests"] == ranks[1]["digests"] and ranks[0]["start"] != ranks[0]["digests"][0]
    shards = [r["sharded"] for r in ranks]
    assert shards[0]["rounds"] == shards[1]["rounds"] > 0 and shards[1]["stand_ins"] > 0  # rank 1 served rank 0's
    for s in shards:  # half of every sharded weight, every head outside the models whole (MARFT-A's MLP critic)
        half = s["unsharded"] + (s["whole"] - s["unsharded"]) / 2
        assert s["uneven"] == [] and abs(s["local"] - half) <= 0.01 * s["whole"], s
    # one process, the union of both ranks' first rollouts, from the same weights
    replay = tmp_path / "replay"
    replay.mkdir()
    from collab.fit import main

    for key, value in {**probe, "COLLAB_DDP_PROBE": str(replay), "COLLAB_DDP_REPLAY": str(tmp_path)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(replay)
    assert main(args(case, replay, ["--trainer.max_steps", "1"])) == 0
    sharded, one = torch.load(tmp_path / "after0.pt"), torch.load(replay / "after0.pt")
    assert torch.load(tmp_path / "after1.pt").keys() == sharded.keys() == one.keys()
    start = torch.load(tmp_path / "init0.pt")
    moved = [name for name in one if not torch.equal(one[name], start[name])]
    assert moved, "the step moved nothing"
    # the gradients of the step: 1e-5 of each tensor's largest entry (2 processes sum in another order, over other
    # paddings: up to ~1e-5 measured), floored at 1e-6 of the largest gradient (a tensor whose gradient nearly cancels)
    grads = [torch.load(tmp_path / "grads0.pt"), torch.load(replay / "grads0.pt")]
    assert sorted(grads[0]) == sorted(grads[1]) == sorted(one)
    floor = 1e-6 * max(float(g.abs().max()) for g in grads[1].values())
    assert close(*grads, 1e-5, floor) == []
    # the weights it made: AdamW's first step is lr * g / (|g| + eps) (g after clipping), which turns a small
    # difference of a gradient entry near eps into a step that differs by a part of lr (lora_B from 0: its whole
    # value): 1e-5 of the largest entry plus 1% of lr where the gradient is above the floor the gradients were
    # compared with; within AdamW's bound (2 lr, the largest lr 1e-3) where it is below
    strong = {n: g.abs() > floor for n, g in grads[1].items()}
    assert close(sharded, one, 1e-5, 1e-2 * 1e-3, strong) == []
    assert close(sharded, one, 0.0, 2e-3, {n: ~m for n, m in strong.items()}) == []


def test_more_processes_than_decoder_layers_is_one_line():
    """``check_layers``: each process must hold a part of every decoder layer; the tiny base has 2 (a quantized base
    and vLLM: tests/training/test_bad_input.py's ``test_fsdp_refuses_what_it_cannot_shard``)."""
    from torch import nn

    from collab.errors import UserError
    from collab.training.fsdp import check_layers

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])

    check_layers([Tiny()], 2)
    with pytest.raises(UserError, match="fsdp over 3 processes .* Tiny .2 layers.: use at most 2 processes") as error:
        check_layers([Tiny()], 3)
    assert "\n" not in str(error.value)
