"""CoLLM-CC and CoLLM-DC: multi-agent actor-critic with LLM critics (CoLLM, Section 4, Appendix B).

``--algo collm_cc`` (``critic: centralized``, Algorithm 1): one critic V_phi(h_t, m_t) on the joint
history; every agent's actor is weighted by the team's TD error (Eq. 4)

    delta_t = r_t + gamma V_phi(h_{t+1}) - V_phi(h_t)

and the critic minimises the squared TD error (Eq. 5). ``--algo collm_dc`` (``critic: decentralized``,
Algorithm 2): critic i values agent i's own history, delta_{i,t} uses it (Eq. 2, loss Eq. 3).

Per minibatch of transitions: V(h_t) with gradients, V(h_{t+1}) without (the TD target is a
constant; 0 after the episode's last turn, which ends the episode whether the environment terminated
it or the turn limit did: collab's episodes are finite-horizon tasks), the actor loss with delta as
the advantage (PPO-clipped ratio, Appendix C's advantage clip), the critic loss, one optimizer step.
Each critic's term and each agent's actor term are separate backward passes
(:meth:`~collab.algos.actor_critic.ActorCritic.terms`); ``train/explained_variance`` is then the mean of
the critics' own.
Advantages are not normalized: the TD error already has the reward's scale, as in the paper.

With ``critic_spec.kind: q`` the critic is Q(h_t, a_t): its target is r_t + gamma Q(h_{t+1}, a_{t+1})
(the action actually taken next, SARSA) and the actor is weighted by Q(h_t, a_t) itself (the
Q actor-critic gradient, no baseline).
"""

from __future__ import annotations

import torch

from collab.algos.actor_critic import ActorCritic
from collab.objectives import explained_variance, td_targets, value_loss
from collab.rollout.experience import Normalizers, Transition


class CoLLM(ActorCritic):
    def critic_loss(
        self, micro: list[Transition], scale: Normalizers, j: int
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """Critic j's Eq. 5 loss (Eq. 3 for CoLLM-DC's critic of agent j), its share of the mean over critics,
        and Eq. 4's actor weights of the agents it advises: the TD errors (Q(h_t, a_t) for a Q-critic)."""
        critics, q = self.critics, self.critic_spec.kind == "q"
        values = critics.state_values(
            [tr.state for tr in micro], [[c.text for c in tr.actions] for tr in micro] if q else None, critic=j
        )
        next_values = torch.zeros_like(values)
        live = [b for b, tr in enumerate(micro) if not tr.done]
        if live:
            with torch.no_grad():
                nxt = critics.state_values(
                    [micro[b].next_state for b in live], [micro[b].next_actions for b in live] if q else None, critic=j
                )
            next_values[live] = nxt
        rewards = self.rewards_of(micro)[:, j : j + 1]
        targets = td_targets(rewards, next_values, self.dones(micro, values.device), self.ppo.gamma)
        deltas = (targets - values).detach()
        weights = values.detach() if q else deltas
        advantages = weights.expand(-1, len(self.advised(j)))
        stats = {
            "train/value_mean": float(values.detach().mean()),
            "train/td_error_mean": float(deltas.mean()),
            "train/td_error_abs": float(deltas.abs().mean()),
            "train/explained_variance": explained_variance(values, targets),
        }
        return value_loss(values, targets) / len(critics), advantages, stats
