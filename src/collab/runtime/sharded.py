"""A frozen base sharded across processes: collab's FSDP for LoRA teams (``--trainer.strategy fsdp``).

In a LoRA team only the adapters (and critic heads) train; the base is frozen. Each process of a
sharded run keeps ``1/world`` of the frozen ``Linear`` and ``Embedding`` weights of the team's bases and
gathers them from the other processes only while they compute. As FSDP's flat parameters, the weights are
grouped in *units*: one per decoder layer (an element of the model's first ``ModuleList``: every weight
below it, flattened into one buffer and sliced), one for each weight outside the layers (the input
embedding, the output head). A unit is gathered whole at its first use in a layer's forward and freed when
the layer's forward ends; in the backward (each ``Linear`` needs its weight again for its input's gradient,
and nothing of it is saved for the backward) the unit in use is gathered once and kept until the backward
moves to another unit. A process therefore holds its slices plus at most two gathered units. The adapters,
their optimizer states and the heads are replicated and their gradients all-reduced, as under DDP (they
are a small fraction of the base).

**Why not Lightning's FSDP.** Per-layer gathers are collectives: FSDP needs every process to run the same
forwards in the same order. collab's processes do not (each decodes its own tasks to different lengths,
scores its own responses in its own number of forwards; docs/distributed.md). Here each gather is a
*round*: every process posts the unit it needs (or that it is idle), then every process takes part in
gathering each posted unit, in one order (:meth:`Gatherer.full`). A process that needs no unit (its
rollout ended first, or it waits to enter a collective) serves the others' rounds until every process
is idle (:meth:`Gatherer.settle`); collab settles before each of its own collectives and at the end of a
step. Processes then never wait on each other in two different collectives, whatever their data: the
run's figures are the unsharded run's (the gathered weights are bitwise the originals).

The gathers run on a process group of their own (created by :func:`shard_frozen` on every process). Only
``torch.nn.Linear`` (exact type) and ``nn.Embedding`` (and subclasses: Gemma's scaled embedding) weights
are sharded; norms, biases, GPT-2's ``Conv1D``, quantized (bitsandbytes) layers and MoE experts' 3-D
parameters stay whole on every process. Tied weights (the output head tied to the input embedding) are
one shard. The base is loaded whole on each process before it is sliced: the peak at start-up is one
whole copy, the memory after it ``1/world`` of the sharded weights plus one gathered layer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

IDLE = -1
"""What a process posts in a round when it needs no unit."""

_ACTIVE: "Gatherer | None" = None


def active() -> "Gatherer | None":
    """This process's gatherer when its base is sharded (one per process), else None."""
    return _ACTIVE


def settle() -> None:
    """Serve the other processes' gathers until every process is idle (no-op when nothing is sharded): call
    before any other collective, so that no process waits in it while another waits for a unit."""
    if _ACTIVE is not None:
        _ACTIVE.settle()


class Gatherer:
    """The units of one process (its slice of each), the rounds that gather them and the two gathered units it
    may hold: the one a forward is in, the one a backward is in (see the module docstring)."""

    def __init__(self, group, rank: int, world: int, device: torch.device) -> None:
        self.group, self.rank, self.world, self.device = group, rank, world, torch.device(device)
        self.shards: list[Tensor] = []  # this process's slice of each unit, flat, padded to world x chunk
        self.members: list[list[tuple[int, torch.Size]]] = []  # per unit: (offset, shape) of each weight in it
        self.numels: list[int] = []
        self.held: dict[str, tuple[int, Tensor] | None] = {"forward": None, "backward": None}
        self.rounds = self.gathers = 0  # counters (the benchmarks and tests read them)

    def register(self, weights: list[Tensor]) -> int:
        """Keep this process's slice of the unit made of ``weights`` (on the gatherer's device); returns its key."""
        flat = torch.cat([w.detach().reshape(-1) for w in weights])
        chunk = math.ceil(flat.numel() / self.world)
        padded = torch.zeros(chunk * self.world, dtype=flat.dtype, device=flat.device)
        padded[: flat.numel()] = flat
        self.shards.append(padded[self.rank * chunk : (self.rank + 1) * chunk].to(self.device, copy=True))
        offsets = [0]
        for w in weights:
            offsets.append(offsets[-1] + w.numel())
        self.members.append([(o, w.shape) for o, w in zip(offsets, weights)])
        self.numels.append(flat.numel())
        return len(self.shards) - 1

    def local_bytes(self) -> int:
        """Bytes of the slices this process keeps."""
        return sum(s.numel() * s.element_size() for s in self.shards)

    def whole_bytes(self) -> int:
        """Bytes of the sharded weights whole (what each process would hold unsharded)."""
        return sum(n * s.element_size() for n, s in zip(self.numels, self.shards))

    def _round(self, want: int) -> tuple[list[int], Tensor | None]:
        import torch.distributed as dist

        mine = torch.tensor([want], dtype=torch.int64, device=self.device)
        posted = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(posted, mine, group=self.group)
        keys = sorted({int(p) for p in posted} - {IDLE})
        self.rounds += 1
        out = None
        for key in keys:  # every process gathers every posted unit, in the same order
            shard = self.shards[key]
            parts = [torch.empty_like(shard) for _ in range(self.world)]
            dist.all_gather(parts, shard, group=self.group)
            self.gathers += 1
            if key == want:
                out = torch.cat(parts)[: self.numels[key]]
        return keys, out

    def full(self, key: int) -> Tensor:
        """Unit ``key`` whole (a fresh flat tensor, bitwise the original weights), gathered in one round."""
        _, out = self._round(key)
        assert out is not None
        return out

    def weight(self, key: int, member: int, phase: str) -> Tensor:
        """Weight ``member`` of unit ``key``, from the unit held for ``phase`` (``forward``: until
        :meth:`drop`; ``backward``: until the backward needs another unit), gathered if it is not held."""
        held = self.held[phase]
        if held is None or held[0] != key:
            held = self.held[phase] = (key, self.full(key))
        offset, shape = self.members[key][member]
        return held[1][offset : offset + shape.numel()].view(shape)

    def drop(self, key: int) -> None:
        """Free the unit held for the forward when it is ``key``."""
        held = self.held["forward"]
        if held is not None and held[0] == key:
            self.held["forward"] = None

    def settle(self) -> None:
        """Free the held units, then take part in rounds, needing nothing, until a round in which no process
        needs anything."""
        self.held = {"forward": None, "backward": None}
        while self._round(IDLE)[0]:
            pass


class _GatheredLinear(torch.autograd.Function):
    """``F.linear`` with the weight gathered in the forward and again in the backward (nothing of it saved)."""

    @staticmethod
    def forward(ctx, x: Tensor, bias: Tensor | None, layer: "ShardedLinear") -> Tensor:
        ctx.layer = layer
        return F.linear(x, layer.gathered("forward").to(x.dtype), bias)

    @staticmethod
    def backward(ctx, grad: Tensor):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        weight = ctx.layer.gathered("backward")
        return grad.matmul(weight.to(grad.dtype)), None, None


class ShardedLinear(nn.Module):
    """A frozen ``nn.Linear`` whose weight lives in a unit sliced across the processes (:class:`Gatherer`)."""

    def __init__(self, linear: nn.Linear, gatherer: Gatherer, key: int, member: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = linear.bias  # frozen, whole on every process
        self.gatherer, self.key, self.member = gatherer, key, member

    @property
    def weight(self) -> Tensor:
        """This process's slice of the unit (its device and dtype are the weight's; its shape is not)."""
        return self.gatherer.shards[self.key]

    def gathered(self, phase: str) -> Tensor:
        return self.gatherer.weight(self.key, self.member, phase)

    def forward(self, x: Tensor) -> Tensor:
        return _GatheredLinear.apply(x, self.bias, self)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, sharded 1/{self.gatherer.world}"


def _shard_embedding(embedding: nn.Embedding, gatherer: Gatherer, key: int, member: int) -> None:
    """The embedding's weight taken from its unit before its forward and dropped after it (an index lookup of a
    frozen table needs no weight in the backward); its own forward (a scale, a padding index) is kept."""
    del embedding._parameters["weight"]
    embedding.weight = gatherer.shards[key]

    def gather(module, args):
        module.weight = gatherer.weight(key, member, "forward")

    def drop(module, args, output):
        module.weight = gatherer.shards[key]

    embedding.register_forward_pre_hook(gather)
    embedding.register_forward_hook(drop)


def _frozen(module: nn.Module) -> bool:
    return all(not p.requires_grad for p in module.parameters(recurse=False))


def _block(model: nn.Module, path: str) -> str:
    """The unit's name of the module at ``path``: its ancestor that is an element of the first ``ModuleList`` on
    the way down (a decoder layer), else ``path`` itself."""
    parts = path.split(".")
    for i in range(1, len(parts)):
        if isinstance(model.get_submodule(".".join(parts[:i])), nn.ModuleList):
            return ".".join(parts[: i + 1])
    return path


def shard_frozen(root: nn.Module, group, rank: int, world: int, device: torch.device | str | None = None) -> Gatherer:
    """Shard the frozen ``Linear`` and ``Embedding`` weights inside the peft models under ``root`` (the team's
    bases, a critic's own base) across the ``world`` processes of ``group``, one unit per decoder layer and one
    per weight outside the layers; this process keeps slice ``rank`` of each, on ``device`` (default: where the
    weights are; a base loaded on the CPU puts only its slices on a GPU). Call on every process, with the same
    ``root``. Returns (and activates) the process's :class:`Gatherer`."""
    global _ACTIVE
    from peft import PeftModel

    models = [m for m in root.modules() if isinstance(m, PeftModel)]
    if device is None:
        device = next(iter(models[0].parameters())).device if models else torch.device("cpu")
    gatherer = Gatherer(group, rank, world, device)
    units: dict[tuple[int, str], list] = {}  # (model, block) -> [(parent, name, child)] in model order
    for m, model in enumerate(models):
        for path, parent in model.named_modules():
            for name, child in parent.named_children():
                full = f"{path}.{name}" if path else name
                if "lora_" in full:  # the adapters: trained, whole on every process
                    continue
                if (type(child) is nn.Linear or isinstance(child, nn.Embedding)) and _frozen(child):
                    units.setdefault((m, _block(model, full)), []).append((parent, name, child))
    where: dict[int, tuple[int, int]] = {}  # id of a weight -> (unit, member): tied weights are one
    for (m, block), entries in units.items():
        weights = [c.weight for _, _, c in entries if id(c.weight) not in where]
        if not weights:
            continue
        key = gatherer.register(weights)
        for member, w in enumerate(weights):
            where[id(w)] = (key, member)
    keys = {unit: {where[id(c.weight)][0] for _, _, c in entries} for unit, entries in units.items()}
    for entries in units.values():
        for parent, name, child in entries:
            key, member = where[id(child.weight)]
            if isinstance(child, nn.Embedding):
                _shard_embedding(child, gatherer, key, member)
            else:
                setattr(parent, name, ShardedLinear(child, gatherer, key, member))
    for (m, block), unit_keys in keys.items():  # a unit held for a forward is freed when its block's forward ends
        models[m].get_submodule(block).register_forward_hook(
            lambda mod, args, out, unit_keys=tuple(unit_keys): [gatherer.drop(k) for k in unit_keys] and None
        )
    _ACTIVE = gatherer
    return gatherer


def release() -> None:
    """Forget this process's gatherer (the end of a run; tests)."""
    global _ACTIVE
    _ACTIVE = None
