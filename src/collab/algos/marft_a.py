"""MARFT-A: action-level multi-agent reinforcement fine-tuning (MARFT, Section 4, Eq. 2, Algorithm 1).

Each agent's whole response a_t^i is one action, taken on its observation (s_t, a_t^{1:i-1}). The
central critic values every decision point, V(s_t, a_t^{1:i-1}), and GAE runs backwards along the
episode's chain (t=0, agent 1) -> ... -> (t=0, agent n) -> (t=1, agent 1) -> ...: the successor of
agent i is agent i+1 at the same step, the successor of the last agent is the first agent at the
next step, and only the last agent receives the team reward r_t (``objectives.chain`` + ``gae``).

The actor loss is Eq. 2, the PPO-clipped objective averaged over agents and steps (1/nT sum_i sum_t):

    r_t^i(theta) = pi_theta^i(a_t^i | s_t, a_t^{1:i-1}) / pi_old^i(a_t^i | s_t, a_t^{1:i-1})

with the sequence probability of the response (the sum of its token log-probs). ``logprob_reduction
= "mean"`` uses the token-normalized log-prob (mean over tokens) instead, which keeps the ratio of a
long response from saturating the clip range (the paper does not say which; the sum is the literal
sequence probability and the default).
"""

from __future__ import annotations

import torch

from collab.algos.marft import MARFT
from collab.errors import require
from collab.objectives import chain, gae
from collab.rollout.experience import Batch, Experience, Transition

REDUCTIONS = ("sum", "mean")


class MARFTA(MARFT):
    """The options and their meaning: ``conf/algo/marft_a.yaml``."""

    def __init__(self, *, logprob_reduction: str, **kwargs) -> None:
        super().__init__(**kwargs)
        require(
            logprob_reduction in REDUCTIONS,
            f"unknown model.logprob_reduction {logprob_reduction!r}; valid: {', '.join(REDUCTIONS)}",
        )
        self.logprob_reduction = logprob_reduction

    @torch.no_grad()
    def prepare(self, experience: Experience[Transition]) -> Batch[Transition]:
        """V(s_t, a_t^{1:i-1}) of every decision point from the critic's frozen features, and GAE along each
        episode's agent chain (the team reward on the last agent's link)."""
        n, items = len(self.team), experience.items
        features = torch.stack(self.features(self.observation_ids(experience))).view(len(items), n, -1)
        values = self.critic(features.to(self.critic.net[0].weight.device)).cpu()  # [turns, n]
        by_episode: dict[int, list[int]] = {}
        for k, tr in enumerate(items):
            by_episode.setdefault(tr.episode, []).append(k)
        for rows in by_episode.values():
            step_rewards = torch.tensor([sum(items[k].returned_rewards(self.ppo.gamma)) / n for k in rows])
            rewards, dones = chain(step_rewards, [n] * len(rows), terminated=items[rows[-1]].done)
            advantages, returns = gae(rewards, values[rows].reshape(-1), dones, self.ppo.gamma, self.gae_lambda)
            for j, k in enumerate(rows):
                span = slice(j * n, (j + 1) * n)
                tr = items[k]
                tr.features, tr.values, tr.advantages, tr.returns = (
                    features[k],
                    values[k],
                    advantages[span],
                    returns[span],
                )
        return self.scheduled(experience)

    def observation_ids(self, experience: Experience[Transition]) -> list[list[int]]:
        """Each (transition, agent)'s observation as token ids of the critic's base, in row order: an agent on the
        critic's base gives its own prompt ids; another agent's observation (its chat, as text) is encoded again
        with the critic base's tokenizer and chat template, since its ids belong to another vocabulary."""
        from collab.policy.models import encode_chat

        team, episodes = self.team, experience.episodes
        name, tokenizer = team.agents[0].base.name, team.tokenizer_of(0)  # a full agent's base name counts
        out = []
        for tr in experience.items:
            for i, c in enumerate(tr.actions):
                if team.agents[i].base.name == name:
                    out.append(list(c.prompt_ids))
                else:  # another base: the same chat in the critic base's tokens
                    out.append(encode_chat(tokenizer, episodes[tr.episode].observations[tr.turn][i]))
        return out

    def sequence_logprob(self, token_logprobs: torch.Tensor) -> torch.Tensor:
        total = token_logprobs.sum()
        return total / max(len(token_logprobs), 1) if self.logprob_reduction == "mean" else total

    def actor_loss(self, minibatch: list[Transition], agents: list[int], advantages: torch.Tensor):
        rows = [(tr, i) for tr in minibatch for i in agents]
        token_logprobs, entropies = self.policy_forward(rows)
        logprobs = torch.stack([self.sequence_logprob(lp) for lp in token_logprobs])
        old_logprobs = torch.stack([self.sequence_logprob(torch.tensor(tr.actions[i].logprobs)) for tr, i in rows]).to(
            logprobs
        )
        return self.clipped_actor(logprobs, old_logprobs, advantages, torch.stack([e.mean() for e in entropies]).mean())
