"""Lockstep forwards of FSDP2-sharded models (``--trainer.strategy fsdp``): every process runs the same sequence of
collective forwards whatever its data.

Under FSDP2 (``torch.distributed.fsdp.fully_shard``) each decoder layer of a sharded model is all-gathered inside its
forward (and again in the backward), a collective: every process must run the same forwards of the same models in
the same order. collab's processes do not by themselves (each decodes its own tasks to their own lengths, scores its
own responses in its own number of forwards). Here each forward of a sharded *root* (a model of the pool that
``fully_shard`` wrapped last: :func:`collab.training.fsdp.shard_models`) is a *round*: every process posts the root it
is about to run (or that it is idle), in one small all-gather; then, for every posted root in one order, the
processes that posted it run their forward and the others a stand-in forward of that root (one token, the same grad
mode), whose output they keep as a zero-weight term of their next backward pass (:meth:`Lockstep.take_pending`: it
gives the root's weights zero gradients; the backward's collectives are :meth:`Lockstep.backward`'s). A process
with nothing to run (its rollout ended first, it is about to enter another collective) serves the others' rounds
until every process is idle (:meth:`Lockstep.settle`, called before each of collab's own collectives, as
transformers' ``generate(synced_gpus=True)`` keeps a finished process stepping).

The backward is not left to FSDP2's hooks: autograd orders each process's backward by the graph that process built
(a stand-in's is not the real forward's), so with two sharded models in one backward pass the processes' gathers and
reduce-scatters would pair different units. :meth:`Lockstep.backward` instead gathers, in registration order, every
root that took part in a round with gradients since the last pass (the same roots on every process), runs the
backward with no collective inside it (:func:`collab.training.fsdp.shard_models` turns off FSDP2's gradient sync and
its reshard after backward), then reduce-scatters each unit's gradients and reshards it, in the same order.

With one process nothing here runs (no lockstep is active).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

IDLE = -1
"""What a process posts in a round when it runs no forward."""

_ACTIVE: "Lockstep | None" = None


def active() -> "Lockstep | None":
    """This process's lockstep when its models are sharded (FSDP2 with more than one process), else None."""
    return _ACTIVE


def settle() -> None:
    """Serve the other processes' forwards until every process is idle (no-op when nothing is sharded): call before
    any other collective, so that no process waits in it while another waits in a forward."""
    if _ACTIVE is not None:
        _ACTIVE.settle()


def forget() -> None:
    """Drop the rounds with gradients whose graphs were dropped unused (a probe's forwards) from the next backward
    pass's gathers (no-op when nothing is sharded): :meth:`Lockstep.forget`, a collective."""
    if _ACTIVE is not None:
        _ACTIVE.forget()


def pending() -> Tensor | None:
    """The zero-weight sum of the stand-in forwards this process ran with gradients since the last call (None: none):
    add it to the loss of the backward pass they belong to (:func:`collab.runtime.collectives.backward_passes`)."""
    return _ACTIVE.take_pending() if _ACTIVE is not None else None


def whole(tensor: Tensor) -> Tensor:
    """``tensor`` whole: a DTensor (this process's shard of an FSDP2-sharded weight) all-gathered, anything else as
    it is. The gather is a collective: every process calls it for the same tensors in the same order."""
    gather = getattr(tensor, "full_tensor", None)
    return gather() if gather is not None else tensor


def whole_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """:func:`whole` of every tensor of ``state`` (a ``state_dict(keep_vars=True)``), gathered in its order; keys
    that hold one tensor (a tied output head) get one whole tensor."""
    gathered: dict[int, Tensor] = {}
    with torch.no_grad():
        for tensor in state.values():
            if id(tensor) not in gathered:
                gathered[id(tensor)] = whole(tensor).detach()
    return {key: gathered[id(tensor)] for key, tensor in state.items()}


def local(tensor: Tensor) -> Tensor:
    """This process's part of ``tensor``: a DTensor's local shard (no collective), anything else as it is."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _stand_in_input(root: nn.Module) -> dict:
    """A one-token input for ``root``'s forward (a causal LM: token 0)."""
    return {"input_ids": torch.zeros(1, 1, dtype=torch.long, device=_device(root)), "use_cache": False}


def _device(root: nn.Module) -> torch.device:
    param = next(root.parameters(), None)
    return torch.device("cpu") if param is None else local(param).device


def _output_tensor(out) -> Tensor:
    if isinstance(out, Tensor):
        return out
    logits = getattr(out, "logits", None)
    if logits is not None:
        return logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
        return out[0]
    raise TypeError(f"a stand-in forward returned {type(out).__name__}, not a tensor or a model output")


class Lockstep:
    """The rounds of one process over the sharded roots it registered (:meth:`add`), in registration order (the same
    on every process)."""

    def __init__(self, group, rank: int, world: int, device: torch.device | str = "cpu") -> None:
        self.group, self.rank, self.world, self.device = group, rank, world, torch.device(device)
        self.roots: list[nn.Module] = []
        self.inputs: list[Callable[[nn.Module], dict]] = []
        self._depth = 0  # > 0 inside a root's forward (nested roots run no round of their own) or a stand-in
        self._after: list[int] = []  # the posted codes to serve after this process's own forward
        self._pending: list[Tensor] = []
        self._pending_keys: set[int] = set()  # the roots of the stand-ins in _pending
        self._used: set[int] = set()  # the roots of the rounds with gradients since the last backward
        self.rounds = self.stand_ins = 0  # counters (tests read them)

    def add(self, root: nn.Module, stand_in: Callable[[nn.Module], dict] | None = None) -> int:
        """Register ``root`` (a module ``fully_shard`` wrapped, on every process in the same order); ``stand_in``
        gives the keyword arguments of its one-token forward (default: ``input_ids`` of token 0). Returns its key."""
        key = len(self.roots)
        self.roots.append(root)
        self.inputs.append(stand_in or _stand_in_input)
        # before FSDP2's own pre-forward hook (which all-gathers): prepend
        root.register_forward_pre_hook(lambda m, a, k, key=key: self._pre(key), prepend=True, with_kwargs=True)
        root.register_forward_hook(lambda m, a, o, key=key: self._post(key), always_call=True)
        return key

    # -- rounds -------------------------------------------------------------------------------------
    def _code(self, key: int) -> int:
        return 2 * key + int(torch.is_grad_enabled())

    def _round(self, code: int) -> list[int]:
        import torch.distributed as dist

        mine = torch.tensor([code], dtype=torch.int64, device=self.device)
        posted = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(posted, mine, group=self.group)
        self.rounds += 1
        return sorted({int(p) for p in posted} - {IDLE})

    def _serve(self, code: int) -> None:
        """The stand-in forward of the posted ``code`` (root ``code // 2``; with gradients when ``code`` is odd)."""
        key, grad = divmod(code, 2)
        root = self.roots[key]
        self._depth += 1
        try:
            with torch.set_grad_enabled(bool(grad)):
                out = _output_tensor(root(**self.inputs[key](root)))
            if grad:
                self._pending.append(out.float().sum() * 0.0)
                self._pending_keys.add(key)
                self._used.add(key)
        finally:
            self._depth -= 1
        self.stand_ins += 1

    def _pre(self, key: int) -> None:
        self._depth += 1
        if self._depth > 1:  # a stand-in, or a root inside another root's forward: no round of its own
            return
        code = self._code(key)
        if code % 2:
            self._used.add(key)
        codes = self._round(code)
        for other in codes:
            if other < code:
                self._serve(other)
        self._after = [other for other in codes if other > code]

    def _post(self, key: int) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        after, self._after = self._after, []
        for other in after:
            self._serve(other)

    def settle(self) -> None:
        """Rounds posting nothing, serving the others' forwards, until a round in which no process posted one."""
        while True:
            codes = self._round(IDLE)
            if not codes:
                return
            for code in codes:
                self._serve(code)

    def take_pending(self) -> Tensor | None:
        out, self._pending = self._pending, []
        self._pending_keys.clear()
        return sum(out[1:], out[0]) if out else None

    def forget(self) -> None:
        """Keep for the next backward pass only the roots some process holds a stand-in's graph of: the other rounds
        with gradients since the last pass ran forwards whose graphs were dropped unused (the micro-batch probe's,
        :func:`collab.runtime.memory.bytes_per_token`), and gathering their roots whole would only cost memory. Call
        it with no graph of a real forward alive. A collective (every process settles, then sums which roots have a
        stand-in's graph): the same roots stay on every process."""
        import torch.distributed as dist

        self.settle()
        held = torch.zeros(len(self.roots), dtype=torch.int64, device=self.device)
        for key in self._pending_keys:
            held[key] = 1
        dist.all_reduce(held, group=self.group)
        self._used = {key for key in self._used if int(held[key])}

    def backward(self, run: Callable[[], object]) -> None:
        """One backward pass (``run``: this process's backward, or nothing) with every collective in code order:
        the roots of the rounds with gradients since the last call (the same on every process: each such round ran
        a forward with gradients everywhere) all-gathered unit by unit, ``run()``, then each unit's gradients
        reduce-scattered (averaged; zeros for a parameter this process gave none) and the unit resharded, in the
        same order. Whole weights of those roots and whole gradients of their trainable weights live until then."""
        roots = [self.roots[key] for key in sorted(self._used)]
        self._used.clear()
        units = [unit for root in roots for unit in _units(root)]
        for unit in units:
            unit.unshard()
        run()
        for unit in units:
            _reduce(unit)
        for unit in units:
            for group in unit._get_fsdp_state()._fsdp_param_groups:
                group.finalize_backward()
        for root in roots:  # FSDP2 keeps each reduce-scatter's input until the backward's end (its final callback)
            state = root._get_fsdp_state()
            context = state._comm_ctx
            for reduced in context.reduce_scatter_states:
                if reduced.event is not None:
                    state._device_handle.current_stream().wait_event(reduced.event)
            context.reduce_scatter_states.clear()


def _units(root: nn.Module) -> list[nn.Module]:
    """The FSDP2 units under ``root`` (itself first), in module order."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in root.modules() if isinstance(m, FSDPModule)]


def _reduce(unit) -> None:
    """FSDP2's post-backward of ``unit`` with its gradient sync and reshard on: the reduce-scatter of the unsharded
    gradients the backward left (FSDP2's own, as inside a backward), then the reshard; both off again after."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    for group in unit._get_fsdp_state()._fsdp_param_groups:
        group.reduce_grads = group.all_reduce_grads = group.reshard_after_backward = True
        try:
            group.post_backward()
        finally:
            group.reduce_grads = group.all_reduce_grads = group.reshard_after_backward = False
            group._training_state = TrainingState.IDLE


def activate(lockstep: Lockstep | None) -> None:
    """Make ``lockstep`` this process's (None: none)."""
    global _ACTIVE
    _ACTIVE = lockstep
