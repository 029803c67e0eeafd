"""IPPO: independent PPO with one critic per agent (MARFT, Section 5.2 baseline; Table 8).

Each agent i has its own critic V_i(h_{i,t}) (decentralized critics on the agents' shared base) and
learns from its own reward mixed with the team's (MARFT 5.2, after MAPoRL):

    r_i = 1/2 s_i + 1/(2n) sum_k s_k            (``own_reward_weight`` = 1/2)

Advantages and value targets are fixed once per rollout with GAE(gamma, lambda) over each episode's
turns, from the critics' values at rollout time (MARFT, Algorithm 1 line 12); every minibatch
then takes the PPO-clipped actor loss with those advantages (normalized over the minibatch when
``normalize_advantages``) and the critic loss against the GAE returns, clipped around the rollout-time
values when ``value_clip`` is set (each critic's term and each agent's actor term a backward pass of its
own: :meth:`~collab.algos.actor_critic.ActorCritic.terms`). Table 8: lr 3e-5 (actors and critics), gamma 1.0,
clip 0.2, 1 PPO epoch, GAE on; lambda is not given there: 0.95 here.
"""

from __future__ import annotations

import torch

from collab.algos.actor_critic import ActorCritic
from collab.errors import require
from collab.objectives import explained_variance, gae, mixed_rewards, value_loss
from collab.rollout.experience import Batch, Experience, Normalizers, Transition
from collab.runtime.collectives import global_count, normalize_pieces


class IPPO(ActorCritic):
    """The options and their meaning: ``conf/algo/ippo.yaml``."""

    def __init__(
        self,
        *,
        gae_lambda: float,
        own_reward_weight: float,
        value_clip: float | None,
        normalize_advantages: bool,
        **kwargs,
    ) -> None:
        require(
            kwargs.get("critic", "decentralized") == "decentralized",
            "IPPO's critics are decentralized (one per agent); model.critic must be decentralized, "
            f"got {kwargs.get('critic')!r}",
        )
        kwargs["critic"] = "decentralized"
        super().__init__(**kwargs)
        require(0 <= gae_lambda <= 1, f"model.gae_lambda must be in [0, 1], got {gae_lambda}")
        require(0 <= own_reward_weight <= 1, f"model.own_reward_weight must be in [0, 1], got {own_reward_weight}")
        require(
            self.critic_spec.kind == "v",
            f"IPPO's GAE needs state values V(h_i,t); model.critic_spec.kind must be v, got {self.critic_spec.kind!r}",
        )
        self.gae_lambda, self.own_reward_weight = gae_lambda, own_reward_weight
        self.value_clip, self.normalize_advantages = value_clip, normalize_advantages

    @torch.no_grad()
    def prepare(self, experience: Experience[Transition]) -> Batch[Transition]:
        """GAE advantages and returns of every agent, episode by episode, from the current critics (MARFT,
        Algorithm 1 line 12)."""
        episodes: dict[int, list[Transition]] = {}
        for tr in experience.items:
            episodes.setdefault(tr.episode, []).append(tr)
        for steps in episodes.values():
            values = self.critics.state_values([tr.state for tr in steps]).T  # [n, T]
            scores = torch.tensor(
                [tr.returned_rewards(self.ppo.gamma) for tr in steps], dtype=values.dtype, device=values.device
            )
            rewards = mixed_rewards(scores, self.own_reward_weight).T  # [n, T]
            dones = torch.tensor([float(tr.done) for tr in steps], device=values.device).expand_as(values)
            advantages, returns = gae(rewards, values, dones, self.ppo.gamma, self.gae_lambda)
            for t, tr in enumerate(steps):
                tr.advantages, tr.returns, tr.values = advantages[:, t], returns[:, t], values[:, t]
        return Batch(experience.items)

    def normalizers(self, minibatch: list[Transition], batch: Batch[Transition], index: int) -> Normalizers:
        """The global transition count and each transition's advantages ``[n]``, normalized over the minibatch of
        all ranks when ``normalize_advantages``."""
        advantages = [tr.advantages for tr in minibatch]
        advantages = normalize_pieces(self, advantages) if self.normalize_advantages else advantages
        return Normalizers(global_count(self, len(minibatch)), advantages=advantages)

    def critic_loss(
        self, micro: list[Transition], scale: Normalizers, j: int
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """Critic j's (clipped) loss against agent j's GAE returns, its share of the mean over critics, and
        agent j's (normalized) GAE advantages for its actor term."""
        advantages = torch.stack([tr.advantages[j] for tr in micro])  # [B]
        returns = torch.stack([tr.returns[j] for tr in micro])[:, None]
        old_values = torch.stack([tr.values[j] for tr in micro])[:, None]
        values = self.critics.state_values([tr.state for tr in micro], critic=j)  # [B, 1]
        clip = self.value_clip
        critic = value_loss(values, returns, old_values if clip else None, clip if clip else None)
        stats = {
            "train/value_mean": float(values.detach().mean()),
            "train/adv_mean": float(advantages.mean()),
            "train/adv_abs": float(advantages.abs().mean()),
            "train/explained_variance": explained_variance(values, returns),
        }
        return critic / len(self.critics), torch.stack([a[j] for a in scale.advantages])[:, None], stats
