"""``--trainer.strategy fsdp``: torch's FSDP2 (``torch.distributed.fsdp.fully_shard``) through Lightning's
``ModelParallelStrategy``, every weight of the team sharded across the processes.

:class:`FSDP2Strategy` is Lightning's :class:`~lightning.pytorch.strategies.ModelParallelStrategy` with a
data-parallel mesh of every process (no tensor parallelism) and one-file checkpoints in DDP's format, written by
rank 0 and read by every rank (:mod:`collab.training.fsdp_checkpoint`): a run resumes with any number of processes
and under either strategy. Before Lightning sets the module up, each model
of the team (every base a team's LoRA agents share, every full agent's own copy, a critic's own base) is sharded
with ``fully_shard``: each decoder layer a unit, then the model itself (the embeddings, the final norm, the output
head): weights, gradients and AdamW's moments are ``1/N`` per process (DTensors). What no model holds (value heads,
critic heads) stays whole on every process, its gradients averaged once per optimizer step
(:func:`collab.runtime.collectives.average_gradients`).

Lightning 2.6's ``ModelParallelStrategy`` accepts ``accelerator=cpu`` with gloo (its ``FSDPStrategy``, FSDP1,
refuses a CPU); manual optimization, ``configure_model`` and one-file checkpoints
(``save_distributed_checkpoint=False``) work on CPU. Every process must run the same forwards of the sharded models
in the same order (FSDP2 gathers each layer inside its forward): :mod:`collab.runtime.lockstep` makes it so.
"""

from __future__ import annotations

import sys

from lightning.fabric.utilities.optimizer import _optimizer_to_device
from lightning.pytorch.strategies import ModelParallelStrategy, Strategy, StrategyRegistry
from torch import nn

from collab.training import fsdp_checkpoint

NAME = "collab_fsdp"


class FSDP2Strategy(ModelParallelStrategy):
    """``ModelParallelStrategy`` (FSDP2 only: the data-parallel mesh spans every process) sharding the team's models
    before Lightning sets the module up (:func:`shard_models`), its one-file checkpoints DDP's
    (:mod:`collab.training.fsdp_checkpoint`; ``save_distributed_checkpoint=True`` keeps Lightning's folder)."""

    strategy_name = NAME

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("save_distributed_checkpoint", False)  # one file: resumes at any world size
        super().__init__(**kwargs)
        self.lockstep = None

    @property
    def shards(self) -> int:
        """The processes each model of the team is split across: every process (the memory checks count ``1/shards``
        of each model, :func:`collab.runtime.projection.sharded_bytes`)."""
        return self.world_size

    def setup_environment(self) -> None:
        # FSDP2 over every process: data_parallel_size is the world, tensor_parallel_size 1 (Lightning's "auto" would
        # make the processes of one node a tensor-parallel group)
        self._data_parallel_size, self._tensor_parallel_size = "auto", 1
        super().setup_environment()

    def _setup_distributed(self) -> None:
        super()._setup_distributed()
        self._data_parallel_size = self.world_size  # setup_environment reads it next (after the processes exist)

    def setup(self, trainer) -> None:
        if self.world_size > 1 and self.lockstep is None:
            self.lockstep = shard_models(self.lightning_module, self.device_mesh["data_parallel"], self.root_device)
        super().setup(trainer)

    def teardown(self) -> None:
        from collab.runtime import lockstep

        lockstep.activate(None)
        super().teardown()

    # -- one-file checkpoints in DDP's format (collab.training.fsdp_checkpoint) ------------------------------------
    @property
    def lightning_restore_optimizer(self) -> bool:
        return not self._save_distributed_checkpoint  # load_optimizer_state_dict below, after load_checkpoint

    def lightning_module_state_dict(self) -> dict:
        if self._save_distributed_checkpoint:
            return super().lightning_module_state_dict()
        state = fsdp_checkpoint.model_state(self.lightning_module)
        return state if self.is_global_zero else {}

    def optimizer_state(self, optimizer) -> dict:
        if self._save_distributed_checkpoint:
            return super().optimizer_state(optimizer)
        state = fsdp_checkpoint.optimizer_state(getattr(optimizer, "_optimizer", optimizer))
        return state if self.is_global_zero else {}

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options=None) -> None:
        if self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        # rank 0 writes, no collective (ModelParallelStrategy broadcasts the path first): a stop inside a step
        # writes the step before's snapshot on rank 0 alone (collab.training.resume.ModelCheckpoint)
        Strategy.save_checkpoint(self, checkpoint, filepath, storage_options)

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict:
        if self._save_distributed_checkpoint:
            return super().load_checkpoint(checkpoint_path, weights_only)
        return Strategy.load_checkpoint(self, checkpoint_path, weights_only)  # the file; its tensors below

    def load_model_state_dict(self, checkpoint, strict: bool = True) -> None:
        if not self._save_distributed_checkpoint:
            fsdp_checkpoint.load_model_state(self.lightning_module, checkpoint["state_dict"], strict)

    def load_optimizer_state_dict(self, checkpoint) -> None:
        if self._save_distributed_checkpoint:
            return
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
            fsdp_checkpoint.load_optimizer_state(optimizer, state)
            _optimizer_to_device(optimizer, self.root_device)


def decoder_layers(model: nn.Module) -> nn.ModuleList | None:
    """The model's decoder layers: its first ``nn.ModuleList`` (None: it has none)."""
    return next((m for m in model.modules() if isinstance(m, nn.ModuleList)), None)


def team_models(root: nn.Module) -> list[nn.Module]:
    """The models under ``root`` that are sharded, in module order (the same on every process): each ``PeftModel``
    and each transformers model that no ``PeftModel`` (or other such model) holds."""
    from peft import PeftModel
    from transformers import PreTrainedModel

    found: list[tuple[str, nn.Module]] = []
    for name, module in root.named_modules():
        if not isinstance(module, (PeftModel, PreTrainedModel)):
            continue
        if any(name.startswith(f"{other}.") for other, _ in found):
            continue
        found.append((name, module))
    return [m for _, m in found]


def shard_models(root: nn.Module, mesh, device) -> object:
    """``fully_shard`` each model of :func:`team_models` (each decoder layer, then the model), register it with this
    process's :class:`~collab.runtime.lockstep.Lockstep` (activated) and return it."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from collab.runtime import lockstep

    models = team_models(root)
    check_layers(models, dist.get_world_size())
    before = sum(p.numel() * p.element_size() for p in root.parameters())
    step = lockstep.Lockstep(dist.new_group(backend=dist.get_backend()), dist.get_rank(), dist.get_world_size(), device)
    for model in models:
        layers = decoder_layers(model)
        for layer in layers if layers is not None else []:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
        model.set_reduce_scatter_unused_params(True)  # ranks train different agents' adapters
        # no collective inside autograd's backward: the lockstep gathers before it, reduces after (Lockstep.backward)
        model.set_requires_gradient_sync(False)
        model.set_reshard_after_backward(False)
        step.add(model)
    lockstep.activate(step)
    after = sum(lockstep.local(p).numel() * p.element_size() for p in root.parameters())
    if dist.get_rank() == 0:
        print(
            f"fsdp: {len(models)} models sharded across {dist.get_world_size()} processes (FSDP2, one unit per decoder "
            f"layer): each keeps {after / 2**20:.1f} of {before / 2**20:.1f} MiB of weights",
            file=sys.stderr,
            flush=True,
        )
    return step


def check(strategy, module, world: int = 1, env=None) -> None:
    """What FSDP2 cannot shard, as one-line UserErrors before the processes start: a quantized base (bitsandbytes'
    4/8-bit weights are not DTensors), more processes (``world``) than a base of the team (on ``env``) has decoder
    layers (:func:`check_base_layers`)."""
    from collab.errors import require

    if not isinstance(strategy, FSDP2Strategy):
        return
    quantization = getattr(module.base, "quantization", "none")
    require(
        quantization == "none",
        f"--trainer.strategy fsdp shards float weights; --model.base.quantization is {quantization}: use "
        "--trainer.strategy ddp with a quantized base, or fsdp with --model.base.quantization none",
    )
    if env is not None and world > 1:
        check_base_layers(module, env, world)


LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
"""Where a ``config.json`` says its number of decoder layers (Llama and most; GPT-2; others)."""


def check_base_layers(module, env, world: int) -> None:
    """:func:`check_layers` before the processes start, for every base the team on ``env`` loads (the agents', a
    critic's own), its layers read from its ``config.json`` without the weights (a base whose config is not at hand
    is checked in the processes' setup, by :func:`check_layers`)."""
    from collab.errors import require
    from collab.policy.models import base_config

    names = [spec.base or module.base.name for spec in module.team_specs(env)] or [module.base.name]
    critic = getattr(getattr(module, "critic_spec", None), "base", None)  # the actor-critics' critic base of its own
    names += [critic] if critic else []
    for name in dict.fromkeys(names):
        values = base_config(name) or {}
        count = next((values[k] for k in LAYER_KEYS if isinstance(values.get(k), int)), None)
        if count is not None:
            require(count >= world, _too_many(world, f"the base {name}", count))


def check_layers(models: list[nn.Module], world: int) -> None:
    """More processes than a model has decoder layers: one line (each process would hold no layer of it)."""
    from collab.errors import require

    for model in models:
        layers = decoder_layers(model)
        count = len(layers) if layers is not None else 0
        require(count >= world, _too_many(world, type(model).__name__, count))


def _too_many(world: int, model: str, count: int) -> str:
    return (
        f"--trainer.strategy fsdp over {world} processes shards each decoder layer of {model} ({count} layers): "
        f"use at most {count} processes (--trainer.devices), or ddp"
    )


StrategyRegistry.register(NAME, FSDP2Strategy, description="FSDP2 on every model of the team (collab)", override=True)

ALIASES = ("fsdp",)
"""What ``--trainer.strategy`` may say for :class:`FSDP2Strategy` besides its own name."""


def alias(argv: list[str]) -> list[str]:
    """``argv`` with ``--trainer.strategy fsdp`` read as collab's FSDP2 strategy (``collab_fsdp``)."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--trainer.strategy" and i + 1 < len(out) and out[i + 1] in ALIASES:
            out[i + 1] = NAME
        elif arg.startswith("--trainer.strategy=") and arg.split("=", 1)[1] in ALIASES:
            out[i] = f"--trainer.strategy={NAME}"
    return out
