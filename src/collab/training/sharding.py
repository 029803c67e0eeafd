"""``--trainer.strategy fsdp``: Lightning's DDP with the team's frozen base sharded across the processes.

:class:`ShardedBaseStrategy` is :class:`~lightning.pytorch.strategies.DDPStrategy` (adapters, heads and their
optimizer states replicated, their gradients all-reduced once per optimizer step) whose processes each keep
``1/world`` of the frozen base's ``Linear`` and ``Embedding`` weights and gather a layer only while it
computes (:mod:`collab.runtime.sharded` says how, and why not Lightning's own ``FSDPStrategy``). It runs on
CPU (gloo) and GPU (NCCL) alike. ``--trainer.strategy fsdp`` names it (:func:`alias`): Lightning's own FSDP
needs a GPU and every process running the same forwards, which collab's processes do not.
"""

from __future__ import annotations

import sys

from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

NAME = "collab_fsdp"


class ShardedBaseStrategy(DDPStrategy):
    """DDP whose frozen base is sharded across the processes (:func:`collab.runtime.sharded.shard_frozen`)."""

    strategy_name = NAME

    def setup(self, trainer) -> None:
        from collab.runtime import sharded

        if self.world_size > 1 and sharded.active() is None:  # the team exists (configure_model); DDP wraps it next
            import torch.distributed as dist

            group = dist.new_group(backend=dist.get_backend())
            before = sum(p.numel() * p.element_size() for p in self.lightning_module.parameters())
            gatherer = sharded.shard_frozen(
                self.lightning_module, group, self.global_rank, self.world_size, self.root_device
            )
            after = sum(p.numel() * p.element_size() for p in self.lightning_module.parameters())
            kept = after + gatherer.local_bytes()
            if self.global_rank == 0:
                print(
                    f"fsdp: the frozen base sharded across {self.world_size} processes: each keeps "
                    f"{kept / 2**20:.1f} of {before / 2**20:.1f} MiB of weights, in {len(gatherer.shards)} units "
                    "gathered as used (one per decoder layer, the embedding, the output head; adapters, heads and "
                    "norms whole)",
                    file=sys.stderr,
                    flush=True,
                )
        super().setup(trainer)

    def load_device(self) -> str:
        """Where the team's bases are loaded (``CollabModule.build``): the CPU when the processes are several (each
        process's slice alone goes to its device: a GPU never holds a whole base), else the process's device."""
        return "cpu" if self.world_size > 1 else str(self.root_device)

    def teardown(self) -> None:
        from collab.runtime import sharded

        sharded.release()
        super().teardown()


def check(strategy, module) -> None:
    """What a sharded base cannot be, as one-line UserErrors before the processes start: quantized (bitsandbytes'
    4/8-bit layers are not sliced), beside full-parameter agents (their trained copies are not sliced:
    :mod:`collab.policy.full`) or decoded by vLLM (which holds a whole copy of the base of its own)."""
    from collab.errors import require

    if not isinstance(strategy, ShardedBaseStrategy):
        return
    quantization = getattr(module.base, "quantization", "none")
    require(
        quantization == "none",
        f"--trainer.strategy fsdp shards a float base; --model.base.quantization is "
        f"{quantization}: use --trainer.strategy ddp with a quantized base, or fsdp with "
        "--model.base.quantization none",
    )
    listed = getattr(module, "agent_specs", None) or [getattr(module, "agent_defaults", None)]  # null: the block's
    whole = [i for i, spec in enumerate(listed) if getattr(spec, "finetune", None) == "full"]
    require(
        not whole,
        f"--trainer.strategy fsdp shards the frozen base, not what trains; model.agents[{whole[0] if whole else 0}] "
        "trains a whole copy of its base (finetune: full), which every process would hold whole: use "
        "--trainer.strategy ddp (each process holds every full agent), or finetune: lora",
    )
    require(
        getattr(module, "engine", "torch") == "torch",
        "--trainer.strategy fsdp shards the base that collab's torch "
        "engine decodes with; --model.engine vllm keeps a whole copy in vLLM: use --model.engine torch, or ddp",
    )


StrategyRegistry.register(
    NAME, ShardedBaseStrategy, description="DDP with the frozen base sharded (collab)", override=True
)

ALIASES = ("fsdp",)
"""What ``--trainer.strategy`` may say for :class:`ShardedBaseStrategy` besides its own name."""


def alias(argv: list[str]) -> list[str]:
    """``argv`` with ``--trainer.strategy fsdp`` read as collab's sharded strategy (``collab_fsdp``)."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--trainer.strategy" and i + 1 < len(out) and out[i + 1] in ALIASES:
            out[i + 1] = NAME
        elif arg.startswith("--trainer.strategy=") and arg.split("=", 1)[1] in ALIASES:
            out[i] = f"--trainer.strategy={NAME}"
    return out
