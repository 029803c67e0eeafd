"""MAGRPO: Multi-Agent Group Relative Policy Optimization (MAGRPO; CoLLM, Section 3.1).

Per training step:

1. Roll out a K-ary tree per task (``collab.rollout.tree``): at each history h_t every agent draws K
   responses; children are joint actions; returns are discounted Monte Carlo estimates through the tree.
   With ``rollout_mode: episodes`` each task is played K times instead, each episode alone, and every response
   carries its episode's return (``collab.rollout.episode_batch``: Dr. MAS's rollout); there a ``dependency``
   (MARFT's Flex-MG D, :mod:`collab.rollout.protocol`) lets an agent act on its parents' actions of the same turn,
   as Dr. MAS's orchestras call their agents one after the other.
2. Group-relative advantages among each agent's K siblings: A = G - b, with b the group mean (MAGRPO),
   the group max, leave-one-out (RLOO) or 0 (plain MA-REINFORCE), optionally divided by the group std
   (``baseline``: the MAGRPO authors' MAGRPO, MAReMax, MARLOO and MAREINFORCE trainers,
   :func:`collab.objectives.group_advantages`). A group is one agent's, so the std is that agent's own: Dr. MAS's
   agent-wise normalisation (arXiv 2602.08847); with ``episodes`` a group is one agent's responses at every turn
   of a task's K episodes, Dr. MAS's group at any number of turns.
3. ``ppo.num_epochs`` passes of minibatch updates of the importance-weighted policy gradient, CoLLM Eq. 1:
   grad = rho_{i,t} grad log pi_i(a_{i,t} | h_{i,t}) (G - b), with rho the sequence-level ratio
   pi / pi_old clipped to [1 - eps, 1 + eps] as in PPO (eps = ``ppo.clip``, Appendix C's
   "advantage clip"), an optional KL penalty to the reference (adapters disabled; 0 in the papers).

Each agent's loss is the mean over its own samples in the minibatch; the minibatch loss is the sum over
agents, so every agent's gradient has the same scale whatever the team size (a choice: the papers
update each agent separately, which this equals for plain SGD). Samples whose advantage is 0 (a group
whose K returns are equal) carry no gradient and are left out of the update, unless a KL penalty applies.

Under a joint reward (Dec-POMDP) every agent's advantage comes from the team's return; under per-agent
rewards (a POSG such as matrix ``table2b``) each agent learns from its own reward: independent learning.
``n = 1`` is single-agent GRPO.
"""

from __future__ import annotations

from functools import partial
from typing import Union

import torch

from collab.algos.base import CollabModule, Term
from collab.algos.groups import PPOOptions
from collab.errors import require, require_ranges
from collab.objectives import BASELINES, clipped_surrogate, group_advantages, kl_k3, ratio_stats
from collab.rollout.episode_batch import episode_batch
from collab.rollout.experience import Batch, Decision, Experience, Normalizers
from collab.rollout.protocol import Dependency
from collab.rollout.tree import CROSS_REDUCTIONS, JOINT_MODES, TERMINATIONS, tree_batch
from collab.runtime import lockstep
from collab.runtime.collectives import global_sum
from collab.runtime.memory import shared_prompt_chunks

ROLLOUT_MODES = ("tree", "episodes")


def set_group_advantages(samples: list[Decision], baseline: str = "mean", normalize_std: bool = False) -> None:
    """Step 2: each group's advantages from its K returns, A = G - b (:func:`collab.objectives.group_advantages`),
    written into the samples. A group (``Decision.group``) is one agent's K samples at one history node of a tree,
    or its responses in a task's K episodes (:func:`~collab.rollout.episode_batch.episode_batch`). A group of one
    (an agent routed to once in a task's episodes) has nothing to compare with: its advantage is its return, Dr. MAS's
    rule (mean 0, std 1)."""
    groups: dict[int, list[Decision]] = {}
    for s in samples:
        groups.setdefault(s.group, []).append(s)
    for members in groups.values():
        if len(members) == 1:
            members[0].advantages = float(members[0].returns)
            continue
        returns = torch.tensor([s.returns for s in members], dtype=torch.float64)
        for s, a in zip(members, group_advantages(returns, baseline, normalize_std).tolist()):
            s.advantages = a


class MAGRPO(CollabModule):
    """The options and their meaning: ``conf/algo/magrpo.yaml``."""

    def __init__(
        self,
        *,
        num_generations: int | None,
        joint_mode: str,
        baseline: str,
        normalize_std: bool,
        ppo: PPOOptions,
        kl_coef: float,
        log_kl_every: int,
        termination_threshold: float | None,
        termination: str,
        cross_reduction: str,
        rollout_mode: str,
        dependency: Union[str, list[list[int]], list[list[list[int]]]],
        invalid_penalty: float,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        require(
            num_generations is None or num_generations >= 2,
            f"MAGRPO needs model.num_generations >= 2 for a group baseline, got {num_generations}",
        )
        ppo.check()
        require(
            not (baseline == "none" and normalize_std),
            "model.normalize_std true needs a baseline (mean | max | rloo): with model.baseline none a group of "
            "equal returns G would get G / 1e-6; set model.normalize_std false",
        )
        require_ranges(
            locals(),
            non_negative=("kl_coef", "log_kl_every", "invalid_penalty"),
            choices={
                "joint_mode": JOINT_MODES,
                "baseline": BASELINES,
                "termination": TERMINATIONS,
                "cross_reduction": CROSS_REDUCTIONS,
                "rollout_mode": ROLLOUT_MODES,
            },
        )
        require(
            rollout_mode == "tree" or (joint_mode == "aligned" and termination_threshold is None),
            "model.rollout_mode episodes plays each task's K episodes apart: it needs model.joint_mode aligned and "
            f"model.termination_threshold null, got {joint_mode} and {termination_threshold}",
        )
        self.k, self.joint_mode, self.baseline, self.normalize_std = (
            num_generations,
            joint_mode,
            baseline,
            normalize_std,
        )
        self.ppo, self.kl_coef, self.log_kl_every = ppo, kl_coef, log_kl_every
        self.termination_threshold, self.termination, self.cross_reduction = (
            termination_threshold,
            termination,
            cross_reduction,
        )
        require(
            dependency == "none" or rollout_mode == "episodes",
            "model.dependency other than none lets an agent see its parents' actions of the same turn, which only "
            f"whole episodes play: it needs model.rollout_mode episodes, got {rollout_mode}",
        )
        require(
            invalid_penalty == 0 or rollout_mode == "episodes",
            f"model.invalid_penalty scores whole episodes' responses: it needs model.rollout_mode episodes, got "
            f"{rollout_mode}",
        )
        self.rollout_mode, self.dependency, self.invalid_penalty = rollout_mode, dependency, invalid_penalty

    def build_extra(self, env) -> None:
        if self.k is None:
            self.k = getattr(env, "num_generations", 4)
        if self.dependency != "none":  # the held-out evaluation plays the same protocol
            self.protocol = Dependency(self.dependency, len(self.team))

    # -- rollout (step 1) and prepare (step 2) ----------------------------------------------------------
    def rollout(self, tasks) -> Experience[Decision]:
        if self.rollout_mode == "episodes":
            return episode_batch(
                self.team,
                self.env,
                tasks,
                self.k,
                self.ppo.gamma,
                self.max_new_tokens,
                dependency=self.protocol,
                invalid_penalty=self.invalid_penalty,
            )
        return self.trees(tasks)

    def trees(self, tasks, relabel=None) -> Experience[Decision]:
        """The tree of every task; ``relabel`` may rescore its nodes before the returns (``tree_batch``)."""
        return tree_batch(
            self.team,
            self.env,
            tasks,
            self.k,
            self.ppo.gamma,
            self.joint_mode,
            self.termination_threshold,
            self.max_new_tokens,
            self.termination,
            self.cross_reduction,
            relabel=relabel,
        )

    @torch.no_grad()
    def prepare(self, experience: Experience[Decision]) -> Batch[Decision]:
        """Group-relative advantages; the update trains on the samples with a signal (A != 0, or a KL penalty)."""
        samples = experience.items
        set_group_advantages(samples, self.baseline, self.normalize_std)
        adv = torch.tensor([s.advantages for s in samples])
        active = [s for s in samples if s.advantages != 0 or self.kl_coef]
        return Batch(
            active,
            {
                "train/adv_mean": float(adv.mean()),
                "train/adv_std": float(adv.std()) if len(adv) > 1 else 0.0,
                "train/adv_abs_max": float(adv.abs().max()),
                "train/active_samples": float(len(active)),
            },
        )

    # -- loss (step 3) ---------------------------------------------------------------------------------
    def normalizers(self, minibatch: list[Decision], batch: Batch[Decision], index: int) -> Normalizers:
        """Each agent's number of samples in the minibatch of all ranks (its loss is the mean over them), and
        whether this update computes the KL to the reference (every update with a penalty; else the first update
        of every ``log_kl_every``-th rollout, to log it)."""
        counts = global_sum(self, [sum(s.agent == a for s in minibatch) for a in range(len(self.team))]).tolist()
        every = self.log_kl_every
        logged = bool(every) and index == 0 and (self.rollouts - 1) % every == 0
        return Normalizers(sum(counts), per_agent=counts, with_kl=bool(self.kl_coef) or logged)

    def micro_batches(self, minibatch: list[Decision]) -> list[list[int]]:
        """The minibatch in parts of at most ``micro_batch_tokens`` padded tokens with each node's K samples of an
        agent together, their prompt counted once: the forward computes it once for them
        (:func:`~collab.runtime.memory.shared_prompt_chunks`)."""
        keys = [(s.member, tuple(s.prompt_ids)) for s in minibatch]
        prompts, completions = [len(s.prompt_ids) for s in minibatch], [len(s.completion_ids) for s in minibatch]
        return shared_prompt_chunks(keys, prompts, completions, self.micro_tokens())

    def terms(self, micro: list[Decision], scale: Normalizers) -> list[Term]:
        """One term: a sample is one agent's response, and one forward computes every sample's. Under fsdp with the
        agents on several models (full agents: each its own), one term per model of the pool, in its order, an empty
        one where no sample of the micro-batch is on it: the k-th backward pass of every process then runs on the
        same model, which :meth:`collab.runtime.lockstep.Lockstep.backward` gathers whole alone, not all of them.
        Each sample's term is the same; a part's statistics (means) are weighted by its share of the micro-batch."""
        parts = by_model(self.team, micro) if lockstep.active() is not None else [micro]
        if len(parts) == 1:
            return [partial(self.policy_loss, micro, scale)]
        return [partial(self.part_loss, part, len(part) / len(micro), scale) for part in parts]

    def part_loss(self, part: list[Decision], share: float, scale: Normalizers) -> tuple[torch.Tensor, dict]:
        """:meth:`policy_loss` of a part of a micro-batch, its statistics times ``share``; an empty part's loss is a
        0 without gradients (its backward pass runs no backward, only the pass's collectives)."""
        if not part:
            return torch.zeros(()), {}
        loss, stats = self.policy_loss(part, scale)
        return loss, {key: value * share for key, value in stats.items()}

    def policy_loss(self, micro: list[Decision], scale: Normalizers) -> tuple[torch.Tensor, dict[str, float]]:
        """CoLLM Eq. 1 with the PPO clip: each sample's clipped surrogate (plus the KL penalty) divided by
        its agent's sample count in the minibatch, summed: over a minibatch, the sum over agents of each
        agent's mean."""
        team = self.team
        members, prompts, completions = (
            [s.member for s in micro],
            [s.prompt_ids for s in micro],
            [s.completion_ids for s in micro],
        )
        own = [s.own for s in micro]
        token_logprobs = team.logprobs(members, prompts, completions, own=own)
        logprobs = torch.stack([t.sum() for t in token_logprobs])
        old_logprobs = torch.tensor([s.old_logprob for s in micro], device=logprobs.device, dtype=logprobs.dtype)
        advantages = torch.tensor([s.advantages for s in micro], device=logprobs.device, dtype=logprobs.dtype)
        per_sample = clipped_surrogate(logprobs, old_logprobs, advantages, self.ppo.clip)
        stats: dict[str, float] = {}
        if scale.with_kl:
            ref = team.logprobs(members, prompts, completions, reference=True, own=own)
            kl = torch.stack([kl_k3(t, r.detach()).mean() for t, r in zip(token_logprobs, ref)])
            stats["train/kl_ref"] = float(kl.detach().mean())
            if self.kl_coef:
                per_sample = per_sample + self.kl_coef * kl
        weights = torch.tensor(
            [1.0 / scale.per_agent[s.agent] for s in micro], device=per_sample.device, dtype=per_sample.dtype
        )
        stats.update(ratio_stats(logprobs, old_logprobs, self.ppo.clip))
        return (weights * per_sample).sum(), stats


def by_model(team, items: list[Decision]) -> list[list[Decision]]:
    """``items`` grouped by the model their member's forward runs on (its agent's base: a full agent's own copy, or
    the base LoRA agents share): one group (maybe empty) for each model of the pool, in its order (the same on every
    process)."""
    bases = [team.agents[item.member].base for item in items]
    return [[item for item, b in zip(items, bases) if b is base] for base in team.pool.bases]
