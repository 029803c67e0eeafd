"""What CoLLM-CC/DC and IPPO share: one on-policy episode per task, a replay buffer, LLM critics.

Rollout (paper 002, Algorithm 1, lines 3-15): every task of the step is played once (no tree), each
agent sampling one response per turn; every turn becomes a :class:`~collab.rollout.buffer.Transition`
with its behaviour log-probs. Update: ``num_epochs`` passes of minibatches over the buffer; each
minibatch computes the algorithm's actor and critic losses and takes one optimizer step that moves
the actors (each agent's learning rate) and the critics (``critic_lr``) together: the critic is
updated once per minibatch, not once per agent.

The actor loss is the PPO-clipped form of equations 2 and 4 (rho clipped to [1 - eps, 1 + eps] with
eps = ``advantage_clip``), each agent's loss the mean over its samples, summed over agents (as MAGRPO).
"""

from __future__ import annotations

import time

import torch

from collab.algos.base import CollabModule
from collab.llm_critics import MODES, CriticSpec, Critics, check_critic_spec
from collab.distributed import minibatch_schedule, optimizer_step
from collab.errors import require
from collab.objectives import clipped_surrogate, ratio_stats
from collab.rollout.buffer import ReplayBuffer, Transition, transitions
from collab.rollout.episodes import episode_stats, play
from collab.rollout.trajectory import RolloutBatch


class ActorCritic(CollabModule):
    def __init__(self, *args, critic: str = "centralized", critic_spec: CriticSpec | None = None,
                 critic_lr: float = 1e-4, gamma: float = 1.0, advantage_clip: float = 0.2, num_epochs: int = 4,
                 minibatch_size: int | None = None, **kwargs) -> None:
        """
        Args:
            critic: centralized (one critic on the joint history, CoLLM-CC) | decentralized (one per agent).
            critic_spec: The critics' base, LoRA, kind (v | q), global information, parameter sharing.
            critic_lr: Learning rate of the critics' adapters and heads.
            gamma: Discount of the TD targets.
            advantage_clip: PPO clip range eps of the importance ratio (paper 002 Appendix C: 0.2).
            num_epochs: Passes over the replay buffer per rollout (E).
            minibatch_size: Transitions per update; None: the whole buffer.
        """
        super().__init__(*args, **kwargs)
        require(critic in MODES, f"unknown model.critic {critic!r}; valid: {', '.join(MODES)}")
        require(critic_lr > 0, f"model.critic_lr must be > 0, got {critic_lr}")
        require(0 <= gamma <= 1, f"model.gamma must be in [0, 1], got {gamma}")
        require(advantage_clip > 0, f"model.advantage_clip must be > 0, got {advantage_clip}")
        require(num_epochs >= 1, f"model.num_epochs must be >= 1, got {num_epochs}")
        require(minibatch_size is None or minibatch_size >= 1, f"model.minibatch_size must be >= 1, got {minibatch_size}")
        self.critic_mode, self.critic_spec, self.critic_lr = critic, critic_spec or CriticSpec(), critic_lr
        check_critic_spec(self.critic_spec)
        self.gamma, self.advantage_clip, self.num_epochs, self.minibatch_size = gamma, advantage_clip, num_epochs, minibatch_size
        self.critics: Critics | None = None

    def build_extra(self, env) -> None:
        self.critics = Critics(self.team, env, self.critic_mode, self.critic_spec).to(self.team.device)

    def param_groups(self):
        groups = super().param_groups()
        lr = self.critic_spec.lr or self.critic_lr
        return groups + [{"params": self.critics.parameters_of(j), "lr": lr, "name": f"critic{j}"}
                         for j in range(len(self.critics))]

    # -- rollout -----------------------------------------------------------------------------------
    def rollout(self, env, tasks) -> RolloutBatch:
        start = time.perf_counter()
        episodes = [eps[0] for eps in play(self.team, env, tasks, 1, self.max_new_tokens)]
        stats = episode_stats(episodes, time.perf_counter() - start)
        items = transitions(episodes)
        self.prepare(items)
        examples = [{"prompts": [h[-1]["content"] for h in ep.start.histories], "responses": ep.responses[0],
                     "reward": list(ep.steps[0].rewards)} for ep in episodes[:1]]
        return RolloutBatch([], stats, examples, buffer=ReplayBuffer(items))

    def prepare(self, items: list[Transition]) -> None:
        """Hook: values fixed at rollout time (IPPO's GAE advantages)."""

    # -- update ------------------------------------------------------------------------------------
    def update(self, batch: RolloutBatch) -> dict[str, float]:
        buffer: ReplayBuffer = batch.buffer
        generator = torch.Generator().manual_seed(self.rollouts)
        totals: dict[str, list[float]] = {}
        minibatches = list(buffer.epochs(self.num_epochs, self.minibatch_size, generator))
        for minibatch, share in minibatch_schedule(self, minibatches):
            if not minibatch:  # another rank has more minibatches: a step with no data here
                self.empty_minibatch()
                optimizer_step(self, [])
                continue
            loss, stats = self.losses(minibatch)
            optimizer_step(self, [lambda: loss * share if share != 1.0 else loss])
            for key, value in stats.items():
                totals.setdefault(key, []).append(value)
        buffer.clear()
        return {key: sum(v) / len(v) for key, v in totals.items()}

    def losses(self, minibatch: list[Transition]) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def empty_minibatch(self) -> None:
        """Hook: the collectives :meth:`losses` runs, for a rank whose minibatch is empty (IPPO's normalisation)."""

    def actor_loss(self, minibatch: list[Transition], advantages: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped policy-gradient loss; ``advantages[b, i]`` weighs agent i's response in transition b."""
        n = len(self.team)
        agents = [i for _ in minibatch for i in range(n)]
        completions = [c for tr in minibatch for c in tr.actions]
        token_logprobs = self.team.logprobs(agents, [c.prompt_ids for c in completions], [c.completion_ids for c in completions])
        logprobs = torch.stack([t.sum() for t in token_logprobs])
        old = torch.tensor([c.logprob for c in completions], dtype=logprobs.dtype, device=logprobs.device)
        adv = advantages.detach().reshape(-1).to(logprobs)
        per_sample = clipped_surrogate(logprobs, old, adv, self.advantage_clip).view(len(minibatch), n)
        return per_sample.mean(0).sum(), ratio_stats(logprobs, old, self.advantage_clip)

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
