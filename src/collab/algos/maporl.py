"""MAPoRL: multi-agent post-co-training of a collaborative debate with multi-agent PPO (MAPoRL, Section 3).

Rollout. Each task is debated once (the ``debate`` environment: A agents, T turns; at turn t+1 agent a
reads q and every earlier answer of every agent). The verifier scores every answer; the reward of agent
a's answer at turn t (:func:`collab.objectives.debate_rewards`, the expectation estimated by the one
sampled debate) is

    R(q, s_ta) = Definition 1 (its own score now plus the discounted mean score of all agents at later
                 turns, over the sum of discounts: ``objectives.influence_rewards``)
               + Table 1 incentive on s_ta   (own revision from t-1 to t relative to the others' majority)
               + Table 2 incentive on s_ta   (the others' majority moving from t to t+1)

Prepare. Per-token rewards (Section 3.2) r(q, s_ta^{1:x}) = 1(x = |s_ta|) R(q, s_ta) - lambda_KL KL_x
(:func:`collab.objectives.token_rewards`, which says which KL estimate and why). Each team member has a
value head V(i^x_ta; theta_vta) on its frozen base (:class:`ValueHeads`), computed once per rollout.
GAE (``token_gamma``, ``gae_lambda``) runs over each response's tokens, terminal at its last token: R
already holds the future turns, so one (turn, agent) response is one PPO episode, as the paper's V_ta.

Loss. One optimizer step per minibatch of responses (the skeleton of :mod:`collab.algos.base`) on
L = L_surrogate(theta_ta) + value_head.coef * L_value(theta_vta) - entropy_coef * H: the token-level clipped
surrogate and the squared error against V_target = V_old + A, means over the minibatch's tokens.

An early stop on consensus (``stop_on_consensus``) is an absorbing state (:func:`~collab.objectives.episode_rewards`
says how the reference code differs); ``format_penalty``, the reference code's: :func:`answer_rewards`.

Team. One adapter per agent, shared by its turns (theta_a), or with ``per_turn`` one per (turn, agent), the paper's
theta_ta: role a at turn t is member t*A + a. Each member's value head is an MLP
(:class:`~collab.policy.mlp_head.CriticHead`) on its frozen base's last hidden state (adapters off) at every
position that chooses a response token (in a team of several bases, on the member's own base, in its own
tokens: :func:`~collab.policy.mlp_head.team_features`). The per-turn members of the turns before
``train_from_turn`` keep their initial adapters and heads.

Where the paper is silent: ``ppo.gamma`` (Definition 1) defaults to 0.5; the incentives default to 0 (pure
Definition 1); the value heads read the frozen base rather than a LoRA-shared trunk (cheaper, and the
value loss never moves the policy); advantages are normalized over each minibatch by default.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn

from collab.algos.agents import resolve_agents
from collab.algos.base import CollabModule, Term
from collab.algos.groups import PPOOptions, ValueHeadOptions
from collab.envs.debate.penalties import penalise
from collab.errors import UserError, require_ranges
from collab.objectives import (
    clipped_surrogate,
    episode_rewards,
    explained_variance,
    gae,
    ratio_stats,
    token_rewards,
    value_loss,
)
from collab.policy.mlp_head import CriticHead, team_features
from collab.policy.sampling import own_rows
from collab.policy.team import AgentSpec
from collab.rollout.episodes import Episode, play_once
from collab.rollout.experience import Batch, Decision, Experience, Normalizers, decisions, turn_means
from collab.runtime.collectives import global_count, normalize_pieces


class MAPoRL(CollabModule):
    """The options and their meaning: ``conf/algo/maporl.yaml`` (``ppo.gamma``: Definition 1's discount between
    turns; ``token_gamma``: GAE's between the tokens of a response)."""

    passes_per_model = False  # one term: every member's answers in one forward (a pass may use every model)

    def __init__(
        self,
        *,
        ppo: PPOOptions,
        alpha0: float,
        alpha1: float,
        beta0: float,
        beta1: float,
        kl_coef: float,
        token_gamma: float,
        gae_lambda: float,
        value_head: ValueHeadOptions,
        entropy_coef: float,
        per_turn: bool,
        train_from_turn: int,
        normalize_advantages: bool,
        format_penalty: float | None,
        min_response_tokens: int,
        max_repeats: int | None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        ppo.check()
        value_head.check()
        require_ranges(
            locals(),
            unit=("token_gamma", "gae_lambda"),
            non_negative=("alpha0", "alpha1", "beta0", "beta1", "kl_coef", "min_response_tokens"),
            counts=("train_from_turn", "max_repeats"),
        )
        self.format_penalty, self.min_response_tokens = format_penalty, min_response_tokens
        self.max_repeats = max_repeats
        self.ppo, self.incentives = ppo, dict(alpha0=alpha0, alpha1=alpha1, beta0=beta0, beta1=beta1)
        self.kl_coef, self.token_gamma, self.gae_lambda = kl_coef, token_gamma, gae_lambda
        self.value_head, self.entropy_coef = value_head, entropy_coef
        self.per_turn, self.train_from_turn, self.normalize_advantages = per_turn, train_from_turn, normalize_advantages
        self.value_heads: ValueHeads | None = None

    # -- the team: its members theta_ta and their value heads theta_vta ----------------------------
    def team_specs(self, env) -> list[AgentSpec]:
        specs = resolve_agents(env, self.agent_specs, self.agent_defaults)
        return [copy.deepcopy(spec) for _ in range(env.horizon) for spec in specs] if self.per_turn else specs

    def build_extra(self, env) -> None:
        if not hasattr(env, "grade_answers"):
            raise UserError(f"MAPoRL trains a debate; env {env.name!r} is not one (use --data.env debate)")
        if self.per_turn:
            self.team.turn_agents = [[t * env.n_agents + a for a in range(env.n_agents)] for t in range(env.horizon)]
        heads = [
            CriticHead(self.team.model_of(m).config.hidden_size, self.value_head.hidden) for m in range(len(self.team))
        ]
        self.value_heads = ValueHeads(heads).to(self.team.device)
        frozen = self.untrained_members(env)  # no gradient to synchronise under DDP, nothing in the optimizer
        self.team.freeze(frozen)
        for m in frozen:
            self.value_heads[m].requires_grad_(False)

    def untrained_members(self, env) -> list[int]:
        """The per-turn members of the turns before ``train_from_turn`` (theta_ta of the untrained turns: Experiment 1's
        turn-1 debaters), acting with their initial adapter (LoRA B = 0: the base policy), frozen at build. Shared
        adapters (``per_turn`` false) are trained at the later turns: none is frozen."""
        if not self.per_turn:
            return []
        return [
            t * env.n_agents + a for t in range(min(self.train_from_turn - 1, env.horizon)) for a in range(env.n_agents)
        ]

    def param_groups(self):
        heads = [p for p in self.value_heads.parameters() if p.requires_grad]  # the frozen members' heads left out
        return super().param_groups() + [{"params": heads, "lr": self.value_head.lr, "name": "value_heads"}]

    # -- rollout and prepare -----------------------------------------------------------------------
    def rollout(self, tasks) -> Experience[Decision]:
        episodes, stats, examples = play_once(self.team, self.env, tasks, self.max_new_tokens, example_turn=-1)
        answers, rewards, malformed = self.responses(episodes)
        stats.update(turn_means("reward/maporl", [r[: len(ep.completions)] for r, ep in zip(rewards, episodes)]))
        if self.format_penalty is not None:
            stats["train/malformed"] = malformed
        return Experience(answers, stats, examples, episodes)

    def responses(self, episodes: list[Episode]) -> tuple[list[Decision], list[Tensor], float]:
        """Every trained answer with its reward R(q, s_ta), each episode's ``[T, A]`` rewards (rows past an early stop:
        absorbing turns, not answers: no reward logged), and the share of malformed answers (0 without
        ``format_penalty``): :func:`answer_rewards`."""
        decode = lambda t, a, ids: self.team.tokenizer_of(self.team.acting(t, a)).decode(ids)  # noqa: E731
        penalty = self.format_penalty, self.min_response_tokens, self.max_repeats
        rewards, malformed = answer_rewards(episodes, decode, self.ppo.gamma, self.incentives, *penalty)
        return decisions(episodes, rewards, self.team.acting, self.train_from_turn - 1), rewards, malformed

    @torch.no_grad()
    def prepare(self, experience: Experience[Decision]) -> Batch[Decision]:
        """Fix the per-token rewards, features, values V_old, advantages and returns of every answer."""
        answers = experience.items
        if not answers:
            return Batch(answers)
        members = [r.member for r in answers]
        prompts, completions = [r.prompt_ids for r in answers], [r.completion_ids for r in answers]
        own = [r.own for r in answers]
        ref = self.team.logprobs(members, prompts, completions, reference=True, own=own)
        features = own_rows(team_features(self.team, members, prompts, completions), own)
        kls = []
        for r, ref_lp, features in zip(answers, ref, features):
            ref_lp = ref_lp.float().cpu()
            r.features, r.values = features, self.value_heads[r.member](features.to(self.team.device)).float().cpu()
            rewards = token_rewards(r.reward, r.old_logprobs, ref_lp, self.kl_coef)
            dones = (torch.arange(len(rewards)) == len(rewards) - 1).to(rewards)  # terminal at the last token
            r.advantages, r.returns = gae(rewards, r.values, dones, self.token_gamma, self.gae_lambda)
            kls.append(r.old_logprobs - ref_lp)
        kl, kl_sum = torch.cat(kls).mean(), torch.stack([k.sum() for k in kls]).mean()  # per token, per answer
        return Batch(answers, {"train/kl_ref": float(kl), "train/kl_ref_sum": float(kl_sum)})

    # -- loss --------------------------------------------------------------------------------------
    def normalizers(self, minibatch: list[Decision], batch: Batch[Decision], index: int) -> Normalizers:
        """The number of answer tokens in the minibatch of all ranks (the loss is a token mean) and each answer's
        advantages, normalized over those tokens when ``normalize_advantages``."""
        advantages = [r.advantages for r in minibatch]
        advantages = normalize_pieces(self, advantages) if self.normalize_advantages else advantages
        return Normalizers(global_count(self, sum(len(a) for a in advantages)), advantages=advantages)

    def terms(self, micro: list[Decision], scale: Normalizers) -> list[Term]:
        """One term: an answer is one member's response, and one forward computes every answer's."""
        return [partial(self.ppo_loss, micro, torch.cat(scale.advantages), scale.count)]

    def ppo_loss(self, micro: list[Decision], advantages: Tensor, count: float) -> tuple[Tensor, dict[str, float]]:
        """The micro-batch's part of Section 3.2's L (the module docstring); ``advantages``: its tokens',
        concatenated."""
        logprobs, entropies = self.team.logprobs(
            [r.member for r in micro],
            [r.prompt_ids for r in micro],
            [r.completion_ids for r in micro],
            entropy=True,
            own=[r.own for r in micro],
        )
        logprobs = torch.cat(logprobs)
        old_logprobs = torch.cat([r.old_logprobs for r in micro]).to(logprobs)
        actor = clipped_surrogate(logprobs, old_logprobs, advantages.to(logprobs), self.ppo.clip).mean()
        entropy = torch.cat(entropies).mean()
        critic, critic_stats = self.value_heads.loss(micro)
        stats = {
            "train/actor_loss": float(actor.detach()),
            "train/entropy": float(entropy.detach()),
            **ratio_stats(logprobs, old_logprobs, self.ppo.clip),
            **critic_stats,
        }
        return (advantages.numel() / count) * (
            actor + self.value_head.coef * critic - self.entropy_coef * entropy
        ), stats


class ValueHeads(nn.ModuleList):
    """One value head V(i^x_ta; theta_vta) per team member, on the member's frozen base's features."""

    def loss(self, micro: list[Decision]) -> tuple[Tensor, dict[str, float]]:
        """L_value: the squared error of the answers' token values against V_target = V_old + A (their mean over the
        micro-batch's tokens), and its statistics."""
        device = next(self.parameters()).device
        values = torch.cat([self[r.member](r.features.to(device)) for r in micro])
        returns = torch.cat([r.returns for r in micro]).to(values)
        loss = value_loss(values, returns)
        return loss, {
            "train/value_loss": float(loss.detach()),
            "train/value_mean": float(values.detach().mean()),
            "train/return_mean": float(returns.mean()),
            "train/explained_variance": explained_variance(values, returns),
        }


def answer_rewards(
    episodes: list[Episode],
    decode: Callable[[int, int, list[int]], str],
    gamma: float,
    incentives: dict[str, float],
    format_penalty: float | None,
    min_response_tokens: int,
    max_repeats: int | None,
) -> tuple[list[Tensor], float]:
    """Each episode's ``[T, A]`` rewards R(q, s_ta) (rows past an early stop: absorbing turns, not answers) and the
    share of malformed answers (0 without ``format_penalty``). ``decode(t, a, ids)``: the text of tokens of the
    agent acting as role a at turn t (the repetition check exempts runs that decode to digits).

    The verifier's score of each answer, replaced by ``format_penalty`` where the answer is malformed (the
    reference code's rule: :mod:`collab.envs.debate.penalties`), then Definition 1 on the penalised scores plus
    the incentives of Tables 1 and 2 (:func:`collab.objectives.episode_rewards`), the expectation estimated by
    the one sampled debate. Penalising before Definition 1 also lowers the earlier answers' influence terms, as
    in the reference code."""
    all_rewards, flagged = [], []
    for ep in episodes:
        memory = ep.state.memory
        scores = torch.tensor(memory["scores"], dtype=torch.float32)
        if format_penalty is not None:
            scores, flags = penalise(
                scores, memory["answers"], ep.completions, format_penalty, min_response_tokens, max_repeats, decode
            )
            flagged.append(flags.flatten())
        all_rewards.append(
            episode_rewards(scores, memory["answers"], memory["correct"], ep.steps[-1].turns_left, gamma, **incentives)
        )
    malformed = float(torch.cat(flagged).float().mean()) if flagged else 0.0
    return all_rewards, malformed
