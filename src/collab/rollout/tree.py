"""MAGRPO's K-ary rollout tree (CoLLM, Section 3.1; MAGRPO).

At every history node the team draws K samples per agent; the node's children are joint actions:

``aligned``  child k = (a_1^k, ..., a_n^k), K children (the K i.i.d. joint actions of Proposition 3.2);
``cross``    every combination of the agents' samples, K^n children. Agent i's sample j is then valued
             by the mean return of the children that contain it (a lower-variance estimate of its
             value under the other agents' current policies).

Each child that does not terminate is expanded the same way, to depth H (the env's horizon). A child
terminates when the environment ends the episode or, with ``termination_threshold``, by MAGRPO's early
termination, decided per ``termination``:

``branch``   a child ends when every agent's reward reaches the threshold (collab's default);
``node``     all K children of a node end when the mean of their (team) rewards exceeds the threshold
             (the reference code's rule: strictly greater, the node's children as one group).

With no early termination and ``aligned``, the number of agent generations of one episode is paper
002's Proposition 3.2, n K (K^H - 1) / (K - 1). With ``keep="best"`` (AT-GRPO's tree sampling,
:mod:`collab.algos.at_grpo`) only the child of the best joint action (:func:`~collab.objectives.best_joint`) is
expanded: n K H generations.

Returns are discounted Monte Carlo estimates through the tree: a child's return is its reward plus
gamma times the mean return of its own children (the K-sample estimate of the successor history's
value, as in Proposition 3.1). A child that ends before the horizon is an absorbing state that repeats
its reward for the turns it skipped (:func:`~collab.objectives.absorbing_reward`), so a branch that
succeeds at turn 1 never gets a lower return than a sibling that succeeds later. Each sample carries
its return and its group (an agent's K siblings), from which MAGRPO makes group-relative advantages
(:meth:`collab.algos.magrpo.MAGRPO.prepare`); in ``cross`` mode agent i's sample j is valued by the
``cross_reduction`` of the returns of the children that contain it: ``mean`` (collab's default, on the
scale of one joint return) or ``sum`` (the reference code's, K^(n-1) times larger).
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from collab.envs.base import Env, EnvState
from collab.objectives import absorbing_reward, best_joint
from collab.policy.sampling import Completion, GenerationRequest
from collab.rollout.episodes import rollout_stats, step_joint
from collab.rollout.experience import Decision, Experience

JOINT_MODES = ("aligned", "cross")
TERMINATIONS = ("branch", "node")
KEEPS = ("all", "best")
CROSS_REDUCTIONS = ("mean", "sum")


@dataclass
class TreeNode:
    state: EnvState
    depth: int
    samples: list[list[Completion]] = field(default_factory=list)
    """samples[i][j]: agent i's j-th response at this history."""
    joints: list[tuple[int, ...]] = field(default_factory=list)
    """joints[c][i]: which of agent i's samples child c uses."""
    rewards: list[tuple[float, ...]] = field(default_factory=list)
    infos: list[Mapping[str, float]] = field(default_factory=list)
    children: list[TreeNode | None] = field(default_factory=list)
    turns_left: list[int] = field(default_factory=list)
    """turns_left[c]: turns of the horizon child c skipped by ending early (0 if it goes on or ends at H)."""
    returns: torch.Tensor | None = None
    """returns[c, i]: discounted return of child c for agent i."""

    def nodes(self):
        yield self
        for child in self.children:
            if child is not None:
                yield from child.nodes()


def joint_indices(n_agents: int, k: int, mode: str) -> list[tuple[int, ...]]:
    if mode == "aligned":
        return [(j,) * n_agents for j in range(k)]
    if mode == "cross":
        return list(itertools.product(range(k), repeat=n_agents))
    raise ValueError(f"unknown joint mode {mode!r}; valid: {', '.join(JOINT_MODES)}")


def expand_tree(
    team,
    env: Env,
    tasks: Sequence[Mapping],
    k: int,
    joint_mode: str = "aligned",
    termination_threshold: float | None = None,
    max_new_tokens: int = 128,
    termination: str = "branch",
    keep: str = "all",
) -> list[TreeNode]:
    """Grow one rollout tree per task, breadth first: each depth is one batched ``team.generate`` (with the env's
    tools, :mod:`collab.tools.setup`). ``keep``: expand every child that goes on (``all``) or only the best joint
    action's (``best``; the episode ends there when that one ended)."""
    if keep not in KEEPS:
        raise ValueError(f"unknown keep {keep!r}; valid: {', '.join(KEEPS)}")
    team = env.tools.acting(team)
    roots = [TreeNode(env.reset(task), 0) for task in tasks]
    frontier = list(roots)
    n = env.n_agents
    while frontier:
        requests = [
            GenerationRequest(i, team.encode(i, node.state.histories[i]), k, task=node.state.task)
            for node in frontier
            for i in range(n)
        ]
        outs = team.generate(requests, max_new_tokens=max_new_tokens)
        pending = []  # (node, joint action) of this whole depth, scored by one env.step_batch
        for m, node in enumerate(frontier):
            node.samples = outs[m * n : (m + 1) * n]
            node.joints = joint_indices(n, k, joint_mode)
            pending += [(node, [node.samples[i][j] for i, j in enumerate(joint)]) for joint in node.joints]
        steps = step_joint(env, [node.state for node, _ in pending], [joint for _, joint in pending])
        next_frontier = []
        for (node, _), step in zip(pending, steps):
            node.rewards.append(step.rewards)
            node.infos.append(step.info)
            node.children.append(None if step.done else TreeNode(step.state, node.depth + 1))
            node.turns_left.append(step.turns_left)
        for node in frontier:
            for c in early_ends(node, termination_threshold, termination):
                node.children[c] = None
                node.turns_left[c] = env.horizon - node.depth - 1
            if keep == "best":
                chosen = best_joint(node.rewards)
                node.children = [child if c == chosen else None for c, child in enumerate(node.children)]
            next_frontier += [child for child in node.children if child is not None]
        frontier = next_frontier
    return roots


def early_ends(node: TreeNode, threshold: float | None, termination: str = "branch") -> list[int]:
    """The children of ``node`` that MAGRPO's early termination ends (beyond those the environment ended)."""
    if threshold is None:
        return []
    if termination == "branch":
        return [c for c, r in enumerate(node.rewards) if node.children[c] is not None and min(r) >= threshold]
    if termination == "node":
        team = [sum(r) / len(r) for r in node.rewards]
        return (
            [c for c, child in enumerate(node.children) if child is not None]
            if sum(team) / len(team) > threshold
            else []
        )
    raise ValueError(f"unknown termination {termination!r}; valid: {', '.join(TERMINATIONS)}")


def backup_returns(node: TreeNode, gamma: float) -> torch.Tensor:
    """Fill ``returns`` bottom-up: G(c) = r(c) + gamma * mean over c's children of G, and for a child that
    ended m turns early G(c) = r(c) (1 + gamma + ... + gamma^m) (the absorbing end)."""
    rows = []
    for reward, child, left in zip(node.rewards, node.children, node.turns_left or [0] * len(node.rewards)):
        r = torch.tensor(reward, dtype=torch.float64)
        if child is not None:
            r = r + gamma * backup_returns(child, gamma).mean(0)
        else:
            r = absorbing_reward(r, left, gamma)
        rows.append(r)
    node.returns = torch.stack(rows)
    return node.returns


def sample_values(node: TreeNode, agent: int, k: int, reduction: str = "mean") -> torch.Tensor:
    """Value of each of agent ``agent``'s K samples: the mean (or ``sum``) of the returns of the children that use
    it."""
    assert node.returns is not None
    if reduction not in CROSS_REDUCTIONS:
        raise ValueError(f"unknown cross reduction {reduction!r}; valid: {', '.join(CROSS_REDUCTIONS)}")
    sums = torch.zeros(k, dtype=torch.float64)
    counts = torch.zeros(k, dtype=torch.float64)
    for joint, ret in zip(node.joints, node.returns[:, agent]):
        sums[joint[agent]] += ret
        counts[joint[agent]] += 1
    return sums if reduction == "sum" else sums / counts


def tree_batch(
    team,
    env: Env,
    tasks: Sequence[Mapping],
    k: int,
    gamma: float = 1.0,
    joint_mode: str = "aligned",
    termination_threshold: float | None = None,
    max_new_tokens: int = 128,
    termination: str = "branch",
    cross_reduction: str = "mean",
    keep: str = "all",
    relabel: Callable[[TreeNode], None] | None = None,
) -> Experience:
    """Roll out the trees of ``tasks`` and turn every agent's sample at every node into a
    :class:`~collab.rollout.experience.Decision` carrying its return (:func:`sample_values`) and its group (the
    node and agent it was drawn for); the
    algorithm turns returns into advantages (:meth:`collab.algos.magrpo.MAGRPO.prepare`). ``relabel`` sees each
    root before its returns are backed up, and may replace its nodes' ``rewards`` (MARLHF's reward model)."""
    start = time.perf_counter()
    roots = expand_tree(team, env, tasks, k, joint_mode, termination_threshold, max_new_tokens, termination, keep)
    seconds = time.perf_counter() - start
    samples: list[Decision] = []
    scalars: dict[str, list[float]] = defaultdict(list)  # rewards and env info, averaged into stats
    group = 0
    tokens = 0
    for root in roots:
        if relabel is not None:
            relabel(root)
        backup_returns(root, gamma)
        for node in root.nodes():
            for i in range(env.n_agents):
                values = sample_values(node, i, k, cross_reduction)
                for j, c in enumerate(node.samples[i]):
                    tokens += c.own_tokens  # generated: a tool's result is not
                    samples.append(
                        Decision(
                            i,
                            i,
                            node.depth,
                            c.prompt_ids,
                            c.completion_ids,
                            torch.tensor(c.logprobs),
                            returns=float(values[j]),
                            group=group,
                            text=c.text,
                            adapter_version=c.adapter_version,
                            own=c.own,
                        )
                    )
                group += 1
                for reward in node.rewards:
                    scalars[f"reward/turn{node.depth}/agent{i}"].append(reward[i])
            for info in node.infos:
                for key, v in info.items():
                    scalars[f"env/{key}"].append(float(v))
        scalars["reward/return"].extend(root.returns.mean(1).tolist())
    stats = {**rollout_stats(scalars, tokens, seconds), "rollout/samples": float(len(samples))}
    examples = []
    for root in roots[:1]:
        for c in range(min(2, len(root.joints))):
            examples.append(
                {
                    "prompts": [h[-1]["content"] for h in root.state.histories],
                    "responses": [root.samples[i][j].text for i, j in enumerate(root.joints[c])],
                    "reward": list(root.rewards[c]),
                }
            )
    return Experience(samples, stats, examples)
