"""Multi-agent REINFORCE with a per-agent baseline: an algorithm of one's own (docs/extending.md).

Each agent i is its own policy pi_i (a LoRA adapter on the shared base). After a rollout of whole
episodes, each response a_t^i is weighed by its discounted return G_t^i = sum_{t' >= t} gamma^(t'-t) r_t'^i
minus a baseline b_i, the mean return of agent i's responses in the rollout (REINFORCE with a baseline,
Williams 1992; with ``baseline: none`` the MA-REINFORCE of CoLLM Section 3, MAGRPO's ``baseline: none``).
The loss is the policy gradient's surrogate, a mean per agent summed over the agents:

    L = - sum_i  1/N_i  sum_{responses of i}  A_t^i * log pi_i(a_t^i | h_t^i),    A_t^i = G_t^i - b_i

where log pi is the sum of the response's token log-probs and N_i counts agent i's responses in the
minibatch on every rank. Unlike MAGRPO it samples one response per history (no tree, no group of
siblings) and takes one plain gradient step per rollout (no importance ratio, no clip).

Run it from this folder (``python -m`` puts the working directory on ``sys.path``)::

    python -m collab.fit --algo reinforce:Reinforce --config reinforce.yaml --data.env matrix
"""

from __future__ import annotations

from functools import partial

import torch

from collab.algos.base import CollabModule, Term
from collab.errors import require
from collab.objectives import discounted_returns, group_advantages
from collab.rollout.episodes import play_once
from collab.rollout.experience import Batch, Decision, Experience, Normalizers, decisions
from collab.runtime.collectives import global_sum


class Reinforce(CollabModule):
    def __init__(self, *, gamma: float, baseline: str, normalize_std: bool, **kwargs) -> None:
        """
        Args:
            gamma: Discount of multi-turn returns.
            baseline: mean (b_i: the mean return of agent i's responses in the rollout) | none (b_i = 0).
            normalize_std: Also divide each agent's advantages by the standard deviation of its returns.
            **kwargs: The options of :class:`~collab.algos.base.CollabModule` (base, agents, agent_lr...).
        """
        super().__init__(**kwargs)
        require(0 <= gamma <= 1, f"model.gamma must be in [0, 1], got {gamma}")
        require(baseline in ("mean", "none"), f"model.baseline must be mean or none, got {baseline!r}")
        require(baseline == "mean" or not normalize_std, "model.normalize_std true needs model.baseline mean")
        self.gamma, self.baseline, self.normalize_std = gamma, baseline, normalize_std

    def rollout(self, tasks) -> Experience[Decision]:
        """One episode per task with the team; each response a Decision carrying its return G_t^i."""
        episodes, stats, examples = play_once(self.team, self.env, tasks, self.max_new_tokens)
        rewards = [torch.tensor([step.rewards for step in ep.steps], dtype=torch.float32) for ep in episodes]  # [T, A]
        returns = [discounted_returns(r.T, self.gamma).T for r in rewards]  # G_t^i, along each agent's turns
        items = decisions(episodes, returns)  # one Decision per response; its ``reward`` here is G_t^i
        for item in items:
            item.returns = item.reward
        return Experience(items, stats, examples, episodes)

    @torch.no_grad()
    def prepare(self, experience: Experience[Decision]) -> Batch[Decision]:
        """A_t^i = G_t^i - b_i, agent by agent (no gradients; once per rollout)."""
        items = experience.items
        for agent in sorted({d.agent for d in items}):
            mine = [d for d in items if d.agent == agent]
            returns = torch.tensor([float(d.returns) for d in mine], dtype=torch.float64)
            for d, a in zip(
                mine, group_advantages(returns, self.baseline, self.normalize_std and len(mine) > 1).tolist()
            ):
                d.advantages = a
        adv = torch.tensor([float(d.advantages) for d in items] or [0.0])
        return Batch(items, {"train/adv_mean": float(adv.mean()), "train/adv_abs_max": float(adv.abs().max())})

    def normalizers(self, minibatch: list[Decision], batch: Batch[Decision], index: int) -> Normalizers:
        """N_i: agent i's responses in the minibatch of every rank (under DDP a sum over the ranks)."""
        counts = global_sum(self, [sum(d.agent == a for d in minibatch) for a in range(len(self.team))]).tolist()
        return Normalizers(sum(counts), per_agent=counts)

    def terms(self, micro: list[Decision], scale: Normalizers) -> list[Term]:
        """The micro-batch's part of L as its terms, each a backward pass of its own: one, since one forward gives
        every response's log-prob."""
        return [partial(self.policy_loss, micro, scale)]

    def policy_loss(self, micro: list[Decision], scale: Normalizers) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's part of L: -A * log pi(response), divided by its agent's N_i; and its statistics."""
        token_logprobs = self.team.logprobs(
            [d.member for d in micro], [d.prompt_ids for d in micro], [d.completion_ids for d in micro]
        )
        logprobs = torch.stack([t.sum() for t in token_logprobs])  # log pi_i(a | h): summed over the response's tokens
        advantages = torch.tensor([float(d.advantages) for d in micro], device=logprobs.device, dtype=logprobs.dtype)
        weights = torch.tensor(
            [1.0 / scale.per_agent[d.agent] for d in micro], device=logprobs.device, dtype=logprobs.dtype
        )
        return -(weights * advantages * logprobs).sum(), {"train/logprob": float(logprobs.detach().mean())}
