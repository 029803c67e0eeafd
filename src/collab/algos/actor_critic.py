"""What CoLLM-CC/DC and IPPO share: one on-policy episode per task, its transitions, LLM critics.

Rollout (CoLLM, Algorithm 1, lines 3-15): every task of the step is played once (no tree), each
agent sampling one response per turn; every turn becomes a :class:`~collab.rollout.experience.Transition`
with its behaviour log-probs. Update (the skeleton of :mod:`collab.algos.base`): ``num_epochs`` passes
of minibatches over the transitions; each minibatch computes the algorithm's actor and critic losses
(means over its transitions) and takes one optimizer step that moves the actors (each agent's learning
rate) and the critics (``critic_lr``) together: the critic is updated once per minibatch, not once per agent.

The actor loss is the PPO-clipped form of equations 2 and 4 (rho clipped to [1 - eps, 1 + eps] with
eps = ``clip``), each agent's loss the mean over its samples, summed over agents (as MAGRPO).
"""

from __future__ import annotations

import torch

from collab.algos.base import CollabModule
from collab.algos.llm_critics import MODES, CriticSpec, Critics, check_critic_spec
from collab.errors import require_ranges
from collab.objectives import clipped_surrogate, ratio_stats
from collab.rollout.episodes import play_once
from collab.rollout.experience import Batch, Experience, Normalizers, Transition, transitions


class ActorCritic(CollabModule):
    forwards_per_token = 2  # the agents' log-probs and the LLM critic's values over the same tokens

    def __init__(self, *, critic: str, critic_spec: CriticSpec, critic_lr: float, gamma: float, clip: float,
                 num_epochs: int, minibatch_size: int | None, **kwargs) -> None:
        """
        Args:
            critic: centralized (one critic on the joint history, CoLLM-CC) | decentralized (one per agent).
            critic_spec: The critics' base, LoRA, kind (v | q), global information, parameter sharing.
            critic_lr: Learning rate of the critics' adapters and heads.
            gamma: Discount of the TD targets.
            clip: PPO clip range eps of the importance ratio (CoLLM Appendix C's "advantage clip": 0.2).
            num_epochs: Passes over the rollout's transitions (E).
            minibatch_size: Transitions per update; None: all of them.
        """
        super().__init__(**kwargs)
        require_ranges(locals(), unit=("gamma",), positive=("critic_lr", "clip"),
                       counts=("num_epochs", "minibatch_size"), choices={"critic": MODES})
        self.critic_mode, self.critic_spec, self.critic_lr = critic, critic_spec, critic_lr
        check_critic_spec(self.critic_spec)
        self.gamma, self.clip, self.num_epochs, self.minibatch_size = gamma, clip, num_epochs, minibatch_size
        self.critics: Critics | None = None

    def build_extra(self, env) -> None:
        self.critics = Critics(self.team, env, self.critic_mode, self.critic_spec).to(self.team.device)

    def param_groups(self):
        groups = super().param_groups()
        lr = self.critic_spec.lr or self.critic_lr
        return groups + [{"params": self.critics.parameters_of(j), "lr": lr, "name": f"critic{j}"}
                         for j in range(len(self.critics))]

    # -- rollout and prepare -----------------------------------------------------------------------
    def rollout(self, tasks) -> Experience[Transition]:
        episodes, stats, examples = play_once(self.team, self.env, tasks, self.max_new_tokens)
        return Experience(transitions(episodes), stats, examples, episodes)

    @torch.no_grad()
    def prepare(self, experience: Experience[Transition]) -> Batch[Transition]:
        """Every transition as it was played: the critics' TD errors are computed in each minibatch's loss (CoLLM)."""
        return Batch(experience.items)

    # -- loss --------------------------------------------------------------------------------------
    def loss(self, micro: list[Transition], scale: Normalizers) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's actor + critic losses (means over its transitions), weighted by its share of the
        minibatch of all ranks (``scale.count``: the global transition count)."""
        raise NotImplementedError

    def actor_loss(self, minibatch: list[Transition], advantages: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped policy-gradient loss; ``advantages[b, i]`` weighs agent i's response in transition b."""
        n = len(self.team)
        agents = [i for _ in minibatch for i in range(n)]
        completions = [c for tr in minibatch for c in tr.actions]
        token_logprobs = self.team.logprobs(agents, [c.prompt_ids for c in completions], [c.completion_ids for c in completions])
        logprobs = torch.stack([t.sum() for t in token_logprobs])
        old = torch.tensor([c.logprob for c in completions], dtype=logprobs.dtype, device=logprobs.device)
        adv = advantages.detach().reshape(-1).to(logprobs)
        per_sample = clipped_surrogate(logprobs, old, adv, self.clip).view(len(minibatch), n)
        return per_sample.mean(0).sum(), ratio_stats(logprobs, old, self.clip)

    def rewards_of(self, minibatch: list[Transition]) -> torch.Tensor:
        """``[B, n_critics]``: each critic's reward; a centralized critic learns the team's mean reward. An
        early end's reward repeats for the turns it skipped (:meth:`Transition.returned_rewards`)."""
        r = torch.tensor([tr.returned_rewards(self.gamma) for tr in minibatch], dtype=torch.float32, device=self.team.device)
        return r.mean(-1, keepdim=True) if self.critic_mode == "centralized" else r

    def on_save_checkpoint(self, checkpoint) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["collab"]["critic"] = self.critic_mode

    @staticmethod
    def dones(minibatch: list[Transition], device) -> torch.Tensor:
        return torch.tensor([float(tr.done) for tr in minibatch], device=device)[:, None]
