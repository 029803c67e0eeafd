"""Playing whole episodes: every live episode's turn in one batched ``team.generate``.

Used by evaluation (``num_samples`` episodes per task) and by the actor-critic algorithms (one
episode per task, no tree: CoLLM, Algorithm 1, lines 3-15). An :class:`Episode` keeps h_0, every
turn's :class:`~collab.envs.base.StepResult` (reward, done, info, h_{t+1}) and the agents'
:class:`~collab.policy.sampling.Completion` objects (token ids and behaviour log-probs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from collab.envs.base import Env, EnvState, Message, StepResult
from collab.errors import require
from collab.policy.sampling import Completion, GenerationRequest
from collab.rollout.protocol import Dependency, fuse


@dataclass
class Episode:
    """One sampled episode: its steps and the agents' responses at every turn."""

    task: int
    start: EnvState | None = None
    """h_0, the state the episode started from."""
    steps: list[StepResult] = field(default_factory=list)
    """``steps[t]``: the outcome of turn t (rewards, done, info, and h_{t+1} as ``state``)."""
    completions: list[list[Completion]] = field(default_factory=list)
    """``completions[t][i]``: agent i's response at turn t (token ids and behaviour log-probs)."""
    observations: list[list[tuple[Message, ...]]] = field(default_factory=list)
    """``observations[t][i]``: the chat agent i acted on at turn t (its history, with its parents'
    actions fused in under a Flex-MG dependency)."""

    @property
    def state(self) -> EnvState | None:
        """The current state (h_0 before the first turn)."""
        return self.steps[-1].state if self.steps else self.start

    def state_at(self, t: int) -> EnvState:
        """h_t: the history the agents acted on at turn t."""
        return self.start if t == 0 else self.steps[t - 1].state

    @property
    def responses(self) -> list[list[str]]:
        return [[c.text for c in turn] for turn in self.completions]

    @property
    def done(self) -> bool:
        return bool(self.steps) and self.steps[-1].done

    @property
    def return_(self) -> float:
        return sum(step.rewards[0] for step in self.steps)

    @property
    def info(self) -> Mapping[str, float]:
        return self.steps[-1].info if self.steps else {}


Group = tuple[EnvState, list[Episode]]
"""A state and the episodes that continue from it."""


def play(
    team,
    env: Env,
    tasks: Sequence[Mapping],
    num_samples: int,
    max_new_tokens: int = 128,
    tasks_per_batch: int | None = None,
    dependency: Dependency | None = None,
) -> list[list[Episode]]:
    """``num_samples`` episodes of each task, every turn of all live episodes in batched ``team.generate`` calls.

    Without a ``dependency`` (D = 0) all agents act at once: one ``generate`` per turn. With one, the
    agents act level by level (:class:`~collab.rollout.protocol.Dependency`), each seeing its
    parents' actions of the same turn fused into its prompt: one ``generate`` per level and turn.
    Agents without parents share each group's prompt (one prefill, ``num_samples`` samples); agents
    with parents get one prompt per episode, since their parents' actions differ.

    The team member that plays role i at turn t is ``team.acting(t, i)``: agent i, unless the team
    routes turns to their own adapters (MAPoRL's per-(turn, agent) parameters theta_ta). With the env's
    tools (:mod:`collab.tools.setup`) the team encodes and decodes with them.

    ``tasks_per_batch`` plays the tasks in chunks of that many (bounding the decoding batch, and so
    the KV cache, at ``tasks_per_batch x n_agents x num_samples`` rows); ``None`` plays all at once.
    """
    require(num_samples >= 1, f"num_samples must be >= 1, got {num_samples}")
    if tasks_per_batch and len(tasks) > tasks_per_batch:
        firsts = range(0, len(tasks), tasks_per_batch)
        chunks = [
            play(team, env, tasks[f : f + tasks_per_batch], num_samples, max_new_tokens, None, dependency)
            for f in firsts
        ]
        for first, chunk in zip(firsts, chunks):
            for ep in (ep for eps in chunk for ep in eps):
                ep.task += first
        return [eps for chunk in chunks for eps in chunk]
    team = env.tools.acting(team)
    dependency = dependency or Dependency("none", env.n_agents)
    starts = [env.reset(task) for task in tasks]
    episodes = [[Episode(t, start) for _ in range(num_samples)] for t, start in enumerate(starts)]
    groups: list[Group] = list(zip(starts, episodes))  # one group per task at the first turn
    turn = 0
    while groups:
        owners = [(state, ep) for state, eps in groups for ep in eps]
        joints, observations = act(team, env, groups, dependency, turn, max_new_tokens)
        steps = step_joint(env, [state for state, _ in owners], joints)
        for (_, ep), joint, obs, step in zip(owners, joints, observations, steps):
            ep.steps.append(step)
            ep.completions.append(joint)
            ep.observations.append(obs)
        groups = [(ep.state, [ep]) for _, ep in owners if not ep.done]
        turn += 1
    return episodes


def act(
    team, env: Env, groups: Sequence[Group], dependency: Dependency, turn: int, max_new_tokens: int
) -> tuple[list[list[Completion]], list[list[tuple[Message, ...]]]]:
    """Every episode's joint action at ``turn`` (the episodes in ``groups`` order) and the chat each agent acted
    on: one ``team.generate`` per level of the dependency."""
    states = [state for state, eps in groups for _ in eps]
    joints: list[list] = [[None] * env.n_agents for _ in states]
    observations: list[list] = [[None] * env.n_agents for _ in states]
    parents, roles = dependency.parents(turn), [role.name for role in env.roles]
    member = getattr(team, "acting", lambda turn, role: role)
    for level in dependency.levels(turn):
        prompts, k = [], 0  # (agent, the episodes its samples go to, the chat it acts on)
        for state, eps in groups:  # agents without parents: one prompt per group, len(eps) samples
            prompts += [(i, range(k, k + len(eps)), state.histories[i]) for i in level if not parents[i]]
            k += len(eps)
        for o, state in enumerate(states):  # agents with parents: one prompt per episode, their actions fused in
            for i in (i for i in level if parents[i]):
                seen = [(roles[p], joints[o][p].text) for p in parents[i]]
                prompts.append((i, range(o, o + 1), fuse(state.histories[i], seen)))
        requests = []
        for i, rows, chat in prompts:
            a = member(turn, i)
            requests.append(GenerationRequest(a, team.encode(a, chat), len(rows), task=states[rows[0]].task))
        for (i, rows, chat), out in zip(prompts, team.generate(requests, max_new_tokens=max_new_tokens)):
            for o, completion in zip(rows, out):
                joints[o][i], observations[o][i] = completion, tuple(chat)
    return joints, observations


def step_joint(env: Env, states: Sequence[EnvState], joints: Sequence[Sequence[Completion]]) -> list[StepResult]:
    """The env's step from each state under its joint action, and with the env's tools the turn's calls counted
    in the info and charged (:meth:`collab.tools.setup.ToolSetup.charge`): every rollout steps through here."""
    steps = env.step_batch(list(states), [[c.text for c in joint] for joint in joints])
    if not env.tools:
        return steps
    return [env.tools.charge(step, joint, env, state.task) for step, joint, state in zip(steps, joints, states)]


def episode_stats(episodes: Sequence[Episode], seconds: float) -> dict[str, float]:
    """Scalars of a rollout of whole episodes: returns, per-turn per-agent rewards, env info means, throughput."""
    scalars: dict[str, list[float]] = {}
    tokens = 0
    for ep in episodes:
        scalars.setdefault("reward/return", []).append(sum(sum(s.rewards) / len(s.rewards) for s in ep.steps))
        scalars.setdefault("rollout/turns", []).append(float(len(ep.steps)))
        for t, step in enumerate(ep.steps):
            for i, r in enumerate(step.rewards):
                scalars.setdefault(f"reward/turn{t}/agent{i}", []).append(float(r))
            for key, v in step.info.items():
                scalars.setdefault(f"env/{key}", []).append(float(v))
            tokens += sum(c.own_tokens for c in ep.completions[t])  # generated: a tool's result is not
    return rollout_stats(scalars, tokens, seconds)


def rollout_stats(scalars: Mapping[str, list[float]], tokens: int, seconds: float) -> dict[str, float]:
    """A rollout's logged scalars: the mean of each list that has values, then the decoding throughput."""
    stats = {key: sum(v) / len(v) for key, v in scalars.items() if v}
    stats.update({"rollout/tokens": float(tokens), "rollout/seconds": seconds})
    stats["rollout/tokens_per_s"] = tokens / max(seconds, 1e-9)
    return stats


def play_once(
    team,
    env: Env,
    tasks: Sequence[Mapping],
    max_new_tokens: int = 128,
    dependency: Dependency | None = None,
    example_turn: int = 0,
) -> tuple[list[Episode], dict[str, float], list[dict]]:
    """A training rollout of whole episodes: one episode per task (:func:`play`), its :func:`episode_stats`, and
    the first episode's prompts, responses and rewards at ``example_turn`` (-1: the last) for the sample-text log."""
    import time

    start = time.perf_counter()
    episodes = [eps[0] for eps in play(team, env, tasks, 1, max_new_tokens, dependency=dependency)]
    stats = episode_stats(episodes, time.perf_counter() - start)
    examples = [
        {
            "prompts": [obs[-1]["content"] for obs in ep.observations[example_turn]],
            "responses": ep.responses[example_turn],
            "reward": list(ep.steps[example_turn].rewards),
        }
        for ep in episodes[:1]
    ]
    return episodes, stats, examples
