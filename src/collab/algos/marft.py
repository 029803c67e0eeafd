"""What MARFT-A and MARFT-T share (MARFT, Section 4, Figure 3, Appendix B Algorithm 1).

Rollout (Algorithm 1, lines 3-11): each task is played once under the Flex-MG dependency D
(``dependency``; default the chain: agent i acts on s_t and its predecessors' actions a_t^{1:i-1});
every turn is a transition. ``prepare`` (line 12) computes the central critic's features and V_old once
(:mod:`collab.algos.marft_critic`), and the variant's advantages and value targets by GAE along
the episode's decision chain. Update (lines 13-17, the skeleton of :mod:`collab.algos.base`): one
optimizer step per minibatch on

    loss = L_actor - entropy_coef * H + value_coef * L_critic

(the variant's PPO-clip loss, the mean entropy of the agents' policies on their own responses, the optionally
clipped, optionally Huber value loss of the central head; means over the minibatch; its terms: :meth:`MARFT.terms`).

Options where the paper is silent or gives a choice: ``critic_warmup``, ``agent_schedule`` and ``target_kl``
(:mod:`collab.algos.marft_schedule`); ``normalize_advantages``: off by default (the reference code does not
normalize); rewards in [0, 1].
"""

from __future__ import annotations

from functools import partial
from typing import Union

import torch

from collab.algos.base import CollabModule, Term
from collab.algos.marft_critic import CentralCritic
from collab.algos.marft_schedule import SCHEDULES, scheduled_agents
from collab.errors import require_ranges
from collab.policy.mlp_head import CriticHead
from collab.rollout.episodes import play_once
from collab.rollout.experience import Batch, Experience, Normalizers, Transition, transitions
from collab.rollout.protocol import Dependency
from collab.runtime.collectives import global_count, global_mean, normalize_pieces
from collab.tools.team import acting_team


class MARFT(CentralCritic, CollabModule):
    def __init__(
        self,
        *,
        dependency: Union[str, list[list[int]], list[list[list[int]]]],
        critic_lr: float,
        critic_hidden: list[int],
        gamma: float,
        gae_lambda: float,
        clip: float,
        num_epochs: int,
        minibatch_size: int | None,
        value_coef: float,
        value_clip: float | None,
        huber_delta: float | None,
        entropy_coef: float,
        critic_warmup: int,
        agent_schedule: str,
        target_kl: float | None,
        normalize_advantages: bool,
        optim_eps: float,
        **kwargs,
    ) -> None:
        """
        Args:
            dependency: Flex-MG dependency D: chain | none | previous | parent lists per agent (or per step).
            critic_lr: Learning rate of the central critic head (Tables 5-10: 1e-5 or 3e-5).
            critic_hidden: Widths of the head's hidden layers (reference: [1024, 512]).
            gamma: Discount along the decision chain (every agent and, for MARFT-T, every token is one link).
            gae_lambda: GAE lambda (the tables' "gae gamma").
            clip: PPO clip range eps of the importance ratio.
            num_epochs: PPO epochs over each rollout's transitions ("ppo epoch").
            minibatch_size: Transitions (turns) per update; None: all of them ("num mini-batch" 1).
            value_coef: Weight of the critic loss ("critic loss coef").
            value_clip: Clip the new values to V_old +- value_clip in the value loss (None: off).
            huber_delta: Huber loss with this delta instead of the squared error (None: squared).
            entropy_coef: Weight of the entropy bonus ("entropy coef").
            critic_warmup: Rollouts at the start that train the critic head only.
            agent_schedule: all (every agent every update) | round_robin (one agent per rollout).
            target_kl: Early-stop a rollout's updates past this approximate KL (None: never).
            normalize_advantages: Normalize advantages over each minibatch.
            optim_eps: AdamW epsilon ("optim eps").
        """
        super().__init__(**kwargs)
        require_ranges(
            locals(),
            unit=("gamma", "gae_lambda"),
            positive=("critic_lr", "clip", "optim_eps"),
            non_negative=("critic_warmup",),
            counts=("num_epochs", "minibatch_size"),
            optional_positive=("value_clip", "huber_delta", "target_kl"),
            choices={"agent_schedule": SCHEDULES},
            widths=("critic_hidden",),
        )
        self.dependency, self.critic_lr, self.critic_hidden = dependency, critic_lr, list(critic_hidden)
        self.gamma, self.gae_lambda, self.clip, self.num_epochs = gamma, gae_lambda, clip, num_epochs
        self.minibatch_size, self.value_coef, self.value_clip = minibatch_size, value_coef, value_clip
        self.huber_delta, self.entropy_coef, self.critic_warmup = huber_delta, entropy_coef, critic_warmup
        self.agent_schedule, self.target_kl = agent_schedule, target_kl
        self.normalize_advantages, self.optim_eps = normalize_advantages, optim_eps
        self.critic: CriticHead | None = None

    # -- construction ------------------------------------------------------------------------------
    def build_extra(self, env) -> None:
        self.protocol = Dependency(self.dependency, len(self.team))
        self.build_critic()

    def param_groups(self):
        return super().param_groups() + [self.critic_group()]

    def configure_optimizers(self):
        return torch.optim.AdamW(self.param_groups(), weight_decay=0.0, eps=self.optim_eps)

    # -- rollout and prepare -----------------------------------------------------------------------
    def rollout(self, tasks) -> Experience[Transition]:
        episodes, stats, examples = play_once(
            acting_team(self.team, self.env), self.env, tasks, self.max_new_tokens, self.protocol
        )
        stats["reward/avg_step_reward"] = sum(ep.return_ / len(ep.steps) for ep in episodes) / len(episodes)
        return Experience(transitions(episodes), stats, examples, episodes)

    def scheduled(self, experience: Experience[Transition]) -> Batch[Transition]:
        """What the variant's ``prepare`` returns: the transitions, their values, advantages and returns fixed (its GAE,
        line 12), and the agents this rollout trains (:func:`~collab.algos.marft_schedule.scheduled_agents`)."""
        agents = scheduled_agents(self.rollouts, len(self.team), self.critic_warmup, self.agent_schedule)
        return Batch(experience.items, {"train/early_stop": 0.0, "train/actors_updated": float(len(agents))}, agents)

    # -- update ------------------------------------------------------------------------------------
    def normalizers(self, minibatch: list[Transition], batch: Batch[Transition], index: int) -> Normalizers:
        """The global transition count and each transition's advantages, one tensor per trained agent, normalized over
        the trained agents' decisions of all ranks' minibatches with ``normalize_advantages``."""
        count, agents = global_count(self, len(minibatch)), batch.agents
        if not agents:
            return Normalizers(count, agents=agents)
        advantages = [[self.agent_advantages(tr, i) for i in agents] for tr in minibatch]
        if self.normalize_advantages:
            normalized = iter(normalize_pieces(self, [a for per_agent in advantages for a in per_agent]))
            advantages = [[next(normalized) for _ in agents] for _ in minibatch]
        return Normalizers(count, advantages=advantages, agents=agents)

    summed_stats = ("train/tokens",)  # statistics that count (summed over the agents' terms), not average

    def terms(self, micro: list[Transition], scale: Normalizers) -> list[Term]:
        """The micro-batch's loss, ``value_coef * L_critic + L_actor - entropy_coef * H`` weighted by its share of the
        minibatch (``len(micro) / scale.count``), as the critic's term, then each trained agent's actor term (a
        transition holds every agent's response: one agent's forward alive at a time). L_actor and H are means over the
        agents' samples (MARFT-A: responses, MARFT-T: tokens): agent i's term and statistics (but counts) are weighted
        by its share of them."""
        weight, agents = len(micro) / scale.count, scale.agents or []
        advantages = [torch.cat([adv[k] for adv in scale.advantages]) for k in range(len(agents))]  # transition order
        samples = [len(a) for a in advantages]

        def critic() -> tuple[torch.Tensor, dict[str, float]]:
            loss, stats = self.critic_loss(micro)
            if agents and not any(samples):  # no response token to train (MARFT-T): the early stop reads a KL of 0
                stats["train/approx_kl"] = 0.0
            return self.value_coef * loss * weight, stats

        def actor(k: int) -> tuple[torch.Tensor, dict[str, float]]:
            loss, entropy, stats = self.actor_loss(micro, [agents[k]], advantages[k])
            share = samples[k] / sum(samples)
            stats = {key: value if key in self.summed_stats else share * value for key, value in stats.items()}
            return (loss - self.entropy_coef * entropy) * share * weight, stats

        return [critic] + [partial(actor, k) for k in range(len(agents)) if samples[k]]

    def accept(self, stats: dict[str, float], count: int, scale: Normalizers) -> bool:
        """``target_kl``'s early stop, decided on the approximate KL of all ranks' minibatches together (every
        rank refuses the same update, and the rollout's remaining ones)."""
        if self.target_kl is None or not scale.agents:
            return True
        return global_mean(self, stats.get("train/approx_kl", 0.0), count) <= self.target_kl

    def agent_advantages(self, tr: Transition, agent: int) -> torch.Tensor:
        """Agent ``agent``'s advantages in ``tr``: one for its action (MARFT-T: one per token of its response)."""
        return tr.advantages[agent : agent + 1]

    def actor_loss(
        self, minibatch: list[Transition], agents: list[int], advantages: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """The variant's clipped policy loss of ``agents``' responses, mean entropy and stats (``train/approx_kl``
        among them); ``advantages``: theirs, transition by transition, agent by agent, concatenated
        (:meth:`agent_advantages`)."""
        raise NotImplementedError

    def policy_forward(self, rows: list[tuple[Transition, int]]):
        """Teacher-forced per-token log-probs and entropies of each row's response (with gradients)."""
        completions = [tr.actions[i] for tr, i in rows]
        prompts, responses = [c.prompt_ids for c in completions], [c.completion_ids for c in completions]
        own = [c.own for c in completions]
        return self.team.logprobs([i for _, i in rows], prompts, responses, entropy=True, own=own)

    def on_save_checkpoint(self, checkpoint) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["collab"]["dependency"] = self.dependency
