"""What MARFT-A and MARFT-T share (MARFT, Section 4, Figure 3, Appendix B Algorithm 1).

Rollout (Algorithm 1, lines 3-11): each task is played once under the Flex-MG dependency D
(``dependency``; default the chain: agent i acts on s_t and its predecessors' actions a_t^{1:i-1});
every turn is a transition. ``prepare`` (line 12) computes the central critic's features and V_old once
(:class:`CentralCritic`), and the variant's advantages and value targets by GAE along
the episode's decision chain. Update (lines 13-17, the skeleton of :mod:`collab.algos.base`): one
optimizer step per minibatch on

    loss = L_actor - entropy_coef * H + value_head.coef * L_critic

(the variant's PPO-clip loss, the mean entropy of the agents' policies on their own responses, the optionally
clipped, optionally Huber value loss of the central head; means over the minibatch; its terms: :meth:`MARFT.terms`).

Options where the paper is silent or gives a choice: ``normalize_advantages``: off by default (the reference code
does not normalize); rewards in [0, 1]; and

- ``critic_warmup``: the first N rollouts train the critic only (the actors stay fixed while the
  head learns the return scale; Section 5.3.1 notes the high early value loss);
- ``agent_schedule``: ``all`` (every agent every update, Eq. 2) or ``round_robin`` (one agent per
  rollout, in order: HAPPO's sequential updates, which the paper cites for monotonic improvement);
- ``target_kl`` (:meth:`MARFT.accept`): stop a rollout's remaining minibatches once the
  approximate KL between the behaviour and current policies (k3 estimator, mean over the minibatch's decisions)
  exceeds it; the minibatch that crossed it is not applied. A rollout's first minibatch is on-policy, so every
  rollout makes at least one update.
"""

from __future__ import annotations

from functools import partial
from typing import Union

import torch

from collab.algos.base import CollabModule, Term
from collab.algos.groups import PPOOptions, ValueHeadOptions
from collab.errors import require_ranges
from collab.objectives import clipped_surrogate, explained_variance, ratio_stats, value_loss
from collab.policy.mlp_head import CriticHead, base_features
from collab.rollout.episodes import play_once
from collab.rollout.experience import Batch, Experience, Normalizers, Transition, transitions
from collab.rollout.protocol import Dependency
from collab.runtime.collectives import global_count, global_mean, normalize_pieces

SCHEDULES = ("all", "round_robin")


def scheduled_agents(rollout: int, n: int, critic_warmup: int, schedule: str) -> list[int]:
    """The agents of a team of ``n`` that rollout number ``rollout`` (counted from 1) trains: all, one in turn
    (``round_robin``), none in the critic's warm-up."""
    after_warmup = rollout - 1 - critic_warmup  # this rollout's place (< 0: in the warm-up)
    return [] if after_warmup < 0 else list(range(n)) if schedule == "all" else [after_warmup % n]


class CentralCritic(CriticHead):
    """MARFT's central critic (Section 4, Algorithm 1, lines 12 and 15): an MLP value head on the last hidden state of
    agent 0's frozen base (adapters off, :meth:`MARFT.features`, computed once per rollout in ``prepare``): MARFT-A
    values every decision point V(s_t, a_t^{1:i-1}), MARFT-T every token-level state."""

    def __init__(self, hidden_size: int, widths: list[int], value_clip: float | None, huber_delta: float | None):
        super().__init__(hidden_size, widths)
        self.value_clip, self.huber_delta = value_clip, huber_delta

    def loss(self, minibatch: list[Transition]) -> tuple[torch.Tensor, dict[str, float]]:
        """L_critic (line 15): the value loss against the GAE returns, optionally clipped around V_old, optionally
        Huber, and its statistics."""
        device = self.net[0].weight.device
        features = torch.cat([tr.features for tr in minibatch]).to(device)
        returns = torch.cat([tr.returns for tr in minibatch]).to(device)
        old_values = torch.cat([tr.values for tr in minibatch]).to(device)
        values = self(features)
        loss = value_loss(values, returns, old_values if self.value_clip else None, self.value_clip, self.huber_delta)
        return loss, {
            "train/critic_loss": float(loss.detach()),
            "train/value_mean": float(values.detach().mean()),
            "train/return_mean": float(returns.mean()),
            "train/explained_variance": explained_variance(values, returns),
        }


class MARFT(CollabModule):
    """The options and their meaning: ``conf/algo/marft_a.yaml``, ``marft_t.yaml``."""

    def __init__(
        self,
        *,
        dependency: Union[str, list[list[int]], list[list[list[int]]]],
        ppo: PPOOptions,
        value_head: ValueHeadOptions,
        gae_lambda: float,
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
        super().__init__(**kwargs)
        ppo.check()
        value_head.check()
        require_ranges(
            locals(),
            unit=("gae_lambda",),
            positive=("optim_eps",),
            non_negative=("critic_warmup",),
            optional_positive=("value_clip", "huber_delta", "target_kl"),
            choices={"agent_schedule": SCHEDULES},
        )
        self.dependency, self.ppo, self.value_head, self.gae_lambda = dependency, ppo, value_head, gae_lambda
        self.value_clip, self.huber_delta, self.entropy_coef = value_clip, huber_delta, entropy_coef
        self.critic_warmup, self.agent_schedule, self.target_kl = critic_warmup, agent_schedule, target_kl
        self.normalize_advantages, self.optim_eps = normalize_advantages, optim_eps
        self.critic: CentralCritic | None = None

    # -- construction ------------------------------------------------------------------------------
    def build_extra(self, env) -> None:
        self.protocol = Dependency(self.dependency, len(self.team))
        hidden = self.team.model_of(0).config.hidden_size  # the untrained base's: loaded when first read, if apart
        widths, clip = self.value_head.hidden, self.value_clip
        self.critic = CentralCritic(hidden, widths, clip, self.huber_delta).to(self.team.device)

    def param_groups(self):
        return super().param_groups() + [
            {"params": list(self.critic.parameters()), "lr": self.value_head.lr, "name": "critic"}
        ]

    @property
    def critic_model(self):
        """The frozen base the critic reads, agent 0's untrained base (a full-parameter agent 0's too:
        :meth:`~collab.policy.team.AgentTeam.untrained`), in a team of several bases too (every decision point valued in
        one feature space): MARFT-A re-encodes the others' observations from their text in its tokens and chat template
        (:meth:`~collab.algos.marft_a.MARFTA.observation_ids`); MARFT-T, valuing each token of a response, refuses
        it."""
        return self.team.untrained(0)

    def features(self, prompts, completions=None):
        """:func:`base_features` of rows already in the critic base's tokens (agent 0's tokenizer: its pad id)."""
        return base_features(self.critic_model, self.team.tokenizer_of(0).pad_token_id, prompts, completions)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.param_groups(), weight_decay=0.0, eps=self.optim_eps)

    # -- rollout and prepare -----------------------------------------------------------------------
    def rollout(self, tasks) -> Experience[Transition]:
        episodes, stats, examples = play_once(self.team, self.env, tasks, self.max_new_tokens, self.protocol)
        stats["reward/avg_step_reward"] = sum(ep.return_ / len(ep.steps) for ep in episodes) / len(episodes)
        return Experience(transitions(episodes), stats, examples, episodes)

    def scheduled(self, experience: Experience[Transition]) -> Batch[Transition]:
        """What the variant's ``prepare`` returns: the transitions, their values, advantages and returns fixed (its GAE,
        line 12), and the agents this rollout trains (:func:`scheduled_agents`)."""
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
        """The micro-batch's loss, ``value_head.coef * L_critic + L_actor - entropy_coef * H`` weighted by its share of
        the minibatch (``len(micro) / scale.count``), as the critic's term, then each trained agent's actor term (a
        transition holds every agent's response: one agent's forward alive at a time). L_actor and H are means over the
        agents' samples (MARFT-A: responses, MARFT-T: tokens): agent i's term and statistics (but counts) are weighted
        by its share of them."""
        weight, agents = len(micro) / scale.count, scale.agents or []
        advantages = [torch.cat([adv[k] for adv in scale.advantages]) for k in range(len(agents))]  # transition order
        samples = [len(a) for a in advantages]

        def critic() -> tuple[torch.Tensor, dict[str, float]]:
            loss, stats = self.critic.loss(micro)
            if agents and not any(samples):  # no response token to train (MARFT-T): the early stop reads a KL of 0
                stats["train/approx_kl"] = 0.0
            return self.value_head.coef * loss * weight, stats

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

    def clipped_actor(self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, entropy):
        """:meth:`actor_loss`'s result from the variant's (sequence or token) log-probs and mean entropy."""
        advantages = advantages.to(logprobs)
        loss = clipped_surrogate(logprobs, old_logprobs, advantages, self.ppo.clip).mean()
        stats = {
            "train/actor_loss": float(loss.detach()),
            "train/entropy": float(entropy.detach()),
            **ratio_stats(logprobs, old_logprobs, self.ppo.clip),
            "train/adv_mean": float(advantages.mean()),
        }
        return loss, entropy, stats

    def policy_forward(self, rows: list[tuple[Transition, int]]):
        """Teacher-forced per-token log-probs and entropies of each row's response (with gradients)."""
        completions = [tr.actions[i] for tr, i in rows]
        prompts, responses = [c.prompt_ids for c in completions], [c.completion_ids for c in completions]
        own = [c.own for c in completions]
        return self.team.logprobs([i for _, i in rows], prompts, responses, entropy=True, own=own)

    def on_save_checkpoint(self, checkpoint) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["collab"]["dependency"] = self.dependency
