"""MAPoRL: multi-agent post-co-training of a collaborative debate with multi-agent PPO (paper 003, Section 3).

Rollout. Each task of the step is debated once (the ``debate`` environment: A agents, T turns; at turn
t+1 agent a reads q and every answer s_{t'j}, t' <= t, of every agent). The verifier scores every
answer; the reward of agent a's answer at turn t is

    R(q, s_ta) = Definition 1 (``objectives.influence_rewards``: its own score now plus the discounted
                 mean score of all agents at later turns, over the sum of discounts)
               + Table 1 incentive on s_ta   (own revision from t-1 to t relative to the others' majority)
               + Table 2 incentive on s_ta   (the others' majority moving from t to t+1)

(:func:`collab.objectives.debate_rewards`). The expectation of Definition 1 is estimated by the one sampled debate.

Per-token rewards (Section 3.2, the r_theta under the value V_ta):

    r(q, s_ta^{1:x}) = 1(x = |s_ta|) R(q, s_ta) - lambda_KL KL_x

with KL_x the sample estimate log pi_old(token x) - log pi_ref(token x) of the agent's policy against
its reference (the base with adapters disabled) (:func:`collab.objectives.token_rewards`). The paper writes the KL term
as KL(pi_ref || pi); the per-token sample estimate of KL(pi || pi_ref) used here is the usual choice
of PPO fine-tuning (InstructGPT, TRL) and needs no full-vocabulary sums; it is the one quantity the
rollout's own samples estimate without bias.

Values and advantages. Each team member has a value head V(i^x_ta; theta_vta): an MLP
(:class:`~collab.mlp_head.CriticHead`) on the last hidden state of its frozen base (adapters off)
at every position that chooses a response token, so every token has the value of the state it was
chosen in. Since the base is frozen these features are computed once per rollout and the heads
train on cached tensors. GAE (``objectives.gae``, discount ``gae_gamma``, ``gae_lambda``) runs over
each response's tokens, terminal at its last token: R already holds the future turns (Definition 1),
so one (turn, agent) response is one PPO episode, as in the paper's per-(t, a) value V_ta.

Update. ``num_epochs`` passes of minibatches of responses; each takes one optimizer step on

    L = L_surrogate(theta_ta) + value_coef * L_value(theta_vta) - entropy_coef * H

with the token-level clipped surrogate (the ratio R^x_ta of each token) and the squared error against
V_target = V_old + A (GAE returns).

Parameters. ``per_turn: false`` (default): one LoRA adapter per agent a, shared by its turns
(theta_a). ``per_turn: true``: one adapter and one value head per (turn, agent), the paper's theta_ta
(``AgentTeam.turn_agents`` routes role a at turn t to member t*A + a). ``train_from_turn: 2`` trains
only the answers of turns t >= 2, as in the paper's Experiment 1 (earlier turns still act, with
their untrained or frozen policy).

Early stop on consensus (the debate env's ``stop_on_consensus``). A debate that ends at turn t < T is
an absorbing state: the agents keep their agreed answer. Before Definition 1 the episode's [t, A]
score, correctness and answer tables are extended to T turns by repeating the last played turn
(:func:`collab.objectives.absorb`, :func:`collab.objectives.episode_rewards`, with ``StepResult.turns_left`` = T - t); only the played
turns' answers are trained. So a debate that reaches the right consensus earlier never gives an
answer a lower reward than one that reaches it later (its later turns score the maximum). The reference
code instead cuts Definition 1's sums at the stopping turn (``score_rule`` in its
``trl/trl/trainer/utils_multi_unified.py``), which can reward a wrong turn-1 answer more when the
right consensus comes later (A = 3, T = 3, gamma 1, two of three agents right at turn 2: 5/9 after a
turn-3 consensus, 1/2 after a turn-2 one; extended, 5/9 and 2/3).

Format penalty (``format_penalty``; off by default: paper 003 does not mention one). The reference
code replaces the verifier score of a malformed answer by ``penalty_reward_value`` (-10 in its
configs) before its Definition 1 (``ppov2_trainer_multi_different_model.py``, under
``non_eos_penalty``): an answer is malformed when it is shorter than ``min_length`` tokens (its
configs' ``min_output_length``: 50), holds a run of 1-20 tokens repeated back to back more than 3
times (``check_repeated_sequences``; runs that decode to digits are exempt), or, at every trained
turn, has no ``\boxed{}`` answer (after its own reformatting, which boxes any answer it can parse,
that is: the answer is unparsable). collab applies the same rule (:func:`collab.envs.debate.penalties.malformed`) with
``min_response_tokens`` (default 0) and ``max_repeats`` (default None: no repetition check) to every
answer, then Definition 1 on the penalised scores, so the penalty also lowers earlier answers'
influence terms, as in the reference.

Where the paper is silent: gamma (Definition 1) defaults to 0.5; the incentives default to 0 (pure
Definition 1); the value heads read the frozen base rather than a LoRA-shared trunk (cheaper, and the
value loss never moves the policy); advantages are normalized over each minibatch by default.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from collab.algos.base import CollabModule, resolve_agents
from collab.distributed import global_normalize, global_sum, minibatch_schedule, optimizer_step, world_size
from collab.envs.debate.penalties import malformed
from collab.errors import UserError, require
from collab.mlp_head import HIDDEN, CriticHead, base_features
from collab.objectives import (clipped_surrogate, episode_rewards, explained_variance, gae, ratio_stats, token_rewards,
                               value_loss)
from collab.policy.team import AgentSpec
from collab.rollout.buffer import ReplayBuffer
from collab.rollout.episodes import Episode, episode_stats, play
from collab.rollout.trajectory import RolloutBatch


# --- the rewards, as pure functions -----------------------------------------------------------------------------------

# --- the module -------------------------------------------------------------------------------------------------------

@dataclass
class Response:
    """One (episode, turn, agent) answer: the unit of MAPoRL's PPO (one token-level episode)."""

    member: int
    """The team member that produced it (agent a, or (t, a) with per-turn parameters)."""
    turn: int
    role: int
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: Tensor
    reward: float
    extras: dict = field(default_factory=dict)


class MAPoRL(CollabModule):
    def __init__(self, *args, gamma: float = 0.5, alpha0: float = 0.0, alpha1: float = 0.0, beta0: float = 0.0,
                 beta1: float = 0.0, kl_coef: float = 0.05, gae_gamma: float = 1.0, gae_lambda: float = 0.95,
                 clip: float = 0.2, num_epochs: int = 1, minibatch_size: int | None = None,
                 micro_batch_size: int | None = 4, value_coef: float = 0.5,
                 value_lr: float = 1e-3, value_hidden: list[int] | None = None, entropy_coef: float = 0.0,
                 per_turn: bool = False, train_from_turn: int = 1, normalize_advantages: bool = True,
                 format_penalty: float | None = None, min_response_tokens: int = 0, max_repeats: int | None = None,
                 **kwargs) -> None:
        """
        Args:
            gamma: Discount of Definition 1 over later turns' verifier scores.
            alpha0: Table 1: reward for W -> R against a wrong majority (critical reasoning); penalty for R -> W with it.
            alpha1: Table 1: reward for W -> R with a right majority (being persuaded); penalty for R -> W against it.
            beta0: Table 2: for a wrong answer at t after which the others' majority turns right (penalty if it turns wrong).
            beta1: Table 2: for a right answer at t after which the others' majority turns right (penalty if it turns wrong).
            kl_coef: lambda_KL, the per-token KL penalty to the reference policy (adapters disabled).
            gae_gamma: Discount between the tokens of a response in GAE.
            gae_lambda: GAE lambda.
            clip: PPO clip range eps.
            num_epochs: PPO epochs over each rollout's responses.
            minibatch_size: Responses per update; None: all of the rollout's.
            micro_batch_size: Responses per forward/backward within an update (gradient accumulation: same
                update, activations of this many responses at a time); None: the whole minibatch at once.
            value_coef: lambda_value, the weight of the value loss.
            value_lr: Learning rate of the value heads.
            value_hidden: Hidden widths of each value head (default [1024, 512]).
            entropy_coef: Weight of an entropy bonus (0: the paper's loss).
            per_turn: One adapter and value head per (turn, agent) (theta_ta) instead of per agent.
            train_from_turn: Train the answers of turns >= this (1-based; 2 = the paper's Experiment 1).
            normalize_advantages: Normalize advantages over each minibatch's tokens.
            format_penalty: The verifier score given instead to a malformed answer (:func:`collab.envs.debate.penalties.malformed`) before
                Definition 1; the reference code's value is -10. None (default; the paper has none): no penalty.
            min_response_tokens: With ``format_penalty``: answers shorter than this many tokens are malformed
                (reference: 50). 0: no length condition.
            max_repeats: With ``format_penalty``: answers repeating a run of 1-20 tokens (not digits) back to back
                more than this many times are malformed (reference: 3). None: no repetition condition.
        """
        super().__init__(*args, **kwargs)
        require(0 <= gamma <= 1, f"model.gamma must be in [0, 1], got {gamma}")
        for name, v in (("alpha0", alpha0), ("alpha1", alpha1), ("beta0", beta0), ("beta1", beta1)):
            require(v >= 0, f"model.{name} must be >= 0 (the tables give it its sign), got {v}")
        require(kl_coef >= 0, f"model.kl_coef must be >= 0, got {kl_coef}")
        require(0 <= gae_gamma <= 1, f"model.gae_gamma must be in [0, 1], got {gae_gamma}")
        require(0 <= gae_lambda <= 1, f"model.gae_lambda must be in [0, 1], got {gae_lambda}")
        require(clip > 0, f"model.clip must be > 0, got {clip}")
        require(num_epochs >= 1, f"model.num_epochs must be >= 1, got {num_epochs}")
        require(minibatch_size is None or minibatch_size >= 1, f"model.minibatch_size must be >= 1, got {minibatch_size}")
        require(micro_batch_size is None or micro_batch_size >= 1,
                f"model.micro_batch_size must be >= 1, got {micro_batch_size}")
        require(value_coef >= 0, f"model.value_coef must be >= 0, got {value_coef}")
        require(value_lr > 0, f"model.value_lr must be > 0, got {value_lr}")
        require(train_from_turn >= 1, f"model.train_from_turn must be >= 1 (1-based turn), got {train_from_turn}")
        require(min_response_tokens >= 0, f"model.min_response_tokens must be >= 0, got {min_response_tokens}")
        require(max_repeats is None or max_repeats >= 1, f"model.max_repeats must be >= 1 or null, got {max_repeats}")
        self.format_penalty, self.min_response_tokens, self.max_repeats = format_penalty, min_response_tokens, max_repeats
        self.gamma, self.incentives = gamma, dict(alpha0=alpha0, alpha1=alpha1, beta0=beta0, beta1=beta1)
        self.kl_coef, self.gae_gamma, self.gae_lambda, self.clip = kl_coef, gae_gamma, gae_lambda, clip
        self.num_epochs, self.minibatch_size, self.micro_batch_size = num_epochs, minibatch_size, micro_batch_size
        self.value_coef, self.value_lr, self.entropy_coef = value_coef, value_lr, entropy_coef
        require(value_hidden is None or all(isinstance(w, int) and w >= 1 for w in value_hidden),
                f"model.value_hidden must list layer widths >= 1 (e.g. [1024, 512]) or be null, got {value_hidden}")
        self.value_hidden = list(value_hidden) if value_hidden is not None else list(HIDDEN)
        self.per_turn, self.train_from_turn = per_turn, train_from_turn
        self.normalize_advantages = normalize_advantages
        self.value_heads: nn.ModuleList | None = None

    # -- construction ------------------------------------------------------------------------------
    def team_specs(self, env) -> list[AgentSpec]:
        specs = resolve_agents(env, self.agent_specs)
        if not self.per_turn:
            return specs
        import copy

        return [copy.deepcopy(spec) for _ in range(env.horizon) for spec in specs]

    def build_extra(self, env) -> None:
        if not hasattr(env, "grade_answers"):
            raise UserError(f"MAPoRL trains a debate; env {env.name!r} is not one (use --data.env debate)")
        n = env.n_agents
        if self.per_turn:
            self.team.turn_agents = [[t * n + a for a in range(n)] for t in range(env.horizon)]
        self.value_heads = nn.ModuleList(
            CriticHead(self.team.model_of(m).config.hidden_size, self.value_hidden) for m in range(len(self.team))
        ).to(self.team.device)

    def param_groups(self):
        return super().param_groups() + [{"params": list(self.value_heads.parameters()), "lr": self.value_lr,
                                          "name": "value_heads"}]

    # -- rollout -----------------------------------------------------------------------------------
    def rollout(self, env, tasks) -> RolloutBatch:
        start = time.perf_counter()
        episodes = [eps[0] for eps in play(self.team, env, tasks, 1, self.max_new_tokens)]
        stats = episode_stats(episodes, time.perf_counter() - start)
        responses, rewards = self.responses(episodes)
        played = [r[:len(ep.completions)] for r, ep in zip(rewards, episodes)]  # the absorbing turns are not answers
        stats["reward/maporl"] = float(torch.cat([r.flatten() for r in played]).mean())
        for t in range(max(r.shape[0] for r in played)):
            stats[f"reward/maporl/turn{t + 1}"] = float(torch.stack([r[t].mean() for r in played if len(r) > t]).mean())
        if self.format_penalty is not None:
            stats["train/malformed"] = self._malformed_share
        with torch.no_grad():
            stats.update(self.prepare(responses))
        examples = [{"prompts": [obs[-1]["content"] for obs in ep.observations[-1]], "responses": ep.responses[-1],
                     "reward": list(ep.steps[-1].rewards)} for ep in episodes[:1]]
        return RolloutBatch([], stats, examples, buffer=ReplayBuffer(responses))

    def responses(self, episodes: list[Episode]) -> tuple[list[Response], list[Tensor]]:
        """Every trained answer with its reward (:func:`collab.objectives.episode_rewards`: Definition 1 and the incentives on the
        tables extended to T turns, scores penalised by ``format_penalty``), and each episode's ``[T, A]`` rewards
        (rows past an early stop: the absorbing turns)."""
        out, all_rewards = [], []
        bad, total = 0, 0
        for ep in episodes:
            memory = ep.state.memory
            scores = torch.tensor(memory["scores"], dtype=torch.float32)
            if self.format_penalty is not None:
                flags = torch.tensor([[self._malformed(t, a, answer, c) for a, (answer, c) in
                                       enumerate(zip(memory["answers"][t], joint))]
                                      for t, joint in enumerate(ep.completions)], dtype=torch.bool)
                scores = torch.where(flags, torch.tensor(float(self.format_penalty)), scores)
                bad, total = bad + int(flags.sum()), total + flags.numel()
            rewards = episode_rewards(scores, memory["answers"], memory["correct"], ep.steps[-1].turns_left,
                                      self.gamma, **self.incentives)
            all_rewards.append(rewards)
            for t, joint in enumerate(ep.completions):
                if t + 1 < self.train_from_turn:
                    continue
                for a, c in enumerate(joint):
                    if len(c.completion_ids) == 0:
                        continue
                    out.append(Response(self.team.acting(t, a), t, a, list(c.prompt_ids), list(c.completion_ids),
                                        torch.tensor(c.logprobs, dtype=torch.float32), float(rewards[t, a])))
        self._malformed_share = bad / total if total else 0.0
        return out, all_rewards

    def _malformed(self, turn: int, role: int, answer: str | None, completion) -> bool:
        """:func:`collab.envs.debate.penalties.malformed` for agent ``role``'s answer at ``turn`` (digit runs exempt from the repetition check)."""
        tokenizer = self.team.tokenizer_of(self.team.acting(turn, role))
        return malformed(answer, completion.completion_ids, self.min_response_tokens, self.max_repeats,
                         exempt=lambda run: tokenizer.decode(run).strip().isdigit())

    def prepare(self, responses: list[Response]) -> dict[str, float]:
        """Fix reference log-probs, token rewards, values V_old, advantages and returns of every response."""
        if not responses:
            return {}
        members = [r.member for r in responses]
        prompts, completions = [r.prompt_ids for r in responses], [r.completion_ids for r in responses]
        ref = self.team.logprobs(members, prompts, completions, reference=True)
        kls = []
        for r, ref_lp, features in zip(responses, ref, self.features(responses)):
            ref_lp = ref_lp.float().cpu()
            values = self.value_heads[r.member](features.to(self.team.device)).float().cpu()
            rewards = token_rewards(r.reward, r.old_logprobs, ref_lp, self.kl_coef)
            dones = torch.zeros_like(rewards)
            dones[-1] = 1.0
            advantages, returns = gae(rewards, values, dones, self.gae_gamma, self.gae_lambda)
            r.extras = {"features": features, "values": values, "advantages": advantages, "returns": returns}
            kls.append(r.old_logprobs - ref_lp)
        kl = torch.cat(kls)
        return {"train/kl_ref": float(kl.mean()), "train/kl_ref_sum": float(torch.stack([k.sum() for k in kls]).mean())}

    def features(self, responses: list[Response]) -> list[Tensor]:
        """The frozen base's hidden state at every position choosing a response token (one batch per base)."""
        out: list[Tensor | None] = [None] * len(responses)
        for key in self.team.models:
            rows = [k for k, r in enumerate(responses) if self.team.base_of[r.member] == key]
            if not rows:
                continue
            member = responses[rows[0]].member
            feats = base_features(self.team.model_of(member), self.team.tokenizer_of(member).pad_token_id,
                                  [responses[k].prompt_ids for k in rows], [responses[k].completion_ids for k in rows])
            for k, f in zip(rows, feats):
                out[k] = f
        return out  # type: ignore[return-value]

    # -- update ------------------------------------------------------------------------------------
    def update(self, batch: RolloutBatch) -> dict[str, float]:
        buffer: ReplayBuffer = batch.buffer
        generator = torch.Generator().manual_seed(self.rollouts)
        minibatches = list(buffer.epochs(self.num_epochs, self.minibatch_size, generator)) if len(buffer) else []
        schedule = minibatch_schedule(self, minibatches)
        if not schedule:  # no answer to train on any rank
            self.skip_update()
            return {}
        totals: dict[str, list[float]] = {}
        for minibatch, _ in schedule:
            stats: dict[str, float] = {}
            optimizer_step(self, self.micro_batches(minibatch, stats))
            for key, value in stats.items():
                totals.setdefault(key, []).append(value)
        buffer.clear()
        return {key: sum(v) / len(v) for key, v in totals.items()}

    def micro_batches(self, minibatch: list[Response], stats: dict[str, float]) -> list:
        """The minibatch's token-mean loss in parts of ``micro_batch_size`` responses, as callables for
        :func:`collab.distributed.optimizer_step`: each part weighted by its share of the tokens of all
        ranks' minibatches (the same gradient as one pass over them, in less memory); normalisation uses
        every rank's advantages. Each part adds its statistics to ``stats`` as it runs."""
        advantages = torch.cat([r.extras["advantages"] for r in minibatch]) if minibatch else torch.zeros(0)
        if self.normalize_advantages:
            advantages = global_normalize(self, advantages)
        tokens = float(global_sum(self, advantages.numel())) if world_size(self) > 1 else advantages.numel()
        parts = torch.split(advantages, [len(r.completion_ids) for r in minibatch])
        size = self.micro_batch_size or max(len(minibatch), 1)

        def part(micro, adv):
            def loss():
                actor, entropy, actor_stats = self.actor_loss(micro, adv)
                critic, critic_stats = self.critic_loss(micro)
                weight = adv.numel() / tokens
                for key, value in {**actor_stats, **critic_stats}.items():
                    stats[key] = stats.get(key, 0.0) + weight * value
                return weight * (actor + self.value_coef * critic - self.entropy_coef * entropy)
            return loss
        return [part(minibatch[start:start + size], torch.cat(parts[start:start + size]))
                for start in range(0, len(minibatch), size)]

    def accumulate(self, minibatch: list[Response], backward) -> dict[str, float]:
        """One process's gradient of the minibatch's token-mean loss, ``backward`` per micro-batch; returns the stats."""
        stats: dict[str, float] = {}
        for part in self.micro_batches(minibatch, stats):
            backward(part())
        return stats

    def actor_loss(self, minibatch: list[Response], advantages: Tensor) -> tuple[Tensor, Tensor, dict[str, float]]:
        """The token-level clipped surrogate of Section 3.2, averaged over the responses' tokens (``advantages``:
        theirs, concatenated)."""
        logprobs, entropies = self.team.logprobs([r.member for r in minibatch], [r.prompt_ids for r in minibatch],
                                                 [r.completion_ids for r in minibatch], entropy=True)
        logprobs = torch.cat(logprobs)
        old = torch.cat([r.old_logprobs for r in minibatch]).to(logprobs)
        advantages = advantages.to(logprobs)
        loss = clipped_surrogate(logprobs, old, advantages, self.clip).mean()
        entropy = torch.cat(entropies).mean()
        return loss, entropy, {"train/actor_loss": float(loss.detach()), "train/entropy": float(entropy.detach()),
                               **ratio_stats(logprobs, old, self.clip)}

    def critic_loss(self, minibatch: list[Response]) -> tuple[Tensor, dict[str, float]]:
        """L_value: the squared error of every token's value against V_target = V_old + A."""
        device = self.team.device
        values = torch.cat([self.value_heads[r.member](r.extras["features"].to(device)) for r in minibatch])
        returns = torch.cat([r.extras["returns"] for r in minibatch]).to(values)
        loss = value_loss(values, returns)
        return loss, {"train/value_loss": float(loss.detach()), "train/value_mean": float(values.detach().mean()),
                      "train/return_mean": float(returns.mean()), "train/explained_variance": explained_variance(values, returns)}
