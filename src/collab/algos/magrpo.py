"""MAGRPO: Multi-Agent Group Relative Policy Optimization (paper 001; paper 002, Section 3.1).

Per training step:

1. Roll out a K-ary tree per task (``collab.rollout.tree``): at each history h_t every agent draws K
   responses; children are joint actions; returns are discounted Monte Carlo estimates through the tree.
2. Group-relative advantages among each agent's K siblings: A = G - b, with b the group mean (MAGRPO),
   the group max, leave-one-out (RLOO) or 0 (plain MA-REINFORCE), optionally divided by the group std.
3. ``num_epochs`` passes of minibatch updates of the importance-weighted policy gradient, paper 002 Eq. 1:
   grad = rho_{i,t} grad log pi_i(a_{i,t} | h_{i,t}) (G - b), with rho the sequence-level ratio
   pi / pi_old clipped to [1 - eps, 1 + eps] as in PPO (eps = ``advantage_clip``, Appendix C's
   "advantage clip"), an optional KL penalty to the reference (adapters disabled; 0 in the papers).

Each agent's loss is the mean over its own samples in the minibatch; the minibatch loss is the sum over
agents, so every agent's gradient has the same scale whatever the team size (a choice: the papers
update each agent separately, which this equals for plain SGD).

Under a joint reward (Dec-POMDP) every agent's advantage comes from the team's return; under per-agent
rewards (a POSG such as matrix ``table2b``) each agent learns from its own reward: independent learning.
``n = 1`` is single-agent GRPO.
"""

from __future__ import annotations

import torch

from collab.algos.base import CollabModule, token_budget_chunks
from collab.distributed import global_max, global_sum, optimizer_step
from collab.errors import require
from collab.objectives import BASELINES, clipped_surrogate, group_advantages, kl_k3, ratio_stats
from collab.rollout.tree import CROSS_REDUCTIONS, JOINT_MODES, TERMINATIONS, tree_batch
from collab.rollout.trajectory import RolloutBatch, Sample


def prepare(samples: list[Sample], baseline: str = "mean", normalize_std: bool = False) -> None:
    """Step 2: each group's advantages from its K returns, A = G - b (:func:`collab.objectives.group_advantages`),
    written into the samples. A group is one agent's K samples at one history node (``Sample.group``)."""
    groups: dict[int, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.group, []).append(s)
    for members in groups.values():
        returns = torch.tensor([s.returns for s in members], dtype=torch.float64)
        for s, a in zip(members, group_advantages(returns, baseline, normalize_std).tolist()):
            s.advantages = a


class MAGRPO(CollabModule):
    def __init__(self, *args, num_generations: int | None = 4, joint_mode: str = "aligned", baseline: str = "mean",
                 normalize_std: bool = False, gamma: float = 1.0, advantage_clip: float = 0.2, num_epochs: int = 2,
                 minibatch_size: int | None = None, kl_coef: float = 0.0, log_kl: bool = True,
                 termination_threshold: float | None = None, termination: str = "branch",
                 cross_reduction: str = "mean", micro_batch_tokens: int | None = 8192, **kwargs) -> None:
        """
        Args:
            num_generations: K, responses per agent per history node (>= 2 for a group baseline); None: the
                environment's ``num_generations`` (paper 002 C.3: 2 for Minecraft, whose tree grows as K^4),
                else 4.
            joint_mode: aligned (K joint actions per node) or cross (all K^n combinations).
            baseline: mean | max | rloo | none.
            normalize_std: Divide advantages by the group's standard deviation.
            gamma: Discount of multi-turn returns.
            advantage_clip: PPO clip range eps of the importance ratio (paper 002 Appendix C: 0.2).
            num_epochs: Passes over each rollout buffer.
            minibatch_size: Samples per update; None: the whole buffer.
            kl_coef: Weight of the KL penalty to the reference policy (adapters disabled).
            log_kl: Log the KL to the reference (one extra forward per rollout).
            termination_threshold: MAGRPO's early termination threshold (None: off).
            termination: branch (a child ends when every agent's reward reaches the threshold) | node (all of
                a node's children end when the mean of their team rewards exceeds it: the reference code's rule).
            cross_reduction: How ``cross`` mode values an agent's sample from the joint returns it takes part
                in: mean (default) | sum (the reference code's; K^(n-1) times the mean).
            micro_batch_tokens: Padded tokens (rows x longest prompt + response) per forward/backward
                within an update: the minibatch's gradient is accumulated over parts of at most this
                size (at least one sample each), the same gradient in bounded memory. None: one pass.
        """
        super().__init__(*args, **kwargs)
        require(num_generations is None or num_generations >= 2,
                f"MAGRPO needs model.num_generations >= 2 for a group baseline, got {num_generations}")
        require(joint_mode in JOINT_MODES, f"unknown model.joint_mode {joint_mode!r}; valid: {', '.join(JOINT_MODES)}")
        require(baseline in BASELINES, f"unknown model.baseline {baseline!r}; valid: {', '.join(BASELINES)}")
        require(0 < advantage_clip, f"model.advantage_clip must be > 0, got {advantage_clip}")
        require(num_epochs >= 1, f"model.num_epochs must be >= 1, got {num_epochs}")
        require(minibatch_size is None or minibatch_size >= 1, f"model.minibatch_size must be >= 1 or null, got {minibatch_size}")
        require(kl_coef >= 0, f"model.kl_coef must be >= 0, got {kl_coef}")
        require(0 <= gamma <= 1, f"model.gamma must be in [0, 1], got {gamma}")
        self.k, self.joint_mode, self.baseline, self.normalize_std = num_generations, joint_mode, baseline, normalize_std
        self.gamma, self.advantage_clip, self.num_epochs = gamma, advantage_clip, num_epochs
        self.minibatch_size, self.kl_coef, self.log_kl = minibatch_size, kl_coef, log_kl
        require(termination in TERMINATIONS, f"unknown model.termination {termination!r}; valid: {', '.join(TERMINATIONS)}")
        require(cross_reduction in CROSS_REDUCTIONS,
                f"unknown model.cross_reduction {cross_reduction!r}; valid: {', '.join(CROSS_REDUCTIONS)}")
        self.termination_threshold, self.termination, self.cross_reduction = termination_threshold, termination, cross_reduction
        require(micro_batch_tokens is None or micro_batch_tokens >= 1,
                f"model.micro_batch_tokens must be >= 1 or null, got {micro_batch_tokens}")
        self.micro_batch_tokens = micro_batch_tokens

    def build_extra(self, env) -> None:
        if self.k is None:
            self.k = getattr(env, "num_generations", 4)

    def rollout(self, env, tasks) -> RolloutBatch:
        batch = tree_batch(self.team, env, tasks, self.k, self.gamma, self.joint_mode, self.termination_threshold,
                           self.max_new_tokens, self.termination, self.cross_reduction)
        prepare(batch.samples, self.baseline, self.normalize_std)
        return batch

    def policy_loss(self, samples, with_kl: bool, agent_counts: dict[int, int]) -> tuple[torch.Tensor, dict[str, float]]:
        """This part of a minibatch's loss: each sample's clipped surrogate (plus the KL penalty) divided by
        the number of its agent's samples in the whole minibatch (``agent_counts``), summed. Summed over the
        minibatch's parts it is the sum over agents of each agent's mean."""
        team = self.team
        token_logprobs = team.logprobs([s.agent for s in samples], [s.prompt_ids for s in samples],
                                       [s.completion_ids for s in samples])
        logprobs = torch.stack([t.sum() for t in token_logprobs])
        old = torch.tensor([s.old_logprob for s in samples], device=logprobs.device, dtype=logprobs.dtype)
        adv = torch.tensor([s.advantages for s in samples], device=logprobs.device, dtype=logprobs.dtype)
        per_sample = clipped_surrogate(logprobs, old, adv, self.advantage_clip)
        stats: dict[str, float] = {}
        if with_kl:
            ref = team.logprobs([s.agent for s in samples], [s.prompt_ids for s in samples],
                                [s.completion_ids for s in samples], reference=True)
            kl = torch.stack([kl_k3(t, r.detach()).mean() for t, r in zip(token_logprobs, ref)])
            stats["train/kl_ref"] = float(kl.detach().mean())
            if self.kl_coef:
                per_sample = per_sample + self.kl_coef * kl
        weights = torch.tensor([1.0 / agent_counts[s.agent] for s in samples], device=per_sample.device,
                               dtype=per_sample.dtype)
        stats.update(ratio_stats(logprobs, old, self.advantage_clip))
        return (weights * per_sample).sum(), stats

    def micro_batches(self, minibatch, with_kl: bool, agent_counts: dict[int, int], stats: dict[str, float],
                      losses: list[float]) -> list:
        """The minibatch's loss in parts of at most ``micro_batch_tokens`` padded tokens (one backward each:
        the same gradient as one pass, and long multi-turn histories fit in memory), as callables for
        :func:`collab.distributed.optimizer_step`; each records its loss and statistics (averaged over
        the minibatch's samples) as it runs."""
        lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in minibatch]

        def part(micro):
            def loss():
                value, part_stats = self.policy_loss(micro, with_kl, agent_counts)
                losses[-1] += float(value.detach())
                for key, v in part_stats.items():
                    stats[key] = stats.get(key, 0.0) + v * len(micro) / len(minibatch)
                return value
            return loss
        return [part([minibatch[i] for i in chunk]) for chunk in token_budget_chunks(lengths, self.micro_batch_tokens)]

    def accumulate(self, minibatch, with_kl: bool, backward) -> tuple[float, dict[str, float]]:
        """One process's gradient of the minibatch's loss, ``backward`` per micro-batch; returns the loss and stats."""
        counts: dict[int, int] = {}
        for s in minibatch:
            counts[s.agent] = counts.get(s.agent, 0) + 1
        stats: dict[str, float] = {}
        losses = [0.0]
        for part in self.micro_batches(minibatch, with_kl, counts, stats, losses):
            backward(part())
        return losses[0], stats

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        samples = [s for s in batch.samples if s.advantages != 0 or self.kl_coef]
        adv = torch.tensor([s.advantages for s in batch.samples])
        metrics = {"train/adv_mean": float(adv.mean()), "train/adv_std": float(adv.std()) if len(adv) > 1 else 0.0,
                   "train/adv_abs_max": float(adv.abs().max()), "train/active_samples": float(len(samples))}
        size = self.minibatch_size or max(len(samples), 1)
        # every rank takes the same number of steps: the most minibatches any rank has (0: no rank learns)
        steps = global_max(self, -(-len(samples) // size))
        if steps == 0:  # all advantages are zero on every rank: nothing to learn from this rollout
            self.skip_update()
            return metrics
        generator = torch.Generator().manual_seed(self.rollouts)
        losses: list[float] = []
        n = len(self.team)
        for epoch in range(self.num_epochs):
            order = torch.randperm(len(samples), generator=generator).tolist()
            for m in range(steps):
                mb = [samples[i] for i in order[m * size:(m + 1) * size]]
                with_kl = (self.log_kl and epoch == 0 and m == 0) or bool(self.kl_coef)
                # each agent's mean over the minibatch of all ranks: divide by the global counts
                counts = global_sum(self, [sum(s.agent == a for s in mb) for a in range(n)]).tolist()
                stats: dict[str, float] = {}
                losses.append(0.0)
                optimizer_step(self, self.micro_batches(mb, with_kl, {a: c for a, c in enumerate(counts)}, stats, losses))
                if epoch == 0 and m == 0:
                    metrics.update(stats)
        metrics["train/loss"] = sum(losses) / len(losses)
        return metrics
