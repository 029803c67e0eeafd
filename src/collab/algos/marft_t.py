"""MARFT-T: token-level multi-agent reinforcement fine-tuning (MARFT, Section 4, "MARFT-T").

Every token is an action. The critic values each token-level state V(s_t, a_t^{1:i-1}, w^{i,1:j}),
read where the policy chooses token j+1 of agent i's response (``mlp_head``), and Section 4's
backup runs along the episode's token chain:

    V(s_t, a^{1:i-1}, w^{i,1:j}) <- 0 + gamma V(s_t, a^{1:i-1}, w^{i,1:j+1})     inside agent i's response
                                 <- 0 + gamma V(s_t, a^{1:i}, first token of agent i+1)   at its last token, i < n
                                 <- R(s_t, a_t) + gamma V(s_{t+1}, first decision)        at agent n's last token

i.e. zero reward everywhere but the last agent's last token of each step
(``objectives.chain`` with the tokens of all n responses as the step's length, and
``objectives.bellman_targets`` for the one-step backup). Advantages and value targets are GAE along
that chain (lambda = 0: the backup itself). Indexing: the paper's state w^{i,1:j} holds the first j
tokens; here the state of token j is the one before it is chosen, so every generated token, the first
included, has a state value and an advantage (the reference code does the same).

The actor loss is the per-token PPO-clip loss and the critic loss the per-token value loss, both
averaged over the real tokens of the minibatch's responses (no padding enters either mean).
"""

from __future__ import annotations

import torch

from collab.algos.marft import MARFT
from collab.errors import UserError
from collab.objectives import chain, gae
from collab.policy.sampling import own_rows
from collab.rollout.experience import Batch, Experience, Transition


class MARFTT(MARFT):
    def build_extra(self, env) -> None:
        super().build_extra(env)
        if len({agent.base.name for agent in self.team.agents}) > 1:  # the critic's tokens would not line up
            names = list(dict.fromkeys(spec.base or self.base.name for spec in self.team.specs))
            raise UserError(
                f"marft_t values every token of every agent's response with one critic, in the agents' own "
                f"tokens, so every agent must share one base; model.agents name {len(names)} bases "
                f"({', '.join(names)}): give them one base, or use marft_a (a value per response) for a team "
                f"of several bases"
            )

    @torch.no_grad()
    def prepare(self, experience: Experience[Transition]) -> Batch[Transition]:
        """The critic's value of every token-level state, and GAE along each episode's token chain (the team
        reward on the last agent's last token of each step)."""
        n, items = len(self.team), experience.items
        prompts = [list(c.prompt_ids) for tr in items for c in tr.actions]
        completions = [list(c.completion_ids) for tr in items for c in tr.actions]
        owns = [c.own for tr in items for c in tr.actions]
        features = own_rows(self.features(prompts, completions), owns)  # n per item, [L, H] each: own tokens
        device = self.critic.net[0].weight.device
        values = [self.critic(f.to(device)).cpu() if len(f) else torch.zeros(0) for f in features]
        by_episode: dict[int, list[int]] = {}
        for k, tr in enumerate(items):
            by_episode.setdefault(tr.episode, []).append(k)
        for rows in by_episode.values():
            lengths = [sum(len(features[k * n + i]) for i in range(n)) for k in rows]
            step_rewards = torch.tensor([sum(items[k].returned_rewards(self.ppo.gamma)) / n for k in rows])
            rewards, dones = chain(step_rewards, lengths, terminated=items[rows[-1]].done)
            flat_values = torch.cat([values[k * n + i] for k in rows for i in range(n)])
            advantages, returns = gae(rewards, flat_values, dones, self.ppo.gamma, self.gae_lambda)
            start = 0
            for k, length in zip(rows, lengths):
                span = slice(start, start + length)
                tr = items[k]
                tr.features, tr.values = torch.cat(features[k * n : (k + 1) * n]), flat_values[span]
                tr.advantages, tr.returns = advantages[span], returns[span]
                start += length
        return self.scheduled(experience)

    def agent_advantages(self, tr: Transition, agent: int) -> torch.Tensor:
        """The advantages of agent ``agent``'s own tokens: its span of the turn's token chain."""
        start = sum(c.own_tokens for c in tr.actions[:agent])
        return tr.advantages[start : start + tr.actions[agent].own_tokens]

    def actor_loss(self, minibatch: list[Transition], agents: list[int], advantages: torch.Tensor):
        rows = [(tr, i) for tr in minibatch for i in agents if tr.actions[i].completion_ids]
        token_logprobs, entropies = self.policy_forward(rows)
        logprobs = torch.cat(token_logprobs)
        old_logprobs = torch.cat([torch.tensor(tr.actions[i].logprobs) for tr, i in rows]).to(logprobs)
        loss, entropy, stats = self.clipped_actor(logprobs, old_logprobs, advantages, torch.cat(entropies).mean())
        return loss, entropy, {**stats, "train/tokens": float(len(logprobs))}
