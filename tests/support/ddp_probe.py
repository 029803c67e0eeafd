"""A callback for the multi-process tests (tests/training/test_ddp.py), driven by environment variables.

Each rank records the tasks it played and a digest of its trainable weights at the start and after every
optimizer step, in ``$COLLAB_DDP_PROBE/rank<r>.json``. Options:

* ``COLLAB_DDP_SIGNAL_RANKS="0"``: the ranks listed get a reward that varies with the action (the length
  of the first agent's response, mod 3, halved), so that they have a learning signal whatever the tiny
  model says; every other rank gets reward 0 for everything (no signal for MAGRPO's group advantages).
  ``COLLAB_DDP_SIGNAL_FROM=N``: every reward is 0 before the N-th rollout of training (``CollabModule.rollouts``,
  which a resumed run continues): those steps have nothing to learn and take an empty optimizer step.
  ``COLLAB_DDP_SIGNAL=text``: the signal is a digest of every agent's response instead of the first
  one's length (mod 3, halved), for envs whose responses all have one length (matrix's one-letter
  choices) or whose first agent's length barely varies (coding): a group's samples then differ.
* ``COLLAB_DDP_STALL="RANK:STEP"``: that rank sleeps (``COLLAB_DDP_STALL_SECONDS``, default an hour) before
  its rollout at optimizer step STEP (writing the time it began to ``stall<RANK>.txt``), while the others wait
  in the step's collectives: the run must end at the process group's timeout, in one line naming the rank
  and the step (``collab.training.distributed``).
* ``COLLAB_DDP_CAPTURE=1``: each rank also saves its first rollout (``rollout<r>.pt``) and prepared batch
  (``batch<r>.pt``), its weights at the start (``init<r>.pt``), the gradient of the first optimizer
  step, synchronised and before clipping (``grads<r>.pt``), the weights that step made (``after<r>.pt``) and
  those the run ended with (``final<r>.pt``).
  Under ``--trainer.strategy fsdp`` the shards are gathered: every file holds whole tensors. The gradient that
  step applied (after clipping, ``max_grad_norm``) goes to ``clipped<r>.pt``.
* ``COLLAB_DDP_RANK_TOKENS="RANK:N"``: that rank's agents write at most N tokens a reply (the others keep their
  own cap): the processes' rollouts take unequal numbers of decoding steps.
* ``COLLAB_DDP_REPLAY=DIR``: a 1-process run that starts from ``DIR/init0.pt`` and whose first rollout and
  prepared batch are the unions of every rank's (``DIR/rollout<r>.pt``, ``DIR/batch<r>.pt``) instead of new
  ones (prepared by each rank: a rank's episode and group numbers index its own items only); with
  ``COLLAB_DDP_CAPTURE`` it saves its own ``grads0.pt`` (into ``$COLLAB_DDP_PROBE``) for comparison.
  ``COLLAB_DDP_REPLAY_OWN=1``: a run of as many processes as ``DIR``'s instead, each rank replaying its own rank's
  first rollout and prepared batch (the same data under another strategy).
* ``COLLAB_DDP_CALL="RANK:TEXT"``: on that rank, a reply that starts inside a call's opening (the env option
  ``tool_choice``) writes TEXT's tokens first, the policy's log-probs of them kept (the decoding loop, its forwards
  and the tools run as they do; only the draws are set): a text that closes the call makes the tool run and the
  reply go on in a second round.

Across world sizes (tests/training/test_ddp_resume.py):

* ``COLLAB_DDP_CAPTURE_ROLLOUT=N`` (default 1): capture the N-th rollout of this run and the gradient of its
  first optimizer step instead of the first (``init<r>.pt`` stays the weights at the start);
* ``COLLAB_DDP_REPLAY_ROLLOUT=N`` (default 1): replay into the N-th rollout of this run; the weights of
  ``DIR/init0.pt`` are loaded only for N = 1 in a run that starts at step 0 (a resumed run keeps its checkpoint's);
* ``COLLAB_DDP_LOADED=1``: each rank saves, at the start of training (after a checkpoint loaded), its
  trainable weights, optimizer state, task stream and the random state it will resume (``loaded<r>.pt``; under
  ``--trainer.strategy fsdp`` the weights and the optimizer's moments gathered whole).

With an ``EvaluationCallback`` in the run (listed after the probe, so that a replay's weights are loaded
before it evaluates), ``rank<r>.json`` also holds the first evaluation's figures and per-problem scores.
"""

import hashlib
import json
import os
import re
import time
from dataclasses import replace
from pathlib import Path

import lightning as L
import torch

from collab.runtime.lockstep import whole  # an FSDP2 shard gathered (a collective), else the tensor


def trainable(pl_module) -> dict[str, torch.Tensor]:
    return {name: p for name, p in sorted(pl_module.named_parameters()) if p.requires_grad}


def weights(pl_module) -> dict[str, torch.Tensor]:
    """The trainable weights, whole (detached copies)."""
    return {n: whole(p.detach()).clone() for n, p in trainable(pl_module).items()}


def optimizer_state(optimizer) -> dict:
    """``optimizer.state_dict()`` with every shard gathered whole (a collective, in index order on every rank)."""
    saved = optimizer.state_dict()
    return {**saved, "state": {i: {k: whole(v) for k, v in saved["state"][i].items()} for i in sorted(saved["state"])}}


def gradients(pl_module) -> dict[str, torch.Tensor]:
    """The trainable weights' gradients, whole: a shard's gathered from every process (a missing one as zeros, so
    that every rank runs the same gathers), another only where this rank has it."""
    out = {}
    for n, p in trainable(pl_module).items():
        if hasattr(p, "full_tensor"):
            out[n] = whole(p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
        elif p.grad is not None:
            out[n] = p.grad.detach().clone()
    return out


def digest(pl_module) -> str:
    h = hashlib.sha256()
    for name, p in weights(pl_module).items():
        h.update(name.encode())
        h.update(p.cpu().numpy().tobytes())
    return h.hexdigest()


def merge(first, *others):
    """One experience (or prepared batch) holding every rank's items (decisions or transitions), in rank order."""
    items = [item for part in (first, *others) for item in part.items]
    return replace(first, items=items, **({"examples": []} if hasattr(first, "examples") else {}))


def captured(folder: Path, name: str) -> list:
    """Every rank's captured ``<name><r>.pt`` in ``folder``, in rank order."""
    found = []
    while (folder / f"{name}{len(found)}.pt").exists():
        found.append(torch.load(folder / f"{name}{len(found)}.pt", weights_only=False))
    return found


def signal_reward(joint, kind: str) -> float:
    """0, 0.5 or 1 from a joint action: the first response's length, or (``text``) a digest of all of them."""
    if kind == "text":
        return int(hashlib.sha256("\x00".join(joint).encode()).hexdigest(), 16) % 3 / 2
    return (len(joint[0]) % 3) / 2


def shaped(step_batch, signal, kind: str = "length"):
    """``step_batch`` rewarded by :func:`signal_reward` while ``signal()`` holds, else 0 for every joint action."""

    def step(states, actions):
        results = step_batch(states, actions)
        rewards = [signal_reward(joint, kind) if signal() else 0.0 for joint in actions]
        return [replace(r, rewards=tuple(reward for _ in r.rewards)) for r, reward in zip(results, rewards)]

    return step


def stall(rank: int, step: int) -> None:
    """``COLLAB_DDP_STALL="RANK:STEP"``: sleep on that rank before that step's rollout (a rollout that never ends)."""
    spec = os.environ.get("COLLAB_DDP_STALL")
    if spec and [int(x) for x in spec.split(":")] == [rank, step]:
        (Path(os.environ["COLLAB_DDP_PROBE"]) / f"stall{rank}.txt").write_text(str(time.time()))  # when it began
        time.sleep(float(os.environ.get("COLLAB_DDP_STALL_SECONDS", "3600")))


OPENING = re.compile(r'<tool_call>\n\{"name": "[^"]*", "arguments": \{("[^"]*": ")?$')
"""The end of a prompt that stops inside a call's opening (``collab.tools.calls.call_opening``)."""


def force_call(text: str) -> None:
    """``COLLAB_DDP_CALL``: each sample of ``collab.policy.team``'s decoding whose prompt ends with a call's opening
    takes ``text``'s tokens as its first draws (``collab.policy.sampling._next_tokens``, its log-probs kept)."""
    import collab.policy.sampling as sampling
    import collab.policy.team as team

    decode, next_tokens = team.decode, sampling._next_tokens
    forced: dict = {}

    def decoding(model, tokenizer, rows, *args, **kwargs):
        opens = [bool(OPENING.search(tokenizer.decode(r.prompt_ids[-32:]))) for r in rows for _ in range(r.n)]
        script = tokenizer(text, add_special_tokens=False)["input_ids"]
        forced.update(script=script, slots={b for b, o in enumerate(opens) if o}, step=0)
        try:
            return decode(model, tokenizer, rows, *args, **kwargs)
        finally:
            forced.clear()

    def drawing(logits, state, width):
        nxt, logp = next_tokens(logits, state, width)
        if forced and forced["step"] < len(forced["script"]):
            for i, slot in enumerate(state["slots"].tolist()):  # the sample's place in the decoding batch
                if slot in forced["slots"]:
                    nxt[i] = forced["script"][forced["step"]]
            forced["step"] += 1
        return nxt, logp

    team.decode, sampling._next_tokens = decoding, drawing


def live_bytes() -> int:
    """Bytes of every tensor storage alive in this process (each storage once), found through the garbage
    collector: a weight that sharding should have freed but that something still holds counts here."""
    import gc

    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            obj = obj.to_local() if hasattr(obj, "to_local") else obj  # a DTensor: its local shard
            storage = obj.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def sharding(pl_module) -> dict | None:
    """With sharded models (``--trainer.strategy fsdp``, FSDP2): the bytes of weights this rank keeps (local shards),
    the whole weights' bytes, the bytes of the weights no model shards (heads outside every model: kept whole on every
    rank) and the lockstep rounds it took part in."""
    from collab.runtime import lockstep

    step = lockstep.active()
    if step is None:
        return None
    params = dict(pl_module.named_parameters())
    shards = {n: p for n, p in params.items() if hasattr(p, "to_local")}
    rank, world = step.rank, step.world
    uneven = []  # the shards whose rows are not this rank's chunk of dim 0 (FSDP2's torch.chunk split)
    for n, p in shards.items():
        rows = -(-p.shape[0] // world)
        if p.to_local().shape != (max(0, min(rows, p.shape[0] - rank * rows)), *p.shape[1:]):
            uneven.append(n)
    return {
        "local": sum((p.to_local() if n in shards else p).numel() * p.element_size() for n, p in params.items()),
        "whole": sum(p.numel() * p.element_size() for p in params.values()),
        "unsharded": sum(p.numel() * p.element_size() for n, p in params.items() if n not in shards),
        "shards": len(shards),
        "uneven": uneven,
        "whole_trainable": sorted(n for n, p in params.items() if p.requires_grad and n not in shards),
        "rounds": step.rounds,
        "stand_ins": step.stand_ins,
        "live": live_bytes(),
    }


class Probe(L.Callback):
    def __init__(self) -> None:
        self.tasks: list[list[str]] = []
        self.digests: list[str] = []
        self.start = ""
        self.sampling = ""
        self.out = Path(os.environ["COLLAB_DDP_PROBE"])
        self.capture = bool(os.environ.get("COLLAB_DDP_CAPTURE"))
        self.replay = os.environ.get("COLLAB_DDP_REPLAY")
        self.rollouts = 0
        self.capture_at = int(os.environ.get("COLLAB_DDP_CAPTURE_ROLLOUT", "1"))
        self.replay_at = int(os.environ.get("COLLAB_DDP_REPLAY_ROLLOUT", "1"))
        self.grads_saved = False

    def replayed(self, name: str, rank: int):
        """``DIR/<name><r>.pt`` of this rank (``COLLAB_DDP_REPLAY_OWN``), or of every rank merged."""
        load = captured(Path(self.replay), name)
        return load[rank] if os.environ.get("COLLAB_DDP_REPLAY_OWN") else merge(*load)

    def setup(self, trainer, pl_module, stage) -> None:
        rollout, prepare, rank = pl_module.rollout, pl_module.prepare, trainer.global_rank
        signal_ranks = os.environ.get("COLLAB_DDP_SIGNAL_RANKS")
        call = os.environ.get("COLLAB_DDP_CALL", "").split(":", 1)
        if len(call) == 2 and int(call[0]) == rank:
            force_call(call[1])

        def recording(tasks):
            env = pl_module.env
            cap = os.environ.get("COLLAB_DDP_RANK_TOKENS")
            if cap and int(cap.split(":")[0]) == rank and not self.tasks:
                team = pl_module.team
                for i, spec in enumerate(team.specs):
                    team.specs[i] = replace(
                        spec, sampling=replace(spec.sampling, max_new_tokens=int(cap.split(":")[1]))
                    )
            if not self.tasks:  # the random stream this rank samples its first rollout from
                self.sampling = hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()
            self.tasks.append([json.dumps(t, sort_keys=True, default=str) for t in tasks])
            if signal_ranks is not None and "step_batch" not in vars(env):
                listed, start = str(rank) in signal_ranks.split(","), int(os.environ.get("COLLAB_DDP_SIGNAL_FROM", "1"))
                env.step_batch = shaped(
                    env.step_batch,
                    lambda: listed and pl_module.rollouts >= start,
                    os.environ.get("COLLAB_DDP_SIGNAL", "length"),
                )
            stall(rank, trainer.global_step)
            self.rollouts += 1
            if self.replay and self.rollouts == self.replay_at:
                return self.replayed("rollout", rank)
            experience = rollout(tasks)
            if self.capture and self.rollouts == self.capture_at:
                torch.save(experience, self.out / f"rollout{rank}.pt")
            return experience

        pl_module.rollout = recording

        def preparing(experience):  # the first rollout's prepared batch: saved, or both ranks' fed again
            if self.replay and self.rollouts == self.replay_at:
                return self.replayed("batch", rank)
            batch = prepare(experience)
            if self.capture and self.rollouts == self.capture_at:
                torch.save(batch, self.out / f"batch{rank}.pt")
            return batch

        pl_module.prepare = preparing

        step = pl_module.optimizer_step

        def optimizer_step():  # the synchronised gradient of the captured rollout's first step, before clipping
            if self.capture and self.rollouts == self.capture_at and not self.grads_saved:
                self.grads_saved = True
                torch.save(gradients(pl_module), self.out / f"grads{rank}.pt")
                clipped = self.out / f"clipped{rank}.pt"  # and as the optimizer takes it, after clipping
                hook = trainer.optimizers[0].register_step_pre_hook(
                    lambda *_: torch.save(gradients(pl_module), clipped)
                )
                step()
                hook.remove()
                torch.save(weights(pl_module), self.out / f"after{rank}.pt")
                return
            step()

        pl_module.optimizer_step = optimizer_step

    def on_train_start(self, trainer, pl_module) -> None:
        if os.environ.get("COLLAB_DDP_LOADED"):
            torch.save(
                {
                    "params": weights(pl_module),
                    "optimizer": optimizer_state(trainer.optimizers[0]),
                    "stream": trainer.datamodule.stream.state_dict(),
                    "rng": pl_module._resume_rng,
                },
                self.out / f"loaded{trainer.global_rank}.pt",
            )
        if self.replay and self.replay_at == 1 and trainer.global_step == 0:
            init = torch.load(Path(self.replay) / "init0.pt")
            with torch.no_grad():
                for name, p in trainable(pl_module).items():
                    p.copy_(init[name])
        elif self.capture:
            torch.save(weights(pl_module), self.out / f"init{trainer.global_rank}.pt")
        self.start = digest(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.digests.append(digest(pl_module))

    def on_train_end(self, trainer, pl_module) -> None:
        from collab.training.callbacks import EvaluationCallback

        if self.capture:  # the weights the run ended with, whole (what its exported adapters must hold)
            torch.save(weights(pl_module), self.out / f"final{trainer.global_rank}.pt")
        evaluations = [c for c in trainer.callbacks if isinstance(c, EvaluationCallback)]
        first = {"history": evaluations[0].history[0], "scores": evaluations[0].scores[0]} if evaluations else None
        out = self.out / f"rank{trainer.global_rank}.json"
        out.write_text(
            json.dumps(
                {
                    "sharded": sharding(pl_module),
                    "tasks": self.tasks,
                    "digests": self.digests,
                    "start": self.start,
                    "sampling": self.sampling,
                    "step": trainer.global_step,
                    "evaluation": first,
                }
            )
        )
