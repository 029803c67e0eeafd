"""What MARFT-A and MARFT-T share (paper 004, Section 4, Figure 3, Appendix B Algorithm 1).

Rollout (Algorithm 1, lines 3-11): each task of the step is played once under the Flex-MG
dependency D (``dependency``; default the sequential chain: agent i acts on s_t and the actions
a_t^{1:i-1} of its predecessors). Every turn becomes a transition in the replay buffer. The central
critic's features (the frozen base's last hidden state, adapters off) are computed once here, with
the rollout-time values V_old, and the variant's ``prepare`` fixes advantages and value targets by
GAE along the episode's decision chain (line 12).

Update (lines 13-17): ``num_epochs`` passes of minibatches over the buffer; each minibatch takes one
optimizer step on

    loss = L_actor - entropy_coef * H + value_loss_coef * L_critic

where L_actor is the variant's PPO-clip loss, H the mean entropy of the agents' policies on their
own responses and L_critic the (optionally clipped, optionally Huber) value loss of the central head.

Options where the paper is silent or gives a choice:

- ``critic_warmup``: the first N rollouts train the critic only (the actors stay fixed while the
  head learns the return scale; Section 5.3.1 notes the high early value loss);
- ``agent_schedule``: ``all`` (every agent every update, Eq. 2) or ``round_robin`` (one agent per
  rollout, in order: HAPPO's sequential updates, which the paper cites for monotonic improvement);
- ``target_kl``: stop a rollout's remaining minibatches once the approximate KL between the behaviour
  and current policies (k3 estimator, mean over the minibatch's decisions) exceeds it; the minibatch
  that crossed it is not applied. The first minibatch of a rollout is on-policy, so every rollout
  makes at least one update;
- ``normalize_advantages``: off by default (the reference code does not normalize); rewards in [0, 1].
"""

from __future__ import annotations

import time
from typing import Union

import torch

from collab.distributed import global_normalize, global_sum, minibatch_schedule, optimizer_step, world_size
from collab.algos.base import CollabModule
from collab.mlp_head import HIDDEN, CriticHead, base_features
from collab.errors import require
from collab.objectives import explained_variance, value_loss
from collab.rollout.buffer import ReplayBuffer, Transition, transitions
from collab.rollout.episodes import Episode, episode_stats, play
from collab.rollout.protocol import Dependency
from collab.rollout.trajectory import RolloutBatch

SCHEDULES = ("all", "round_robin")


class MARFT(CollabModule):
    def __init__(self, *args, dependency: Union[str, list[list[int]], list[list[list[int]]]] = "chain",
                 critic_lr: float = 1e-5, critic_hidden: list[int] | None = None, gamma: float = 0.99,
                 gae_lambda: float = 0.95, clip: float = 0.2, num_epochs: int = 1,
                 minibatch_size: int | None = None, value_loss_coef: float = 1.0, value_clip: float | None = None,
                 huber_delta: float | None = None, entropy_coef: float = 1e-3, critic_warmup: int = 0,
                 agent_schedule: str = "all", target_kl: float | None = None, normalize_advantages: bool = False,
                 optim_eps: float = 1e-5, **kwargs) -> None:
        """
        Args:
            dependency: Flex-MG dependency D: chain | none | previous | parent lists per agent (or per step).
            critic_lr: Learning rate of the central critic head (Tables 5-10: 1e-5 or 3e-5).
            critic_hidden: Widths of the head's hidden layers (reference: [1024, 512]).
            gamma: Discount along the decision chain (every agent and, for MARFT-T, every token is one link).
            gae_lambda: GAE lambda (the tables' "gae gamma").
            clip: PPO clip range eps of the importance ratio.
            num_epochs: PPO epochs over each rollout's buffer ("ppo epoch").
            minibatch_size: Transitions (turns) per update; None: the whole buffer ("num mini-batch" 1).
            value_loss_coef: Weight of the critic loss ("critic loss coef").
            value_clip: Clip the new values to V_old +- value_clip in the value loss (None: off).
            huber_delta: Huber loss with this delta instead of the squared error (None: squared).
            entropy_coef: Weight of the entropy bonus ("entropy coef").
            critic_warmup: Rollouts at the start that train the critic head only.
            agent_schedule: all (every agent every update) | round_robin (one agent per rollout).
            target_kl: Early-stop a rollout's updates past this approximate KL (None: never).
            normalize_advantages: Normalize advantages over each minibatch.
            optim_eps: AdamW epsilon ("optim eps").
        """
        super().__init__(*args, **kwargs)
        require(critic_lr > 0, f"model.critic_lr must be > 0, got {critic_lr}")
        require(0 <= gamma <= 1, f"model.gamma must be in [0, 1], got {gamma}")
        require(0 <= gae_lambda <= 1, f"model.gae_lambda must be in [0, 1], got {gae_lambda}")
        require(clip > 0, f"model.clip must be > 0, got {clip}")
        require(num_epochs >= 1, f"model.num_epochs must be >= 1, got {num_epochs}")
        require(minibatch_size is None or minibatch_size >= 1, f"model.minibatch_size must be >= 1, got {minibatch_size}")
        require(value_clip is None or value_clip > 0, f"model.value_clip must be > 0 or null, got {value_clip}")
        require(huber_delta is None or huber_delta > 0, f"model.huber_delta must be > 0 or null, got {huber_delta}")
        require(critic_warmup >= 0, f"model.critic_warmup must be >= 0, got {critic_warmup}")
        require(agent_schedule in SCHEDULES, f"unknown model.agent_schedule {agent_schedule!r}; valid: {', '.join(SCHEDULES)}")
        require(target_kl is None or target_kl > 0, f"model.target_kl must be > 0 or null, got {target_kl}")
        require(optim_eps > 0, f"model.optim_eps must be > 0, got {optim_eps}")
        self.dependency, self.critic_lr = dependency, critic_lr
        require(critic_hidden is None or all(isinstance(w, int) and w >= 1 for w in critic_hidden),
                f"model.critic_hidden must list layer widths >= 1 (e.g. [1024, 512]) or be null, got {critic_hidden}")
        self.critic_hidden = list(critic_hidden) if critic_hidden is not None else list(HIDDEN)
        self.gamma, self.gae_lambda, self.clip, self.num_epochs = gamma, gae_lambda, clip, num_epochs
        self.minibatch_size, self.value_loss_coef, self.value_clip = minibatch_size, value_loss_coef, value_clip
        self.huber_delta, self.entropy_coef, self.critic_warmup = huber_delta, entropy_coef, critic_warmup
        self.agent_schedule, self.target_kl = agent_schedule, target_kl
        self.normalize_advantages, self.optim_eps = normalize_advantages, optim_eps
        self.critic: CriticHead | None = None

    # -- construction ------------------------------------------------------------------------------
    def build_extra(self, env) -> None:
        self.protocol = Dependency(self.dependency, len(self.team))
        model = self.critic_model
        self.critic = CriticHead(model.config.hidden_size, self.critic_hidden).to(self.team.device)

    @property
    def critic_model(self):
        """The frozen base the critic reads: the first agent's (every agent's, in a homogeneous team)."""
        return self.team.model_of(0)

    def param_groups(self):
        return super().param_groups() + [{"params": list(self.critic.parameters()), "lr": self.critic_lr, "name": "critic"}]

    def configure_optimizers(self):
        return torch.optim.AdamW(self.param_groups(), weight_decay=0.0, eps=self.optim_eps)

    # -- rollout -----------------------------------------------------------------------------------
    def rollout(self, env, tasks) -> RolloutBatch:
        start = time.perf_counter()
        episodes = [eps[0] for eps in play(self.team, env, tasks, 1, self.max_new_tokens, dependency=self.protocol)]
        stats = episode_stats(episodes, time.perf_counter() - start)
        stats["reward/avg_step_reward"] = sum(ep.return_ / len(ep.steps) for ep in episodes) / len(episodes)
        items = transitions(episodes)
        with torch.no_grad():
            self.prepare(episodes, items)
        examples = [{"prompts": [obs[-1]["content"] for obs in ep.observations[0]], "responses": ep.responses[0],
                     "reward": list(ep.steps[0].rewards)} for ep in episodes[:1]]
        return RolloutBatch([], stats, examples, buffer=ReplayBuffer(items))

    def prepare(self, episodes: list[Episode], items: list[Transition]) -> None:
        """Fix features, old values, advantages and returns in each transition's ``extras``."""
        raise NotImplementedError

    def observation_ids(self, episodes: list[Episode], items: list[Transition]) -> list[list[int]]:
        """Each (transition, agent)'s observation as token ids of the critic's base, in row order."""
        from collab.policy.models import encode_chat

        key, tokenizer = self.team.base_of[0], self.team.tokenizer_of(0)
        out = []
        for tr in items:
            for i, c in enumerate(tr.actions):
                if self.team.base_of[i] == key:
                    out.append(list(c.prompt_ids))
                else:  # another base: the same chat in the critic base's tokens
                    out.append(encode_chat(tokenizer, episodes[tr.episode].observations[tr.turn][i]))
        return out

    def features(self, prompts, completions=None):
        return base_features(self.critic_model, self.team.tokenizer_of(0).pad_token_id, prompts, completions)

    # -- update ------------------------------------------------------------------------------------
    def trained_agents(self) -> list[int]:
        """The agents this rollout updates: all, or one in turn (``round_robin``); none during warm-up."""
        if self.rollouts <= self.critic_warmup:
            return []
        n = len(self.team)
        return list(range(n)) if self.agent_schedule == "all" else [(self.rollouts - 1 - self.critic_warmup) % n]

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        buffer: ReplayBuffer = batch.buffer
        generator = torch.Generator().manual_seed(self.rollouts)
        agents = self.trained_agents()
        totals: dict[str, list[float]] = {}
        stopped = False
        minibatches = list(buffer.epochs(self.num_epochs, self.minibatch_size, generator))
        for minibatch, share in minibatch_schedule(self, minibatches):
            if not minibatch:  # another rank has more minibatches: a step with no data here (same collectives)
                if agents and self.normalize_advantages:
                    global_normalize(self, torch.zeros(0))
                if agents and self.kl_exceeded(0.0, 0):
                    stopped = True
                    break
                optimizer_step(self, [])
                continue
            critic, stats = self.critic_loss(minibatch)
            loss = self.value_loss_coef * critic
            if agents:
                actor, entropy, actor_stats = self.actor_loss(minibatch, agents)
                stats.update(actor_stats)
                if self.kl_exceeded(actor_stats["train/approx_kl"], len(minibatch)):
                    stopped = True
                    break
                loss = loss + actor - self.entropy_coef * entropy
            optimizer_step(self, [lambda loss=loss: loss * share if share != 1.0 else loss])
            for key, value in stats.items():
                totals.setdefault(key, []).append(value)
        buffer.clear()
        out = {key: sum(v) / len(v) for key, v in totals.items()}
        out.update({"train/early_stop": float(stopped), "train/actors_updated": float(len(agents))})
        return out

    def kl_exceeded(self, approx_kl: float, count: int) -> bool:
        """``target_kl``'s early stop, decided on the approximate KL of all ranks' minibatches together (every
        rank stops at the same update)."""
        if self.target_kl is None:
            return False
        if world_size(self) > 1:
            total, n = global_sum(self, [approx_kl * count, count]).tolist()
            approx_kl = total / n if n else 0.0
        return approx_kl > self.target_kl

    def critic_loss(self, minibatch: list[Transition]) -> tuple[torch.Tensor, dict[str, float]]:
        device = self.critic.net[0].weight.device
        features = torch.cat([tr.extras["features"] for tr in minibatch]).to(device)
        returns = torch.cat([tr.extras["returns"] for tr in minibatch]).to(device)
        old_values = torch.cat([tr.extras["values"] for tr in minibatch]).to(device)
        values = self.critic(features)
        clip = self.value_clip
        loss = value_loss(values, returns, old_values if clip else None, clip, self.huber_delta)
        return loss, {"train/critic_loss": float(loss.detach()), "train/value_mean": float(values.detach().mean()),
                      "train/return_mean": float(returns.mean()), "train/explained_variance": explained_variance(values, returns)}

    def actor_loss(self, minibatch: list[Transition], agents: list[int]) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """The variant's clipped policy loss, mean entropy and stats (``train/approx_kl`` among them)."""
        raise NotImplementedError

    def policy_forward(self, rows: list[tuple[Transition, int]]):
        """Teacher-forced per-token log-probs and entropies of each row's response (with gradients)."""
        completions = [tr.actions[i] for tr, i in rows]
        return self.team.logprobs([i for _, i in rows], [c.prompt_ids for c in completions],
                                  [c.completion_ids for c in completions], entropy=True)

    def on_save_checkpoint(self, checkpoint) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["collab"]["dependency"] = self.dependency

