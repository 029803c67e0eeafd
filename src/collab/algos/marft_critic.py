"""MARFT's central critic: one MLP value head on a frozen base, its features and its value loss (MARFT, Section 4,
Algorithm 1, lines 12 and 15).

The head (:class:`~collab.policy.mlp_head.CriticHead`) reads the last hidden state of agent 0's frozen base
(adapters off), computed once per rollout in ``prepare``: MARFT-A values every decision point
V(s_t, a_t^{1:i-1}), MARFT-T every token-level state. L_critic is the head's value loss against the GAE
returns, optionally clipped around V_old, optionally Huber.
"""

from __future__ import annotations

import torch

from collab.objectives import explained_variance, value_loss
from collab.policy.mlp_head import CriticHead, base_features
from collab.rollout.experience import Transition


class CentralCritic:
    """The critic of :class:`~collab.algos.marft.MARFT` (mixed in before :class:`~collab.algos.base.CollabModule`),
    which holds the options it reads: ``critic_hidden``, ``critic_lr``, ``value_clip`` and ``huber_delta``."""

    def build_critic(self) -> None:
        hidden = self.team.model_of(0).config.hidden_size  # the untrained base's: loaded when first read, if apart
        self.critic = CriticHead(hidden, self.critic_hidden).to(self.team.device)

    @property
    def critic_model(self):
        """The frozen base the critic reads, agent 0's untrained base (a full-parameter agent 0's too:
        :meth:`~collab.policy.team.AgentTeam.untrained`), in a team of several bases too (every decision point valued in
        one feature space): MARFT-A re-encodes the others' observations from their text in its tokens and chat template
        (:meth:`~collab.algos.marft_a.MARFTA.observation_ids`); MARFT-T, valuing each token of a response, refuses
        it."""
        return self.team.untrained(0)

    def critic_group(self) -> dict:
        """The head's parameter group, at its own learning rate."""
        return {"params": list(self.critic.parameters()), "lr": self.critic_lr, "name": "critic"}

    def features(self, prompts, completions=None):
        """:func:`base_features` of rows already in the critic base's tokens (agent 0's tokenizer: its pad id)."""
        return base_features(self.critic_model, self.team.tokenizer_of(0).pad_token_id, prompts, completions)

    def critic_loss(self, minibatch: list[Transition]) -> tuple[torch.Tensor, dict[str, float]]:
        """L_critic (Algorithm 1, line 15): the central head's value loss against the GAE returns, and its stats."""
        device = self.critic.net[0].weight.device
        features = torch.cat([tr.features for tr in minibatch]).to(device)
        returns = torch.cat([tr.returns for tr in minibatch]).to(device)
        old_values = torch.cat([tr.values for tr in minibatch]).to(device)
        values = self.critic(features)
        loss = value_loss(values, returns, old_values if self.value_clip else None, self.value_clip, self.huber_delta)
        return loss, {
            "train/critic_loss": float(loss.detach()),
            "train/value_mean": float(values.detach().mean()),
            "train/return_mean": float(returns.mean()),
            "train/explained_variance": explained_variance(values, returns),
        }
