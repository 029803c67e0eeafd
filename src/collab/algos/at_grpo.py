"""AT-GRPO: agent- and turn-wise grouped GRPO with tree sampling (PettingLLMs, arXiv 2510.11062; its code:
``pettingllms/trainer/multi_agents_execution_engine.py`` and ``multi_agents_ppo_trainer.py`` on verl).

Per training step:

1. Tree sampling (``collab.rollout.tree``, ``keep="best"``): at each turn every agent draws K responses from the
   same history; candidate joint action k (every agent's k-th) is played on a copy of the env and rewarded; only
   the best candidate (the largest mean of the agents' turn rewards, the first of equals:
   :func:`collab.objectives.best_joint`) goes on to the next turn. Every candidate is a training sample.
2. Groups by task, turn and agent (one agent's K candidates at one turn), each candidate scored by its own turn's
   reward (no return through later turns). The ``filter_ratio`` share of the rollout's groups with the lowest mean
   reward is dropped (:func:`collab.objectives.low_mean_groups`, the reference's ``filter_method: mean``); the
   others get GRPO's advantages A = (r - mean) / (std + 1e-6), std unbiased (verl's
   ``compute_grpo_outcome_advantage``).
3. ``ppo.num_epochs`` passes of minibatch updates of PPO's token-level clipped surrogate, each agent's loss the mean
   over its tokens in the minibatch (verl's ``token-mean``), summed over agents; no KL term (the reference's
   ``use_kl_loss: false``). With ``entropy_coef`` c > 0 each agent's token-mean entropy of its policy, times c, is
   subtracted (verl's ``actor.entropy_coeff``; the reference sets 0, collab's default too).

Where collab differs from the reference, by choice (docs/fidelity.md): the reference picks each agent's best
candidate in turn order, and the next agent of the same turn samples its K candidates after that pick; collab's
envs step a turn's joint action, so candidate k of every agent is played together (under ``model.dependency:
chain`` agent i's k-th response sees agent i-1's k-th) and one joint action goes on. The reference's group key
divides the problem index by K again (K problems share a group) and its tree steps the env copies it did not
select; neither is reproduced. With ``filter_ratio`` the groups are ranked on each process among its own.
"""

from __future__ import annotations

import torch

from collab.algos.groups import PPOOptions
from collab.algos.magrpo import MAGRPO, set_group_advantages
from collab.errors import require
from collab.objectives import clipped_surrogate, low_mean_groups, ratio_stats
from collab.rollout.experience import Batch, Decision, Experience, Normalizers
from collab.rollout.tree import tree_batch
from collab.runtime.collectives import global_sum


def filter_groups(samples: list[Decision], ratio: float) -> list[Decision]:
    """Step 2's filter: the rollout's groups (``Decision.group``, every agent's) ranked by their mean reward
    together, the lowest ``int(groups * ratio)`` dropped; the reference ranks the groups of one policy, and its
    game scripts train one policy for both roles (by prompt, or by LoRA on one model)."""
    groups: dict[int, list[float]] = {}
    for s in samples:
        groups.setdefault(s.group, []).append(float(s.returns))
    keys = list(groups)
    dropped = {keys[i] for i in low_mean_groups([sum(groups[g]) / len(groups[g]) for g in keys], ratio)}
    return [s for s in samples if s.group not in dropped]


class ATGRPO(MAGRPO):
    """The options and their meaning: ``conf/algo/at_grpo.yaml``."""

    keep = "best"
    """Step 1's tree sampling: only the best joint action of a turn goes on (``collab.rollout.tree``)."""

    def __init__(
        self, *, num_generations: int | None, filter_ratio: float, ppo: PPOOptions, entropy_coef: float, **kwargs
    ) -> None:
        super().__init__(
            num_generations=num_generations,
            joint_mode="aligned",
            baseline="mean",
            normalize_std=True,
            ppo=ppo,
            kl_coef=0.0,
            log_kl_every=0,
            termination_threshold=None,
            termination="branch",
            cross_reduction="mean",
            rollout_mode="tree",
            dependency="none",
            invalid_penalty=0.0,
            **kwargs,
        )
        require(
            ppo.gamma == 0,
            f"AT-GRPO scores each candidate by its own turn's reward: model.ppo.gamma must be 0, got {ppo.gamma}",
        )
        require(
            isinstance(filter_ratio, (int, float)) and not isinstance(filter_ratio, bool) and 0 <= filter_ratio < 1,
            f"model.filter_ratio must be in [0, 1) (the share of groups dropped; 0: none), got {filter_ratio!r}",
        )
        require(
            isinstance(entropy_coef, (int, float)) and not isinstance(entropy_coef, bool) and entropy_coef >= 0,
            f"model.entropy_coef must be a number >= 0 (0: no entropy bonus), got {entropy_coef!r}",
        )
        self.filter_ratio, self.entropy_coef = float(filter_ratio), float(entropy_coef)

    # -- rollout (step 1) and prepare (step 2) ----------------------------------------------------------
    def rollout(self, tasks) -> Experience[Decision]:
        return tree_batch(self.team, self.env, tasks, self.k, 0.0, max_new_tokens=self.max_new_tokens, keep=self.keep)

    @torch.no_grad()
    def prepare(self, experience: Experience[Decision]) -> Batch[Decision]:
        """The kept groups' advantages; every sample of a kept group is trained on (a zero advantage still counts
        in its agent's token mean, as in the reference's batch)."""
        samples = experience.items
        kept = filter_groups(samples, self.filter_ratio)
        set_group_advantages(kept, "mean", normalize_std=True)
        adv = torch.tensor([s.advantages for s in kept]) if kept else torch.zeros(1)
        return Batch(
            kept,
            {
                "train/adv_mean": float(adv.mean()),
                "train/adv_abs_max": float(adv.abs().max()),
                "train/kept_groups": float(len({s.group for s in kept})),
                "train/dropped_groups": float(len({s.group for s in samples}) - len({s.group for s in kept})),
            },
        )

    # -- loss (step 3) ---------------------------------------------------------------------------------
    def normalizers(self, minibatch: list[Decision], batch: Batch[Decision], index: int) -> Normalizers:
        """Each agent's response tokens in the minibatch of all ranks (its loss is the mean over them)."""
        agents = range(len(self.team))
        tokens = global_sum(self, [sum(len(s.old_logprobs) for s in minibatch if s.agent == a) for a in agents])
        return Normalizers(float(tokens.sum()), per_agent=tokens.tolist())

    def policy_loss(self, micro: list[Decision], scale: Normalizers) -> tuple[torch.Tensor, dict[str, float]]:
        """PPO's clipped surrogate of every response token, rho_t = pi(y_t) / pi_old(y_t) with the sample's
        advantage, less ``entropy_coef`` times the policy's entropy H_t at the token, each agent's tokens divided by
        its token count in the minibatch, summed."""
        members = [s.member for s in micro]
        prompts, completions = [s.prompt_ids for s in micro], [s.completion_ids for s in micro]
        own = [s.own for s in micro]
        if self.entropy_coef:
            token_logprobs, entropies = self.team.logprobs(members, prompts, completions, entropy=True, own=own)
        else:
            token_logprobs = self.team.logprobs(members, prompts, completions, own=own)
        logprobs = torch.cat(token_logprobs)
        device, dtype = logprobs.device, logprobs.dtype
        old_logprobs = torch.cat([s.old_logprobs for s in micro]).to(device, dtype)
        lengths = torch.tensor([len(t) for t in token_logprobs], device=device)
        per_sample = [(s.advantages, 1.0 / scale.per_agent[s.agent]) for s in micro]
        advantages, weights = torch.tensor(per_sample, device=device, dtype=dtype).repeat_interleave(lengths, 0).T
        per_token = clipped_surrogate(logprobs, old_logprobs, advantages, self.ppo.clip)
        stats = ratio_stats(logprobs, old_logprobs, self.ppo.clip)
        if self.entropy_coef:
            entropy = torch.cat(entropies)
            per_token = per_token - self.entropy_coef * entropy
            stats["train/entropy"] = float(entropy.detach().mean())
        return (weights * per_token).sum(), stats
