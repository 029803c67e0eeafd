"""What CoLLM-CC/DC and IPPO share: one on-policy episode per task, its transitions, LLM critics.

Rollout (CoLLM, Algorithm 1, lines 3-15): every task of the step is played once (no tree), each
agent sampling one response per turn; every turn becomes a :class:`~collab.rollout.experience.Transition`
with its behaviour log-probs. Update (the skeleton of :mod:`collab.algos.base`): ``ppo.num_epochs`` passes
of minibatches over the transitions; each minibatch computes the algorithm's actor and critic losses
(means over its transitions) and takes one optimizer step that moves the actors (each agent's learning
rate) and the critics (``critic_lr``) together: the critic is updated once per minibatch, not once per agent.

The actor loss is the PPO-clipped form of equations 2 and 4 (rho clipped to [1 - eps, 1 + eps] with
eps = ``ppo.clip``), each agent's loss the mean over its samples, summed over agents (as MAGRPO).

A micro-batch's loss is a list of terms, each a backward pass of its own (:meth:`ActorCritic.terms`): critic j's
(its values, the TD targets or GAE returns it is fitted to, and the advantages of the agents it advises), then
the actor terms of the agents it advises. The gradient is that of their sum, with one LLM forward's activations
alive at a time instead of every agent's and the critic's together: what bounds a step's memory when one
transition is already larger than the micro-batch budget (CoLLM-CC's default transition holds two agents'
responses and a 384-token critic input).
"""

from __future__ import annotations

from functools import partial

import torch

from collab.algos.base import CollabModule, Term
from collab.algos.groups import PPOOptions
from collab.algos.llm_critics import MODES, Critics, CriticSpec, check_critic_spec
from collab.errors import require_ranges
from collab.objectives import clipped_surrogate, ratio_stats
from collab.rollout.episodes import play_once
from collab.rollout.experience import Batch, Experience, Normalizers, Transition, transitions


class ActorCritic(CollabModule):
    """The options and their meaning: ``conf/algo/collm_cc.yaml``, ``collm_dc.yaml``, ``ippo.yaml``."""

    def __init__(self, *, critic: str, critic_spec: CriticSpec, critic_lr: float, ppo: PPOOptions, **kwargs) -> None:
        super().__init__(**kwargs)
        ppo.check()
        require_ranges(locals(), positive=("critic_lr",), choices={"critic": MODES})
        self.critic_mode, self.critic_spec, self.critic_lr = critic, critic_spec, critic_lr
        check_critic_spec(self.critic_spec)
        self.ppo = ppo
        self.critics: Critics | None = None

    def build_extra(self, env) -> None:
        self.critics = Critics(self.team, env, self.critic_mode, self.critic_spec).to(self.team.device)

    def param_groups(self):
        groups = super().param_groups()
        lr = self.critic_spec.lr or self.critic_lr
        return groups + [
            {"params": self.critics.parameters_of(j), "lr": lr, "name": f"critic{j}"} for j in range(len(self.critics))
        ]

    # -- rollout and prepare -----------------------------------------------------------------------
    def rollout(self, tasks) -> Experience[Transition]:
        episodes, stats, examples = play_once(self.team, self.env, tasks, self.max_new_tokens)
        return Experience(transitions(episodes), stats, examples, episodes)

    @torch.no_grad()
    def prepare(self, experience: Experience[Transition]) -> Batch[Transition]:
        """Every transition as it was played: the critics' TD errors are computed in each minibatch's loss (CoLLM)."""
        return Batch(experience.items)

    # -- loss --------------------------------------------------------------------------------------
    def advised(self, j: int) -> list[int]:
        """The agents whose actors critic ``j`` weighs: every agent (a centralized critic) or agent j."""
        return list(range(len(self.team))) if self.critic_mode == "centralized" else [j]

    def terms(self, micro: list[Transition], scale: Normalizers) -> list[Term]:
        """The micro-batch's loss: the critics' value losses (their mean) plus the agents' clipped policy losses
        (their sum), means over its transitions weighted by its share of the minibatch of all ranks
        (``len(micro) / scale.count``), as critic j's term, then the actor terms of the agents it advises, each
        weighted by the advantages critic j's term computed. Statistics: the critics' and the agents' means;
        ``train/critic_loss`` and ``train/actor_loss``, their losses' sums."""
        weight, n_critics, n_agents = len(micro) / scale.count, len(self.critics), len(self.team)
        advantages: dict[int, torch.Tensor] = {}  # critic j's, [B, len(advised(j))], for the actor terms after it

        def critic(j: int) -> tuple[torch.Tensor, dict[str, float]]:
            loss, advantages[j], stats = self.critic_loss(micro, scale, j)
            values = {key: value / n_critics for key, value in stats.items()}
            return loss * weight, {**values, "train/critic_loss": float(loss.detach())}

        def actor(j: int, k: int, agent: int) -> tuple[torch.Tensor, dict[str, float]]:
            loss, stats = self.actor_loss(micro, agent, advantages[j][:, k])
            values = {key: value / n_agents for key, value in stats.items()}
            return loss * weight, {**values, "train/actor_loss": float(loss.detach())}

        return [
            term
            for j in range(n_critics)
            for term in [partial(critic, j), *(partial(actor, j, k, i) for k, i in enumerate(self.advised(j)))]
        ]

    def critic_loss(
        self, micro: list[Transition], scale: Normalizers, j: int
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """Critic ``j``'s loss on the micro-batch (its share of the mean over critics: divided by their number),
        the advantages ``[B, len(advised(j))]`` its agents' actors are weighted by (no gradient), and its
        statistics (means over the micro-batch; the loss's own value is logged by :meth:`terms`)."""
        raise NotImplementedError

    def actor_loss(
        self, micro: list[Transition], agent: int, advantages: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Agent ``agent``'s clipped policy-gradient loss (CoLLM Eqs. 2 and 4, the PPO clip), the mean over the
        micro-batch's transitions, each response weighted by ``advantages[b]``."""
        completions = [tr.actions[agent] for tr in micro]
        token_logprobs = self.team.logprobs(
            [agent] * len(micro),
            [c.prompt_ids for c in completions],
            [c.completion_ids for c in completions],
            own=[c.own for c in completions],
        )
        logprobs = torch.stack([t.sum() for t in token_logprobs])
        old_logprobs = torch.tensor([c.logprob for c in completions], dtype=logprobs.dtype, device=logprobs.device)
        per_sample = clipped_surrogate(
            logprobs, old_logprobs, advantages.detach().reshape(-1).to(logprobs), self.ppo.clip
        )
        return per_sample.mean(), ratio_stats(logprobs, old_logprobs, self.ppo.clip)

    def rewards_of(self, minibatch: list[Transition]) -> torch.Tensor:
        """``[B, n_critics]``: each critic's reward; a centralized critic learns the team's mean reward. An
        early end's reward repeats for the turns it skipped (:meth:`Transition.returned_rewards`)."""
        r = torch.tensor(
            [tr.returned_rewards(self.ppo.gamma) for tr in minibatch], dtype=torch.float32, device=self.team.device
        )
        return r.mean(-1, keepdim=True) if self.critic_mode == "centralized" else r

    def on_save_checkpoint(self, checkpoint) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["collab"]["critic"] = self.critic_mode

    @staticmethod
    def dones(minibatch: list[Transition], device) -> torch.Tensor:
        return torch.tensor([float(tr.done) for tr in minibatch], device=device)[:, None]
