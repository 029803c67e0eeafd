"""What MARFT-A and MARFT-T share (MARFT, Section 4, Figure 3, Appendix B Algorithm 1).

Rollout (Algorithm 1, lines 3-11): each task is played once under the Flex-MG dependency D
(``dependency``; default the chain: agent i acts on s_t and its predecessors' actions a_t^{1:i-1});
every turn is a transition. ``prepare`` (line 12) computes the central critic's features (the frozen
base's last hidden state) and V_old once, and the variant's advantages and value targets by GAE along
the episode's decision chain. Update (lines 13-17, the skeleton of :mod:`collab.algos.base`): one
optimizer step per minibatch on

    loss = L_actor - entropy_coef * H + value_coef * L_critic

(the variant's PPO-clip loss, the mean entropy of the agents' policies on their own responses, the
optionally clipped, optionally Huber value loss of the central head; means over the minibatch). The critic's
term and each agent's actor term are backward passes of their own (:meth:`MARFT.terms`: one agent's forward
alive at a time), the gradient of the sum.

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

from functools import partial
from typing import Union

import torch

from collab.algos.base import CollabModule, add_term
from collab.training.distributed import global_count, global_mean, normalize_pieces
from collab.errors import require_ranges
from collab.policy.mlp_head import CriticHead, base_features
from collab.objectives import explained_variance, value_loss
from collab.rollout.episodes import play_once
from collab.rollout.experience import Batch, Experience, Normalizers, Transition, transitions
from collab.rollout.protocol import Dependency

SCHEDULES = ("all", "round_robin")


class MARFT(CollabModule):
    def __init__(self, *, dependency: Union[str, list[list[int]], list[list[list[int]]]], critic_lr: float,
                 critic_hidden: list[int], gamma: float, gae_lambda: float, clip: float, num_epochs: int,
                 minibatch_size: int | None, value_coef: float, value_clip: float | None, huber_delta: float | None,
                 entropy_coef: float, critic_warmup: int, agent_schedule: str, target_kl: float | None,
                 normalize_advantages: bool, optim_eps: float, **kwargs) -> None:
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
        require_ranges(locals(), unit=("gamma", "gae_lambda"), positive=("critic_lr", "clip", "optim_eps"),
                       non_negative=("critic_warmup",), counts=("num_epochs", "minibatch_size"),
                       optional_positive=("value_clip", "huber_delta", "target_kl"), choices={"agent_schedule": SCHEDULES},
                       widths=("critic_hidden",))
        self.dependency, self.critic_lr = dependency, critic_lr
        self.critic_hidden = list(critic_hidden)
        self.gamma, self.gae_lambda, self.clip, self.num_epochs = gamma, gae_lambda, clip, num_epochs
        self.minibatch_size, self.value_coef, self.value_clip = minibatch_size, value_coef, value_clip
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
        """The frozen base the critic reads: the first agent's (every agent's, in a homogeneous team).

        In a team of several bases the one head still reads one base, agent 0's, so that every decision point is
        valued in one feature space: MARFT-A re-encodes the other agents' observations from their text with this
        base's tokenizer and chat template (:meth:`MARFTA.observation_ids <collab.algos.marft_a.MARFTA.observation_ids>`);
        MARFT-T, whose values are read at each token of a response, refuses such a team."""
        return self.team.model_of(0)

    def param_groups(self):
        return super().param_groups() + [{"params": list(self.critic.parameters()), "lr": self.critic_lr, "name": "critic"}]

    def configure_optimizers(self):
        return torch.optim.AdamW(self.param_groups(), weight_decay=0.0, eps=self.optim_eps)

    # -- rollout and prepare -----------------------------------------------------------------------
    def rollout(self, tasks) -> Experience[Transition]:
        episodes, stats, examples = play_once(self.team, self.env, tasks, self.max_new_tokens, self.protocol)
        stats["reward/avg_step_reward"] = sum(ep.return_ / len(ep.steps) for ep in episodes) / len(episodes)
        return Experience(transitions(episodes), stats, examples, episodes)

    def prepare(self, experience: Experience[Transition]) -> Batch[Transition]:
        """Fix each transition's critic ``features``, old ``values``, ``advantages`` and ``returns`` (the
        variant's GAE, line 12) and return them with the agents this rollout trains (:meth:`scheduled`)."""
        raise NotImplementedError

    def scheduled(self, experience: Experience[Transition]) -> Batch[Transition]:
        """The prepared transitions with the agents this rollout trains: all, or one in turn (``round_robin``);
        none during the critic's warm-up."""
        n = len(self.team)
        if self.rollouts <= self.critic_warmup:
            agents = []
        else:
            agents = list(range(n)) if self.agent_schedule == "all" else [(self.rollouts - 1 - self.critic_warmup) % n]
        return Batch(experience.items, {"train/early_stop": 0.0, "train/actors_updated": float(len(agents))}, agents)

    def features(self, prompts, completions=None):
        """:func:`base_features` of rows already in the critic base's tokens (agent 0's tokenizer: its pad id)."""
        return base_features(self.critic_model, self.team.tokenizer_of(0).pad_token_id, prompts, completions)

    # -- update ------------------------------------------------------------------------------------
    def normalizers(self, minibatch: list[Transition], batch: Batch[Transition], index: int) -> Normalizers:
        """The global transition count and each transition's advantages of the trained agents (concatenated in
        agent order), normalized over the trained agents' decisions of all ranks' minibatches with
        ``normalize_advantages``."""
        count = global_count(self, len(minibatch))
        agents = batch.agents
        if not agents:
            return Normalizers(count, agents=agents)
        advantages = [self.advantages_of(tr, agents) for tr in minibatch]
        if self.normalize_advantages:
            advantages = normalize_pieces(self, advantages)
        return Normalizers(count, advantages=advantages, agents=agents)

    def loss(self, micro: list[Transition], scale: Normalizers) -> tuple[torch.Tensor, dict[str, float]]:
        """``value_coef * L_critic + L_actor - entropy_coef * H`` of the micro-batch, weighted by its share."""
        critic, stats = self.critic_loss(micro)
        loss = self.value_coef * critic
        if scale.agents:
            actor, entropy, actor_stats = self.actor_loss(micro, scale.agents, torch.cat(scale.advantages))
            stats.update(actor_stats)
            loss = loss + actor - self.entropy_coef * entropy
        return loss * (len(micro) / scale.count), stats

    summed_stats = ("train/tokens",)
    """Statistics that count (summed over the agents' terms), not average."""

    def terms(self, micro: list[Transition], scale: Normalizers, stats: dict[str, float], share: float) -> list:
        """The micro-batch's critic term, then each trained agent's actor term, as backward passes of their own: a
        transition holds every agent's response, and one agent's forward is then alive at a time (issue 33). The
        gradient of :meth:`loss`'s one pass: its actor loss and entropy are means over the agents' samples
        (MARFT-A: responses, MARFT-T: tokens), so agent i's term (and its statistics) is weighted by its share
        of them; each term is weighted by ``len(micro) / scale.count``."""
        agents = scale.agents or []
        pieces = [[] for _ in agents]  # agent k's advantages, transition by transition (scale's are concatenated)
        for tr, adv in zip(micro, scale.advantages or []):
            start = 0
            for k, j in enumerate(agents):
                n = len(self.agent_advantages(tr, j))
                pieces[k].append(adv[start:start + n])
                start += n
        samples = [sum(len(a) for a in piece) for piece in pieces]
        if agents and not sum(samples):  # no response token at all (MARFT-T): the one-pass loss's zero actor term
            return super().terms(micro, scale, stats, share)
        weight = len(micro) / scale.count

        def critic() -> torch.Tensor:
            loss, critic_stats = self.critic_loss(micro)
            return add_term(stats, share, self.value_coef * loss * weight, critic_stats)

        def actor(k: int) -> torch.Tensor:
            loss, entropy, actor_stats = self.actor_loss(micro, [agents[k]], torch.cat(pieces[k]))
            w = samples[k] / sum(samples)
            values = {key: value if key in self.summed_stats else w * value for key, value in actor_stats.items()}
            return add_term(stats, share, (loss - self.entropy_coef * entropy) * w * weight, values)

        return [critic] + [partial(actor, k) for k in range(len(agents)) if samples[k]]

    def accept(self, stats: dict[str, float], count: int, scale: Normalizers) -> bool:
        """``target_kl``'s early stop, decided on the approximate KL of all ranks' minibatches together (every
        rank refuses the same update, and the rollout's remaining ones)."""
        return (self.target_kl is None or not scale.agents
                or global_mean(self, stats.get("train/approx_kl", 0.0), count) <= self.target_kl)

    def agent_advantages(self, tr: Transition, agent: int) -> torch.Tensor:
        """Agent ``agent``'s advantages in ``tr``: one for its action (MARFT-T: one per token of its response)."""
        return tr.advantages[agent:agent + 1]

    def advantages_of(self, tr: Transition, agents: list[int]) -> torch.Tensor:
        """``agents``' advantages in ``tr``, concatenated in agent order (what ``actor_loss`` weighs them by)."""
        return torch.cat([self.agent_advantages(tr, i) for i in agents])

    def critic_loss(self, minibatch: list[Transition]) -> tuple[torch.Tensor, dict[str, float]]:
        device = self.critic.net[0].weight.device
        features = torch.cat([tr.features for tr in minibatch]).to(device)
        returns = torch.cat([tr.returns for tr in minibatch]).to(device)
        old_values = torch.cat([tr.values for tr in minibatch]).to(device)
        values = self.critic(features)
        clip = self.value_clip
        loss = value_loss(values, returns, old_values if clip else None, clip, self.huber_delta)
        return loss, {"train/critic_loss": float(loss.detach()), "train/value_mean": float(values.detach().mean()),
                      "train/return_mean": float(returns.mean()), "train/explained_variance": explained_variance(values, returns)}

    def actor_loss(self, minibatch: list[Transition], agents: list[int], advantages: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """The variant's clipped policy loss of ``agents``' responses, mean entropy and stats (``train/approx_kl``
        among them); ``advantages``: theirs, transition by transition, agent by agent, concatenated."""
        raise NotImplementedError

    def policy_forward(self, rows: list[tuple[Transition, int]]):
        """Teacher-forced per-token log-probs and entropies of each row's response (with gradients)."""
        completions = [tr.actions[i] for tr, i in rows]
        return self.team.logprobs([i for _, i in rows], [c.prompt_ids for c in completions],
                                  [c.completion_ids for c in completions], entropy=True)

    def on_save_checkpoint(self, checkpoint) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["collab"]["dependency"] = self.dependency

