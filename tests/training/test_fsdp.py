"""``--trainer.strategy fsdp`` (FSDP2: every model of the team sharded, collab.training.fsdp) on 2 gloo processes
against 1 process on the same data, and for one team against 2 ddp processes.

Each case runs 2 processes under fsdp whose rollouts differ in length (rank 1's agents write at most 3 tokens a
reply, rank 0's 6: the processes decode for unequal numbers of steps, and with small micro-batches score their
items in unequal numbers of forwards, so that the lockstep rounds of collab.runtime.lockstep must serve the others'
forwards), then 1 process fed the union of both ranks' first rollouts from the same starting weights
(``tests/support/ddp_probe.py``'s capture and replay). The first optimizer step's gradients, before and after
clipping (``collectives.clip_gradients``: the shards' squared norms summed over the ranks, the whole heads' counted
once), and the weights it made must be the same to a relative 1e-5 of each tensor's largest entry: the LoRA
adapters, the full agents' whole models and the heads outside every model (CoLLM-CC's value head, MARFT-A's and
MARFT-T's MLP critics, MAPoRL's per-agent value heads), which FSDP2 leaves whole on every process. Both ranks must
hold bitwise the same weights after every step, each only its half of every sharded one.

The teams: MAGRPO full+LoRA; CoLLM-CC full+full; CoLLM-DC full+LoRA; MARFT-A full+LoRA; MARFT-T full+LoRA; IPPO
full+full; AT-GRPO full+LoRA (the K candidates of its tree); MADPO full+LoRA (pairs of joint actions, one pass over
every model); MARLHF full+LoRA (its reward model's first update, the team idle, then the team's on its scores); MAPoRL
LoRA and full+LoRA; MAGRPO full+full with micro-batches holding both agents' samples, which
splits its term into one per model (each backward pass gathers one model). A LoRA team's one sharded model (the
shared base, its agents' and critics' adapters on it) is also CoLLM-CC's run under fsdp in
tests/training/test_ddp.py; each mixed team here holds that base too, beside a full agent's. The teams with a full
agent hold two or three sharded models (the full agents' copies, the LoRA agents' base, a critic's own base), whose
collectives :meth:`collab.runtime.lockstep.Lockstep.backward` keeps in one order on every process. Two cases check
more:

- MAPoRL full+LoRA runs under a max_grad_norm below its first step's gradient norm (every gradient scaled by
  ``max_norm / (norm + 1e-6)``, the norm one process computes), and its fsdp step is also compared with 2 ddp
  processes, each fed its own rank's first rollout from the same weights: the same gradients, clipped gradients and
  weights, to the same tolerance.
- MARFT-T on math with a calculator: on rank 0 agent 0's turn opens with a call (``tool_choice``) that it closes
  (``COLLAB_DDP_CALL``, 16 tokens a reply), the calculator runs and the reply goes on in a second round of decoding
  from its KV cache; rank 1's replies (3 tokens) end before a call closes, so rank 1 serves that round's forwards.
"""

import json
import re
from pathlib import Path

import pytest
import torch

from tests.support import warm
from tests.support.algos import algos, settings

ADAPTERS = "collab.training.artifacts.AdapterCheckpoint"

CASES = {f"{algo}-{name}": ["--algo", algo, *args] for algo in algos() for name, args in settings(algo).fsdp.items()}
"""Each algorithm's teams (its row of tests/support/algos.py), named ``ALGO-AGENTS``."""
IDLE = {"marlhf-full+lora": r"\.agent\d+\.|^team\.models\.full\d+\."}
"""The cases whose first step leaves some trainable weights without a gradient, and which (a pattern of their
names): MARLHF's team (its agents' adapters and full copies) while its reward model fits. Every other weight of
every case has one."""
CLIPPED = {"maporl-full+lora"}
"""The cases whose first step is clipped by their ``--model.max_grad_norm``: a coefficient below 1 (MARFT-T's default
0.5 clips by less; every case compares its clipped gradients)."""
AGAINST_DDP = {"maporl-full+lora"}
"""The cases whose fsdp step is also compared with 2 ddp processes fed each rank's rollout."""
CALLS = {"marft_t-full+lora+tools": '1+2"}}\n</tool_call>'}
"""What rank 0's forced calls write (tests/support/ddp_probe.py's ``COLLAB_DDP_CALL``): the calculator's result
3 joins the context and the reply goes on."""

PROBE = {"COLLAB_DDP_SIGNAL_RANKS": "0,1", "COLLAB_DDP_SIGNAL": "text", "COLLAB_DDP_CAPTURE": "1"}


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
        json.dumps([{"class_path": "tests.support.ddp_probe.Probe"}, {"class_path": ADAPTERS}]),
        *extra,
    ]


def two_processes(case: str, tmp: Path, strategy: str, steps: int, **probe: str) -> None:
    """2 processes of ``python -m collab.fit`` under ``strategy`` (forked warm: tests/support/warm.py), the probe
    writing to ``tmp``."""
    env = warm.child_env(COLLAB_DDP_PROBE=str(tmp), OMP_NUM_THREADS="1", **PROBE, **probe)
    extra = ["--trainer.strategy", strategy, "--trainer.devices", "2", "--trainer.max_steps", str(steps)]
    run = warm.ranks(args(case, tmp, extra), tmp, env)
    assert run.returncode == 0, run.stderr[-3000:]


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


def not_exported(run: Path, final: dict) -> list[str]:
    """The agents' trained weights the run ended with (``final``: LoRA adapters, full agents' models) that its
    exported adapters (``adapters/last``, written by rank 0 from weights every process gathered) do not hold bitwise
    (the files also hold the agents no longer trained, MAPoRL's earlier turns': not in ``final``)."""
    from safetensors.torch import load_file

    agents = [folder.name for folder in sorted((run / "adapters" / "last").iterdir())]
    left = {
        n: t for n, t in final.items() if re.match(r"team\.models\.full\d+\.", n) or any(f".{a}." in n for a in agents)
    }
    for agent in agents:
        for path in (run / "adapters" / "last" / agent).glob("*.safetensors"):
            for key, tensor in load_file(path).items():
                named = re.sub(r"\.(lora_[AB])\.", rf".\1.{agent}.", key)
                for n in [n for n in left if n.endswith(f".{named}") and torch.equal(left[n], tensor)][:1]:
                    del left[n]
    return sorted(left)


def same_step(run: Path, reference: Path, idle: str | None = None) -> None:
    """The first optimizer step of ``run`` against ``reference``'s: its gradients before and after clipping and the
    weights it made (files of tests/support/ddp_probe.py's capture, whole tensors). ``idle``: the pattern of the
    weights the step gives no gradient (:data:`IDLE`)."""
    step, one = torch.load(run / "after0.pt"), torch.load(reference / "after0.pt")
    assert step.keys() == one.keys()
    start = torch.load(run / "init0.pt")
    assert [name for name in one if not torch.equal(one[name], start[name])], "the step moved nothing"
    # the gradients of the step: 1e-5 of each tensor's largest entry (2 processes sum in another order, over other
    # paddings: up to ~1e-5 measured), floored at 1e-6 of the largest gradient (a tensor whose gradient nearly cancels)
    grads = [torch.load(run / "grads0.pt"), torch.load(reference / "grads0.pt")]
    without = {n for n in one if idle and re.search(idle, n)}
    assert set(grads[1]) == set(one) - without and set(one) - without <= set(grads[0]) <= set(one)
    grads = [completed(g, one) for g in grads]
    floor = 1e-6 * max(float(g.abs().max()) for g in grads[1].values())
    assert close(*grads, 1e-5, floor) == []
    # clipped (collectives.clip_gradients: the shards' squared norms summed over the ranks, whole heads once): the
    # same coefficient, so the same gradients to the same tolerance, scaled
    clipped = [completed(torch.load(run / "clipped0.pt"), one), completed(torch.load(reference / "clipped0.pt"), one)]
    coef = clip_coefficient(grads[1], clipped[1])
    assert close(*clipped, 1e-5, floor * coef) == []
    assert clip_coefficient(grads[0], clipped[0]) == pytest.approx(coef, rel=1e-5)
    # the weights it made: AdamW's first step is lr * g / (|g| + eps) (g after clipping), which turns a small
    # difference of a gradient entry near eps into a step that differs by a part of lr (lora_B from 0: its whole
    # value): 1e-5 of the largest entry plus 1% of lr where the gradient is above the floor the gradients were
    # compared with; within AdamW's bound (2 lr, the largest lr 1e-3) where it is below
    strong = {n: g.abs() > floor for n, g in grads[1].items()}
    assert close(step, one, 1e-5, 1e-2 * 1e-3, strong) == []
    assert close(step, one, 0.0, 2e-3, {n: ~m for n, m in strong.items()}) == []


def completed(grads: dict, weights: dict) -> dict:
    """``grads`` with zeros for the trainable ``weights`` it lacks: the probe gathers a sharded weight's missing
    gradient as zeros (every rank runs the same gathers), one process leaves it out (MARLHF's team while its reward
    model fits, whose gradients its ``accept`` drops)."""
    return {n: grads[n] if n in grads else torch.zeros_like(w) for n, w in weights.items()}


def norm(grads: dict) -> float:
    return sum(float(g.double().pow(2).sum()) for g in grads.values()) ** 0.5


def clip_coefficient(grads: dict, clipped: dict) -> float:
    """The factor clipping applied: ``clipped / grads`` (a total norm's ratio)."""
    return norm(clipped) / norm(grads)


def tool_results(path: Path) -> int:
    """The calculator's results (3) in the replies of a captured rollout."""
    items = torch.load(path, weights_only=False).items
    texts = [a.text for i in items for a in i.actions] if hasattr(items[0], "actions") else [i.text for i in items]
    return sum(t.count("<tool_response>\n3\n</tool_response>") for t in texts)


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_sharded_processes_take_one_process_step(case, tmp_path, monkeypatch, one_thread):
    call = {"COLLAB_DDP_CALL": f"0:{CALLS[case]}"} if case in CALLS else {}
    two_processes(case, tmp_path, "fsdp", 2, COLLAB_DDP_RANK_TOKENS="1:3", **call)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"] == 2
    assert ranks[0]["digests"] == ranks[1]["digests"] and ranks[0]["start"] != ranks[0]["digests"][0]
    (run,) = (tmp_path / "runs").glob("*/version_*")
    assert not_exported(run, torch.load(tmp_path / "final0.pt")) == []  # the export at the end: whole, the last step's
    shards = [r["sharded"] for r in ranks]
    assert shards[0]["rounds"] == shards[1]["rounds"] > 0 and shards[1]["stand_ins"] > 0  # rank 1 served rank 0's
    for s in shards:  # half of every sharded weight, every head outside the models whole (MARFT-A's MLP critic)
        half = s["unsharded"] + (s["whole"] - s["unsharded"]) / 2
        assert s["uneven"] == [] and abs(s["local"] - half) <= 0.01 * s["whole"], s
    if case in CALLS:  # rank 0's forced calls ran the calculator; rank 1's (3 tokens) never closed
        assert tool_results(tmp_path / "rollout0.pt") > 0 and tool_results(tmp_path / "rollout1.pt") == 0
    assert torch.load(tmp_path / "after1.pt").keys() == torch.load(tmp_path / "after0.pt").keys()
    # one process, the union of both ranks' first rollouts, from the same weights
    replay = tmp_path / "replay"
    replay.mkdir()
    from collab.fit import main

    for key, value in {**PROBE, "COLLAB_DDP_PROBE": str(replay), "COLLAB_DDP_REPLAY": str(tmp_path)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(replay)
    assert main(args(case, replay, ["--trainer.max_steps", "1"])) == 0
    same_step(tmp_path, replay, IDLE.get(case))
    grads, clipped = torch.load(replay / "grads0.pt"), torch.load(replay / "clipped0.pt")
    if case in CLIPPED:  # the bound was active: every gradient scaled by max_norm / (norm + 1e-6)
        bound = float(CASES[case][CASES[case].index("--model.max_grad_norm") + 1])
        coef = bound / (norm(grads) + 1e-6)
        assert coef < 0.5 and clip_coefficient(grads, clipped) == pytest.approx(coef, rel=1e-5)
    if case in AGAINST_DDP:  # 2 ddp processes, each fed its rank's rollout from the same weights: fsdp's step
        ddp = tmp_path / "ddp"
        ddp.mkdir()
        two_processes(case, ddp, "ddp", 1, COLLAB_DDP_REPLAY=str(tmp_path), COLLAB_DDP_REPLAY_OWN="1")
        ranks = [json.loads((ddp / f"rank{r}.json").read_text()) for r in (0, 1)]
        assert ranks[0]["sharded"] is None and ranks[0]["digests"] == ranks[1]["digests"]  # whole models, in sync
        assert torch.load(ddp / "grads0.pt").keys() == grads.keys()
        same_step(tmp_path, ddp)


def test_more_processes_than_decoder_layers_is_one_line():
    """``check_layers``: each process must hold a part of every decoder layer; the tiny base has 2 (a quantized base:
    tests/training/test_bad_input.py's ``test_fsdp_refuses_a_quantized_base``)."""
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
