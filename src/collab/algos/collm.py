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
    def loss(self, micro: list[Transition], scale: Normalizers) -> tuple[torch.Tensor, dict[str, float]]:
        """Eq. 4's actor loss weighted by the TD errors (Q(h_t, a_t) for a Q-critic) and Eq. 5's critic loss
        (Eq. 2 and 3 per agent for CoLLM-DC), means over the micro-batch, weighted by its share of the micro."""
        critics, q = self.critics, self.critic_spec.kind == "q"
        values = critics.state_values([tr.state for tr in micro],
                                      [[c.text for c in tr.actions] for tr in micro] if q else None)
        next_values = torch.zeros_like(values)
        live = [b for b, tr in enumerate(micro) if not tr.done]
        if live:
            with torch.no_grad():
                nxt = critics.state_values([micro[b].next_state for b in live],
                                           [micro[b].next_actions for b in live] if q else None)
            next_values[live] = nxt
        rewards = self.rewards_of(micro)
        targets = td_targets(rewards, next_values, self.dones(micro, values.device), self.gamma)
        deltas = (targets - values).detach()
        weights = values.detach() if q else deltas
        n = len(self.team)
        advantages = weights.expand(-1, n) if weights.shape[-1] == 1 else weights
        actor, stats = self.actor_loss(micro, advantages)
        critic = value_loss(values, targets)
        stats.update({"train/actor_loss": float(actor.detach()), "train/critic_loss": float(critic.detach()),
                      "train/value_mean": float(values.detach().mean()), "train/td_error_mean": float(deltas.mean()),
                      "train/td_error_abs": float(deltas.abs().mean()),
                      "train/explained_variance": explained_variance(values, targets)})
        return (actor + critic) * (len(micro) / scale.count), stats
