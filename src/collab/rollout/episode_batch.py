"""K whole episodes of each task, every agent's response a :class:`~collab.rollout.experience.Decision` scored by
its episode: the rollout of GRPO over whole episodes of a multi-agent system, as Dr. MAS trains it (arXiv 2602.08847;
its code, ``langfengQ/DrMAS``: ``compute_grpo_outcome_advantage`` with ``group_by_agent_id``).

Where MAGRPO's tree (:mod:`collab.rollout.tree`) draws K samples at every history, here each task is played K times
from its start (:func:`~collab.rollout.episodes.play`), each episode going on alone. Agent i's decisions at every
turn of a task's K episodes form one group (``Decision.group``): Dr. MAS's agent-wise group, which pools an agent's
calls over the turns; an agent whose action the env did not play at a turn (:meth:`~collab.envs.base.Env.played`:
the orchestra's unrouted agent) made no call there, and its response is left out. Every decision of an episode
carries the episode's return, sum_t gamma^t r_t (agent i's rewards; the team's under a joint reward): the reference
scores each of an episode's rows by the episode's reward.
Unlike the tree's, an early end is not valued as an absorbing state (the reference's score does not depend on when
its episode ended), so under this rollout a team gains nothing by ending early.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch

from collab.envs.base import Env
from collab.rollout.episodes import Episode, episode_stats, play
from collab.rollout.experience import Decision, Experience
from collab.rollout.protocol import Dependency


def episode_return(episode: Episode, agent: int, gamma: float) -> float:
    """sum_t gamma^t r_t of ``agent``'s rewards over the episode's turns."""
    return sum(gamma**t * step.rewards[agent] for t, step in enumerate(episode.steps))


def episode_batch(
    team,
    env: Env,
    tasks: Sequence[Mapping],
    k: int,
    gamma: float = 1.0,
    max_new_tokens: int = 128,
    dependency: Dependency | None = None,
    invalid_penalty: float = 0.0,
) -> Experience:
    """K episodes of every task as decisions in task, episode, turn, agent order, each with its episode's return
    and its group (task t, agent i: ``t * n + i``); the algorithm turns returns into advantages
    (:func:`collab.algos.magrpo.set_group_advantages`). ``dependency``: the agents act level by level, each on its
    parents' actions of the turn (:func:`~collab.rollout.episodes.play`); None: all at once. ``invalid_penalty``
    comes off the return of each response the env finds invalid (:meth:`~collab.envs.base.Env.valid`), that
    response's alone: Dr. MAS's invalid-action penalty."""
    start = time.perf_counter()
    played = play(team, env, tasks, k, max_new_tokens, dependency=dependency)
    seconds = time.perf_counter() - start
    member = getattr(team, "acting", lambda turn, role: role)
    n = env.n_agents
    samples: list[Decision] = []
    for task, episodes in enumerate(played):
        for ep in episodes:
            returns = [episode_return(ep, i, gamma) for i in range(n)]
            for t, (joint, step) in enumerate(zip(ep.completions, ep.steps)):
                acted = env.played(ep.state_at(t), [c.text for c in joint])
                samples += [
                    Decision(
                        member(t, i),
                        i,
                        t,
                        list(c.prompt_ids),
                        list(c.completion_ids),
                        torch.tensor(c.logprobs),
                        step.rewards[i],
                        returns[i] - (invalid_penalty if invalid_penalty and not env.valid(i, c.text) else 0.0),
                        group=task * n + i,
                        text=c.text,
                        adapter_version=c.adapter_version,
                        own=c.own,
                    )
                    for i, c in enumerate(joint)
                    if acted[i]
                ]
    stats = episode_stats([ep for episodes in played for ep in episodes], seconds)
    stats["rollout/samples"] = float(len(samples))
    examples = [
        {
            "prompts": [obs[-1]["content"] for obs in ep.observations[0]],
            "responses": ep.responses[0],
            "reward": list(ep.steps[0].rewards),
        }
        for ep in played[0][:2]
    ]
    return Experience(samples, stats, examples)
