"""The run's team rebuilt as ``collab.fit`` built it (for ``python -m collab.export``), the update its adapters
were saved at, and the trained parts that are not agents: the export leaves those in the run's checkpoint."""

from __future__ import annotations

from pathlib import Path


def build_module(algo: str, config_file: Path):
    """The run's LightningModule with its team built (CPU, unquantized, collab's engine) and its env."""
    from collab.cli.output import release_logs
    from collab.fit import build_cli

    overrides = [
        "--trainer.logger",
        "false",
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "1",
        "--trainer.num_nodes",
        "1",
        "--trainer.strategy",
        "auto",
        "--model.base.device",
        "cpu",
        "--model.base.quantization",
        "none",
        "--model.base.gradient_checkpointing",
        "false",
        "--model.engine",
        "torch",
    ]
    cli = build_cli(algo, ["--config", str(config_file), *overrides])
    module, env = cli.model, cli.datamodule.env
    module.build(env)
    release_logs(show=False)  # the run's start-up messages say nothing about an export
    return module, env


def checkpoint_step(run_dir: Path, team) -> int | None:
    """The global step of ``checkpoints/last.ckpt`` when its agents' weights (adapters, full agents' models) are exactly
    the team's (as loaded from the exported folder), else ``None``."""
    import torch

    path = run_dir / "checkpoints" / "last.ckpt"
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        state = checkpoint["state_dict"]
        agents = {id(p) for i in range(len(team)) for p in team.adapter_parameters(i)}
        mine = [(f"team.{n}", p) for n, p in team.named_parameters() if id(p) in agents]
        same = bool(mine) and all(k in state and torch.equal(state[k], p.detach().cpu()) for k, p in mine)
        return int(checkpoint["global_step"]) if same else None
    except Exception:  # no checkpoint, or not one of this team: the step is unknown
        return None


def left_out(module) -> list[dict]:
    """The trained parts that are not agents (critics, value heads): what they are and where their weights are."""
    from collab.algos.llm_critics import Critics

    parts = []
    for name, child in module.named_children():
        critics = isinstance(child, Critics)
        trained = (
            [p for j in range(len(child)) for p in child.parameters_of(j)]
            if critics
            else [p for p in child.parameters() if p.requires_grad]
        )
        if name == "team" or not trained:
            continue
        entry = {
            "part": name,
            "kind": type(child).__name__,
            "parameters": sum(p.numel() for p in trained),
            "weights": f"checkpoints/last.ckpt, state_dict keys {name}.*",
        }
        if critics:  # LLM critics: an adapter (or an agent's) and a value head each, on a base
            entry["critics"] = []
            for j, (adapter, base) in enumerate(zip(child.names, child.bases)):
                entry["critics"].append(
                    {
                        "name": f"critic{j}",
                        "mode": child.mode,
                        "base": base.name,
                        "value_head": f"{name}.heads.{j}",
                        "adapter": f"{adapter} (the agent's own)" if child.spec.share_agent_adapter else adapter,
                    }
                )
            if not child.spec.share_agent_adapter and any(key not in child.own for key in child.keys):
                entry["weights"] += " and team.models.*.critic<j> (the critics' adapters on the agents' base)"
        parts.append(entry)
    return parts
