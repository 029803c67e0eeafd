"""What every collab algorithm shares: the team, optimizers, checkpoints and the training step.

A :class:`CollabModule` builds its :class:`~collab.policy.team.AgentTeam` in ``configure_model`` from the
datamodule's environment (one agent per environment role, :mod:`collab.algos.agents`; ``agents`` overrides a
role's defaults), so the same config trains on any environment. A step ends by logging its rollout's and its
update's statistics (:mod:`collab.algos.logs`).

The training step (``training_step``: ``rollout`` -> ``prepare`` -> epochs of minibatches -> ``normalizers`` ->
micro-batches -> ``terms``, one backward pass each -> ``accept`` and one optimizer step), its terms and the typed
experience between them (:mod:`collab.rollout.experience`): docs/design.md, *One training step for every
algorithm*. An algorithm's file holds only its paper's parts: ``rollout``, ``prepare``, ``terms`` (and
``normalizers`` where its loss divides by counts or normalizes advantages over the minibatch).

There is one optimizer with a parameter group per agent (and per critic), each with its own learning
rate: this keeps DDP, FSDP and DeepSpeed (single optimizer) open; a full-parameter agent's group is its whole model
(:mod:`collab.policy.full`). Checkpoints hold only trainable weights (adapters and heads, full agents' models), not
the frozen bases, and what makes a resumed run repeat the uninterrupted one bitwise: ``rollouts`` and every
process's random state (:mod:`collab.runtime.rank_state`; :mod:`collab.training.resume` says when they are saved
and restored).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from functools import partial
from typing import Any, Literal

import lightning as L
import torch

from collab import preemption
from collab.algos.agents import resolve_agents
from collab.algos.groups import PPOOptions
from collab.algos.logs import log_rollout
from collab.envs import Env
from collab.errors import require
from collab.policy.full import check_full_agents
from collab.policy.models import BaseConfig
from collab.policy.team import (
    AgentDefaults,
    AgentSpec,
    AgentTeam,
    check_agent_defaults,
    check_agents,
    with_defaults,
)
from collab.policy.vllm_engine import ENGINES, VllmEngine, check_engine, vllm_options
from collab.rollout.experience import Batch, Experience, Normalizers, epochs
from collab.runtime import collectives, lockstep
from collab.runtime.collectives import backward_passes, global_count, minibatch_schedule, reached_max_steps, steps_note
from collab.runtime.memory import budget_bytes, release, release_above, resident_bytes, token_budget_chunks
from collab.runtime.rank_state import gather_per_rank, pick_rank, rng_state, set_rng_state

Term = Callable[[], tuple[torch.Tensor, dict[str, float]]]
"""One backward pass of a micro-batch's loss: it returns its part of the minibatch's loss (already divided by the
minibatch's global normalizers) and its statistics (a micro-batch's statistics are the sum of its terms')."""


def run_term(term: Term, stats: dict[str, float], share: float) -> torch.Tensor:
    """Run ``term``; add its statistics to the minibatch's ``stats``, ``share`` (its micro-batch's part of the
    minibatch) times each, and its loss to ``train/loss``; return the loss, for its backward pass."""
    loss, values = term()
    for key, value in values.items():
        stats[key] = stats.get(key, 0.0) + share * value
    stats["train/loss"] = stats.get("train/loss", 0.0) + float(loss.detach())
    return loss


class CollabModule(L.LightningModule):
    """Base LightningModule of the algorithms."""

    passes_per_model = True
    """Whether each backward pass of an update runs on one model of the team (its terms split per model: a critic's,
    each agent's actor), so that under fsdp a pass gathers one model whole (the start-of-run check counts the
    largest); False: a pass may use every model (all gathered at once)."""
    protocol = None
    """The Flex-MG dependency (:class:`~collab.rollout.protocol.Dependency`) the team acts under;
    ``None``: every agent acts at once (MARFT sets it from its ``dependency`` option)."""
    ppo: PPOOptions | None = None
    """``model.ppo`` (:class:`~collab.algos.groups.PPOOptions`): its ``num_epochs`` and ``minibatch_size`` shape the
    update loop; None (an algorithm without the group, as docs/examples/reinforce.py): one update on the whole
    experience."""

    def __init__(
        self,
        *,
        base: BaseConfig,
        agents: list[AgentSpec] | None,
        agent_defaults: AgentDefaults,
        agent_lr: float,
        max_new_tokens: int,
        max_grad_norm: float,
        log_samples_every: int,
        micro_batch_tokens: int | Literal["auto"] | None,
        micro_batch_memory_gb: float | None,
        decode_memory_gb: float | None,
        engine: str,
        engine_options: dict | None,
    ) -> None:
        """Every option is keyword-only and has no default here: ``conf/base.yaml`` holds each value once, with its
        meaning in the comment above it (``python -m collab.fit`` reads it; :func:`collab.algos.from_config` builds a
        module from it in Python)."""
        super().__init__()
        require(agent_lr > 0 and agent_lr != float("inf"), f"model.agent_lr must be > 0, got {agent_lr}")
        require(max_new_tokens >= 1, f"model.max_new_tokens must be >= 1, got {max_new_tokens}")
        require(
            micro_batch_tokens is None
            or micro_batch_tokens == "auto"
            or (isinstance(micro_batch_tokens, int) and micro_batch_tokens >= 1),
            f"model.micro_batch_tokens must be >= 1, auto or null, got {micro_batch_tokens}",
        )
        for option, gib in (("micro_batch_memory_gb", micro_batch_memory_gb), ("decode_memory_gb", decode_memory_gb)):
            require(
                gib is None or (isinstance(gib, (int, float)) and not isinstance(gib, bool) and 0 < gib < float("inf")),
                f"model.{option} must be > 0 (GiB) or null, got {gib}",
            )
        check_agent_defaults(agent_defaults)
        check_agents(agents)
        agents = None if agents is None else [with_defaults(spec, agent_defaults) for spec in agents]
        listed = agents or [with_defaults(AgentSpec(), agent_defaults)]  # null: every role is the block
        check_full_agents(listed, base)
        require(engine in ENGINES, f"model.engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        require(
            engine == "vllm" or not engine_options,
            f"model.engine_options are settings of --model.engine vllm; the engine is {engine!r}",
        )
        self.engine, self.engine_options = engine, vllm_options(engine_options) if engine == "vllm" else None
        check_engine(engine)
        self.micro_batch_tokens, self.micro_batch_memory_gb = micro_batch_tokens, micro_batch_memory_gb
        self._auto_tokens: int | None = None  # micro_batch_tokens: auto, decided once per run (saved in checkpoints)
        self.decode_memory_gb = decode_memory_gb
        self.base = base
        self.base.validate()
        self.agent_specs, self.agent_defaults = agents, agent_defaults
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
            strategy = self.trainer.strategy
            base = replace(base, device=str(strategy.root_device))
        # fsdp splits each model across its processes: the team's memory check counts 1/shards of it
        shards = getattr(self.trainer.strategy, "shards", 1) if self._trainer is not None else 1
        self.team = AgentTeam(self.team_specs(env), base, shards=shards)
        self.team.decode_memory = budget_bytes(self.team.device, self.decode_memory_gb)
        report = self.team.targets_report()  # what LoRA adapts on each base, what full agents hold: once per run
        if report and (self._trainer is None or self.trainer.is_global_zero):
            print(report, flush=True)
        if self.engine == "vllm":
            self.team.engine = VllmEngine(self.team, self.engine_options)
        self.build_extra(env)

    def team_specs(self, env: Env) -> list[AgentSpec]:
        """The team's agents: one per environment role (MAPoRL adds one per (turn, role))."""
        return resolve_agents(env, self.agent_specs, self.agent_defaults)

    def build_extra(self, env: Env) -> None:
        """Hook for critics and heads."""

    def configure_model(self) -> None:
        self.build(self.trainer.datamodule.env)
        self.train()  # the bases load in eval mode; training runs in train mode (sampling, evaluation: eval)

    def param_groups(self) -> list[dict[str, Any]]:
        assert self.team is not None
        return [
            {"params": self.team.adapter_parameters(i), "lr": spec.lr or self.agent_lr, "name": name}
            for i, (spec, name) in enumerate(zip(self.team.specs, self.team.names))
            if not self.team.is_frozen(i)
        ]

    def configure_optimizers(self):
        return torch.optim.AdamW(self.param_groups(), weight_decay=0.0)

    # -- the step ----------------------------------------------------------------------------------
    def rollout(self, tasks: list[Mapping[str, Any]]) -> Experience:
        """Play ``tasks`` (this rank's share of the step's) in ``self.env`` with the current team: the
        algorithm's protocol."""
        raise NotImplementedError

    def prepare(self, experience: Experience) -> Batch:
        """What the update trains on, fixed once per rollout without gradients: advantages, returns, values
        and features on the items (:mod:`collab.objectives`), the items to train, metrics, the agents that learn."""
        raise NotImplementedError

    def on_fit_start(self) -> None:
        self.sync_engine()  # after a checkpoint loaded, before the start-of-run evaluation

    def sync_engine(self) -> None:
        """Under fsdp, vLLM takes the trained weights at points every process reaches together (they are gathered
        whole, collectives): the start of training and the end of each step. Otherwise each generation syncs
        what changed (:meth:`VllmEngine.generate <collab.policy.vllm_engine.VllmEngine.generate>`)."""
        if self.team is not None and self.team.engine is not None and lockstep.active() is not None:
            self.team.engine.sync(self.team)

    def on_train_start(self) -> None:
        """Under DDP, a sampling stream of its own for every rank: rank r > 0 reseeds torch (CPU and accelerator)
        with the run's seed + r, so that ranks do not draw the same random numbers for their different tasks;
        rank 0 keeps the stream of a 1-process run. A resumed run puts back each rank's saved state instead
        (in ``training_step``); a rank the checkpoint had no process for (a run moved to more processes)
        seeds here, as at a fresh start."""
        rank = self.trainer.global_rank
        if rank > 0 and self._resume_rng is None:
            torch.manual_seed(torch.initial_seed() + rank)
        note = steps_note(self.trainer.max_steps, *self.update_shape())
        if note and self.trainer.is_global_zero:
            print(note, flush=True)

    def setup(self, stage: str) -> None:
        preemption.attach(self.trainer)  # SIGTERM stops the run inside a step too (collab.preemption)

    def training_step(self, dataloader_iter: Iterator) -> None:
        preemption.check_step()
        if self._resume_rng is not None:  # here, not at load: Lightning draws from torch's generator in between
            set_rng_state(self._resume_rng, self.device)
            self._resume_rng = None
        tasks, _, _ = next(dataloader_iter)
        self.rollouts += 1
        with preemption.phase("rollout"):
            experience = self.rollout(tasks)
        with preemption.phase("update"):
            preemption.check()
            with torch.no_grad():
                batch = self.prepare(experience)
            release()  # the rollout's KV caches back to the OS before the update's activations (runtime.memory)
            metrics = self.update(batch)
            release()
        log_rollout(self, experience, {**batch.metrics, **metrics})
        lockstep.settle()  # sharded models: every rank's forwards served before the step's last collective
        self.sync_engine()
        preemption.agree(self)  # under DDP every rank stops after this step when any got a SIGTERM

    def update(self, batch: Batch) -> dict[str, float]:
        """PPO's update loop, as CleanRL's ppo.py: epochs of minibatches, each minibatch's gradient accumulated over
        its micro-batches and their terms (one backward pass each), then one optimizer step.

        Every rank takes the same number of steps (:func:`~collab.runtime.collectives.minibatch_schedule` pads with
        empty minibatches) and of backward passes (:func:`~collab.runtime.collectives.backward_passes`); when no rank
        has anything to train on, every rank takes one empty step (:meth:`skip_update`). The minibatches'
        order is drawn from a generator seeded by the rollout count, the same on every rank.
        """
        generator = torch.Generator().manual_seed(self.rollouts)
        schedule = minibatch_schedule(self, list(epochs(batch.items, *self.update_shape(), generator)))
        if not schedule:
            self.skip_update()
            return {}
        # the heap given back after a backward pass that left more than the update's start and a micro-batch's
        # budget; under gradient checkpointing after every pass: each runs the layers again at its own shape, and
        # the fragments grow several times faster (runtime.memory.release_above)
        checkpointed = self.team.base_config.gradient_checkpointing
        headroom = 0 if checkpointed else budget_bytes(self.team.device, self.micro_batch_memory_gb)
        after_backward = partial(release_above, resident_bytes() + headroom)
        optimizer, metrics, totals = self.optimizers(), {}, {}
        for index, minibatch in enumerate(schedule):  # epochs x minibatches
            if index and reached_max_steps(self):  # max_steps inside a rollout's updates: the run ends there
                break
            scale = self.normalizers(minibatch, batch, index)  # global: counts, normalized advantages
            stats: dict[str, float] = {}
            passes = []  # the minibatch's loss: the sum of its micro-batches' terms, one backward pass each
            for positions in self.micro_batches(minibatch):
                micro, share = [minibatch[i] for i in positions], len(positions) / len(minibatch)
                for term in self.terms(micro, scale.select(positions)):
                    passes.append(partial(run_term, term, stats, share))
            optimizer.zero_grad()
            if not backward_passes(self, passes, after_backward):  # no rank has anything to learn: an empty step
                self.skip_update()
                continue
            if not self.accept(stats, len(minibatch), scale):  # refused (MARFT's target_kl): the rollout's updates end
                optimizer.zero_grad()
                metrics["train/early_stop"] = 1.0
                break
            preemption.check()
            self.optimizer_step()
            for key, value in stats.items():
                totals.setdefault(key, []).append(value)
        return {**metrics, **{key: sum(v) / len(v) for key, v in totals.items()}}

    def update_shape(self) -> tuple[int, int | None]:
        """The update loop's passes over a rollout's items and items per minibatch (None: all of them)."""
        return (self.ppo.num_epochs, self.ppo.minibatch_size) if self.ppo else (1, None)

    def normalizers(self, minibatch: list, batch: Batch, index: int) -> Normalizers:
        """What the minibatch's loss divides by, from every rank's minibatch (``index``: its place in the
        rollout's updates): called on every rank for every update, an empty minibatch included, so that the
        collectives here match (hook; default: the global number of items)."""
        return Normalizers(global_count(self, len(minibatch)))

    def micro_batches(self, minibatch: list) -> list[list[int]]:
        """The minibatch in parts of at most ``micro_batch_tokens`` padded tokens (one item at least), as
        positions in the minibatch."""
        return token_budget_chunks([item.tokens for item in minibatch], self.micro_tokens())

    def micro_tokens(self) -> int | None:
        """``micro_batch_tokens``, with ``auto`` measured on the team the first time (then kept, and saved)."""
        if self.micro_batch_tokens != "auto":
            return self.micro_batch_tokens
        if self._auto_tokens is None:
            import sys

            from collab.runtime.memory import auto_tokens

            self._auto_tokens, line = auto_tokens(self.team, self.team.device, self.micro_batch_memory_gb)
            if self._trainer is None or self.trainer.is_global_zero:
                print(line, file=sys.stderr, flush=True)
        return self._auto_tokens

    def terms(self, micro: list, scale: Normalizers) -> list[Term]:
        """The micro-batch's part of the minibatch's loss as the terms it sums, in the order of their backward
        passes (docs/design.md). Each term returns its loss, already divided by the global ``scale`` (whose
        per-item values are the micro-batch's), and its statistics: means over the micro-batch, shared between
        the terms where several compute one (an actor statistic divided by the number of agents)."""
        raise NotImplementedError(
            f"{type(self).__name__} must define terms(micro, scale): its micro-batch loss "
            f"as a list of terms (one backward pass each), the loss being their sum"
        )

    def loss(self, micro: list, scale: Normalizers) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's loss, the sum of its :meth:`terms`, in one backward pass, and its statistics as the
        update logs them (to inspect a loss: the update runs each term's backward pass on its own)."""
        stats: dict[str, float] = {}
        return sum(run_term(term, stats, 1.0) for term in self.terms(micro, scale)), stats

    def accept(self, stats: dict[str, float], count: int, scale: Normalizers) -> bool:
        """Whether to apply the update whose gradient was just accumulated over a minibatch of ``count`` items
        (hook; called on every rank)."""
        return True

    def skip_update(self) -> None:
        """An update without gradients (no parameter moves; AdamW skips parameters whose grad is None).

        Called when a rollout gives no learning signal (e.g. every group's returns are equal), so that
        ``global_step`` still advances and ``trainer.max_steps`` ends the run.
        """
        opt = self.optimizers()
        opt.zero_grad(set_to_none=True)
        opt.step()

    def optimizer_step(self) -> None:
        """Clip the accumulated gradients (``max_grad_norm``) and take the optimizer step."""
        opt = self.optimizers()
        if self.max_grad_norm and self.max_grad_norm > 0:
            collectives.clip_gradients(self, opt, self.max_grad_norm)  # Lightning's, or FSDP2's shards and heads
        opt.step()

    # -- checkpoints -------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Trainable weights only, the rollout counter and the random state of every process (a
        collective under DDP: Lightning calls it on every rank)."""
        trainable = {n for n, p in self.named_parameters() if p.requires_grad}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}
        checkpoint["collab"] = {
            "rollouts": self.rollouts,
            "agents": [s.role for s in self.team.specs],
            "rng": gather_per_rank(rng_state(self.device)),
            "micro_batch_tokens": self._auto_tokens,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("collab", {})
        self.rollouts = state.get("rollouts", 0)
        if self.micro_batch_tokens == "auto" and state.get("micro_batch_tokens"):  # the size the run decided
            self._auto_tokens = int(state["micro_batch_tokens"])
        rank = self.trainer.global_rank if self._trainer is not None else 0
        self._resume_rng = pick_rank(state["rng"], rank, "random state") if state.get("rng") else None
