"""What every collab algorithm shares: the team, optimizers, checkpoints and logging.

A :class:`CollabModule` builds its :class:`~collab.policy.team.AgentTeam` in ``configure_model`` from the
datamodule's environment (one agent per environment role; ``agents`` overrides a role's defaults), so
the same config trains on any environment. Optimization is manual: one ``training_step`` takes a
freshly generated rollout from the dataloader iterator (no prefetching, so the batch is on-policy) and
runs the algorithm's epochs of minibatch updates on it. Lightning's ``global_step`` therefore counts
optimizer updates, as ``trainer.max_steps`` does.

There is one optimizer with a parameter group per agent (and per critic), each with its own learning
rate: this keeps DDP, FSDP and DeepSpeed (single optimizer) open. Checkpoints hold only trainable
weights (adapters and heads), not the frozen bases, and what makes a resumed run repeat the
uninterrupted one bitwise: ``rollouts`` and every process's random state (:mod:`collab.resume`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import lightning as L
import torch

from collab.distributed import global_means
from collab.envs import Env
from collab.errors import UserError, require
from collab.policy.models import BaseConfig
from collab.resume import gather_per_rank, pick_rank, rng_state, set_rng_state
from collab.rollout.trajectory import RolloutBatch
from collab.policy.team import AgentSpec, AgentTeam, check_agents


def resolve_agents(env: Env, agents: list[AgentSpec] | None) -> list[AgentSpec]:
    """One spec per environment role: the user's spec with empty fields filled from the role."""
    if agents and len(agents) != env.n_agents:
        raise UserError(f"{len(agents)} agents configured but env {env.name!r} has {env.n_agents} roles "
                        f"({', '.join(r.name for r in env.roles)}); give {env.n_agents} agents or none")
    out = []
    for i, role in enumerate(env.roles):
        spec = copy.deepcopy(agents[i]) if agents else AgentSpec()
        spec.role = spec.role or role.name
        spec.system_prompt = spec.system_prompt if spec.system_prompt is not None else role.system_prompt
        if spec.choices is None and role.choices is not None:
            spec.choices = list(role.choices)
        if spec.sampling.max_new_tokens is None and role.max_new_tokens is not None:
            spec.sampling = replace(spec.sampling, max_new_tokens=role.max_new_tokens)
        out.append(spec)
    return out


def token_budget_chunks(lengths: list[int], budget: int | None) -> list[list[int]]:
    """Consecutive index groups of ``lengths`` whose padded size (rows x longest row) stays within
    ``budget`` tokens; a row longer than the budget is a group of its own. ``None``: one group."""
    if budget is None:
        return [list(range(len(lengths)))] if lengths else []
    chunks: list[list[int]] = []
    longest = 0
    for i, n in enumerate(lengths):
        if chunks and (len(chunks[-1]) + 1) * max(longest, n) <= budget:
            chunks[-1].append(i)
            longest = max(longest, n)
        else:
            chunks.append([i])
            longest = n
    return chunks


class CollabModule(L.LightningModule):
    """Base LightningModule of the algorithms."""

    protocol = None
    """The Flex-MG dependency (:class:`~collab.rollout.protocol.Dependency`) the team acts under;
    ``None``: every agent acts at once (MARFT sets it from its ``dependency`` option)."""

    def __init__(self, base: BaseConfig | None = None, agents: list[AgentSpec] | None = None, agent_lr: float = 5e-6,
                 max_new_tokens: int = 128, max_grad_norm: float = 1.0, log_samples_every: int = 10) -> None:
        super().__init__()
        require(agent_lr > 0 and agent_lr != float("inf"), f"model.agent_lr must be > 0, got {agent_lr}")
        require(max_new_tokens >= 1, f"model.max_new_tokens must be >= 1, got {max_new_tokens}")
        check_agents(agents)
        self.base = base or BaseConfig()
        self.base.validate()
        self.agent_specs = agents
        self.agent_lr, self.max_new_tokens = agent_lr, max_new_tokens
        self.max_grad_norm, self.log_samples_every = max_grad_norm, log_samples_every
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints hold trainable weights only
        self.team: AgentTeam | None = None
        self.env: Env | None = None
        self.rollouts = 0
        self._resume_rng: dict[str, Any] | None = None  # put back before the first rollout after a load

    # -- construction ------------------------------------------------------------------------------
    def build(self, env: Env) -> None:
        """Create the team for ``env`` (called by ``configure_model``; call it yourself in a notebook)."""
        if self.team is not None:
            return
        self.env = env
        base = self.base
        if base.device == "auto" and self._trainer is not None:
            base = replace(base, device=str(self.trainer.strategy.root_device))
        self.team = AgentTeam(self.team_specs(env), base)
        self.build_extra(env)

    def team_specs(self, env: Env) -> list[AgentSpec]:
        """The team's agents: one per environment role (MAPoRL adds one per (turn, role))."""
        return resolve_agents(env, self.agent_specs)

    def build_extra(self, env: Env) -> None:
        """Hook for critics and heads."""

    def configure_model(self) -> None:
        self.build(self.trainer.datamodule.env)

    def param_groups(self) -> list[dict[str, Any]]:
        assert self.team is not None
        return [{"params": self.team.adapter_parameters(i), "lr": spec.lr or self.agent_lr, "name": name}
                for i, (spec, name) in enumerate(zip(self.team.specs, self.team.names))]

    def configure_optimizers(self):
        return torch.optim.AdamW(self.param_groups(), weight_decay=0.0)

    # -- the step ----------------------------------------------------------------------------------
    def rollout(self, env: Env, tasks) -> RolloutBatch:
        """Play ``tasks`` with the current team (called by the RolloutDataModule)."""
        raise NotImplementedError

    def training_step(self, dataloader_iter: Iterator) -> None:
        if self._resume_rng is not None:  # here, not at load: Lightning draws from torch's generator in between
            set_rng_state(self._resume_rng, self.device)
            self._resume_rng = None
        batch, _, _ = next(dataloader_iter)
        self.rollouts += 1
        metrics = self.update(batch)
        self.log_rollout(batch, metrics)

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        raise NotImplementedError

    def skip_update(self) -> None:
        """An update without gradients (no parameter moves; AdamW skips parameters whose grad is None).

        Called when a rollout gives no learning signal (e.g. every group's returns are equal), so that
        ``global_step`` still advances and ``trainer.max_steps`` ends the run.
        """
        opt = self.optimizers()
        opt.zero_grad(set_to_none=True)
        opt.step()

    def optimizer_update(self, loss: torch.Tensor) -> None:
        self.optimizers().zero_grad()
        self.manual_backward(loss)
        self.optimizer_step()

    def optimizer_step(self) -> None:
        """Clip the accumulated gradients (``max_grad_norm``) and take the optimizer step."""
        opt = self.optimizers()
        if self.max_grad_norm and self.max_grad_norm > 0:
            self.clip_gradients(opt, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm")
        opt.step()

    # -- logging -----------------------------------------------------------------------------------
    def log_rollout(self, batch: RolloutBatch, metrics: dict[str, float]) -> None:
        # every rank has its own rollout: log each scalar's mean over the ranks (the global mean, the ranks
        # playing equal shares of the step's tasks); the same values on every rank
        scalars = global_means(self, {**batch.stats, **metrics, "rollout/count": float(self.rollouts)})
        bar = {"reward": scalars.get("reward/return", float("nan")),
               "tok_s": scalars.get("rollout/tokens_per_s", float("nan"))}
        self.log_dict(bar, prog_bar=True, logger=False, on_step=True, batch_size=1)
        self.log_dict(scalars, on_step=True, batch_size=1)
        logger = self.logger
        if logger is not None and batch.examples and (self.rollouts - 1) % max(self.log_samples_every, 1) == 0:
            experiment = getattr(logger, "experiment", None)
            if hasattr(experiment, "add_text"):
                text = "\n\n---\n\n".join(
                    "\n\n".join(f"**{self.team.specs[i].role}** (reward {ex['reward'][i]:.3f}): {r}"
                                for i, r in enumerate(ex["responses"])) for ex in batch.examples)
                experiment.add_text("samples", text, self.global_step)

    # -- checkpoints -------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Trainable weights only, the rollout counter and the random state of every process (a
        collective under DDP: Lightning calls it on every rank)."""
        trainable = {n for n, p in self.named_parameters() if p.requires_grad}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}
        checkpoint["collab"] = {"rollouts": self.rollouts, "agents": [s.role for s in self.team.specs],
                                "rng": gather_per_rank(rng_state(self.device))}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("collab", {})
        self.rollouts = state.get("rollouts", 0)
        rank = self.trainer.global_rank if self._trainer is not None else 0
        self._resume_rng = pick_rank(state["rng"], rank, "random state") if state.get("rng") else None
