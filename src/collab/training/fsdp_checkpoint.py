"""The checkpoint of a sharded run (``--trainer.strategy fsdp``) in DDP's format: one file, written by rank 0, that
holds what a DDP run's holds, so that either strategy resumes the other's at any number of processes.

- **Weights**: the trainable parameters whole (each FSDP2 shard gathered; ``CollabModule.on_save_checkpoint`` keeps
  the trainable ones of a DDP checkpoint too). The frozen base is not gathered.
- **Optimizer**: ``optimizer.state_dict()``, DDP's: the state keyed by each parameter's index in the optimizer's
  groups, the moments of a sharded parameter gathered whole, and no state for a parameter that has not been updated.
  torch's ``get_optimizer_state_dict`` (what Lightning's ``ModelParallelStrategy`` saves with) first takes an
  optimizer step at learning rate 0 when the optimizer has no state yet (``_init_optim_state``): AdamW's step count
  becomes 1 with zero moments, in the checkpoint and in the running optimizer, and the first real update after it
  is AdamW's second (bias corrections ``1 - beta**2``: about 0.74 of the first step's size). Its loading does the
  same before it loads. Neither is called here.
- **Loading**: each rank reads the file and keeps its own shard of every sharded tensor (no collective); the
  optimizer's state goes through ``optimizer.load_state_dict`` as under DDP.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.tensor import DTensor, distribute_tensor


def whole(t: torch.Tensor) -> torch.Tensor:
    """``t`` whole on the CPU when it is a shard (a collective: every rank gathers the same tensors in the same
    order), else ``t`` itself (as a DDP checkpoint references it)."""
    return t.full_tensor().cpu() if isinstance(t, DTensor) else t


def shard_like(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``full`` cut as ``param`` is sharded (this rank's part, on its device; each rank holds ``full``: no
    collective), or ``full`` itself for a parameter that is not sharded."""
    if not isinstance(param, DTensor):
        return full
    return distribute_tensor(full.to(param.device), param.device_mesh, param.placements, src_data_rank=None)


def model_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters, whole (the shards gathered, on every rank in module order)."""
    return {name: whole(p.detach()) for name, p in module.named_parameters() if p.requires_grad}


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` with every sharded state tensor gathered whole (in index order on every rank)."""
    saved = optimizer.state_dict()
    state = {
        index: {key: whole(value) for key, value in saved["state"][index].items()} for index in sorted(saved["state"])
    }
    return {"state": state, "param_groups": saved["param_groups"]}


def load_model_state(module: torch.nn.Module, saved: Mapping[str, torch.Tensor], strict: bool) -> None:
    """``module.load_state_dict(saved)`` with each tensor of a sharded parameter cut to this rank's shard."""
    params = dict(module.named_parameters())
    module.load_state_dict(
        {name: shard_like(value, params[name]) if name in params else value for name, value in saved.items()},
        strict=strict,
    )


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: Mapping[str, Any]) -> None:
    """``optimizer.load_state_dict(saved)`` with each state tensor of a sharded parameter (its shape) cut to this
    rank's shard. Indices pair with parameters as torch pairs them: the groups' parameters in order."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    indices = [i for group in saved["param_groups"] for i in group["params"]]
    by_index = dict(zip(indices, params))
    state = {}
    for index, values in saved["state"].items():
        param = by_index.get(index)
        state[index] = {
            key: shard_like(value, param)
            if param is not None and isinstance(value, torch.Tensor) and value.shape == param.shape
            else value
            for key, value in values.items()
        }
    optimizer.load_state_dict({**saved, "state": state})
