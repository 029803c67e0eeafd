"""MAGRPO's groups against Dr. MAS's agent-wise advantage normalisation (arXiv 2602.08847; code: ``langfengQ/DrMAS``,
``verl/trainer/ppo/core_algos.py`` ``compute_grpo_outcome_advantage`` and ``ray_trainer.py`` ``compute_advantage``,
at 19c632b).

Dr. MAS runs GRPO over whole episodes of a multi-agent system: a batch holds one row per agent call, each with its
prompt group (``uid``, the G episodes of one task), its episode (``traj_uid``), its agent and the episode's score.
The oracles below are written from a reading of that code:

- agent-wise (``group_by_agent_id``, Dr. MAS): a group is one task's rows of one agent, all of them pooled; every
  row gets (s - mean) / (std + 1e-6) over its group (unbiased std), or s - mean without the std;
- global (vanilla GRPO there): a row's score becomes its episode's mean over its rows; a group is one task's
  episodes; the same normalisation over their G scores.

A group of one row gets mean 0 and std 1 in both. collab's MAGRPO groups one agent's K samples at one history
node, so at one turn (every agent acting once in each of the K episodes) its groups are Dr. MAS's agent-wise
groups: MAGRPO is agent-wise by construction, with ``normalize_std`` as Dr. MAS's std and no option to add. Where
agents act a varying number of times in an episode (Dr. MAS's orchestras) the rule pools an agent's calls over
turns; collab's tree has no such episode, and MAGRPO's ``rollout_mode: episodes`` plays them
(:mod:`collab.rollout.episode_batch`). The cases: 100 one-turn trees, 1-4 agents, K = 2-8, joint or per-agent
rewards; and 100 cases of K whole episodes of 1-4 turns that end early at random.
"""

from __future__ import annotations

import random
import statistics
from collections import Counter

import pytest

from collab.algos.magrpo import set_group_advantages
from collab.envs.base import AgentRole, Env, Score
from collab.rollout.episode_batch import episode_batch, episode_return
from collab.rollout.tree import tree_batch
from tests.support import ScriptedTeam

SEEDS = range(100)
EPS = 1e-6


def normalised(scores: list[float], norm_std: bool) -> tuple[float, float]:
    """(mean, divisor) of one group as the reference computes them."""
    if len(scores) == 1:
        return 0.0, 1.0
    return statistics.fmean(scores), (statistics.stdev(scores) + EPS) if norm_std else 1.0


def agent_wise(rows: list[dict], norm_std: bool) -> list[float]:
    """Dr. MAS: each row normalised over the rows of its task and agent."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault((r["uid"], r["agent"]), []).append(r["score"])
    stats = {key: normalised(v, norm_std) for key, v in groups.items()}
    return [(r["score"] - stats[(r["uid"], r["agent"])][0]) / stats[(r["uid"], r["agent"])][1] for r in rows]


def global_rule(rows: list[dict], norm_std: bool) -> list[float]:
    """Vanilla GRPO of the same code: a row scores its episode's mean; groups of episodes of one task."""
    episodes: dict[tuple, list[float]] = {}
    for r in rows:
        episodes.setdefault((r["uid"], r["traj"]), []).append(r["score"])
    means = {key: statistics.fmean(v) for key, v in episodes.items()}
    groups: dict[str, list[float]] = {}
    for (uid, _), m in means.items():
        groups.setdefault(uid, []).append(m)
    stats = {uid: normalised(v, norm_std) for uid, v in groups.items()}
    return [(means[(r["uid"], r["traj"])] - stats[r["uid"]][0]) / stats[r["uid"]][1] for r in rows]


def case(seed: int) -> dict:
    rng = random.Random(seed)
    return dict(seed=seed, n=rng.randint(1, 4), k=rng.randint(2, 8), tasks=rng.randint(1, 3), joint=rng.random() < 0.4,
                discrete=rng.random() < 0.5)  # fmt: skip


class DrawEnv(Env):
    """``tasks`` tasks of ``horizon`` turns; agent i's reward for a joint action: a draw of the case's generator, the
    same for every agent under a joint reward; with ``end`` > 0 an episode ends early with that probability a turn,
    so a task's K episodes have different lengths; with ``route`` the env plays agent 0 and each other agent with
    probability 0.5 a turn (an orchestra's routing, :meth:`~collab.envs.base.Env.played`)."""

    name = "draws"

    def __init__(self, c: dict, horizon: int = 1, end: float = 0.0, offset: int = 1000, route: bool = False) -> None:
        super().__init__(horizon)
        self.c, self.end, self.route, self.rng = c, end, route, random.Random(c["seed"] + offset)
        self.joint_reward = c["joint"]
        self.roles = tuple(AgentRole(f"a{i}", max_new_tokens=1) for i in range(c["n"]))

    def tasks(self, split):
        return [{"id": t} for t in range(self.c["tasks"])]

    def observe(self, task):
        return [f"task {task['id']}"] * self.n_agents

    def draw(self) -> float:
        return self.rng.choice([0.0, 0.5, 1.0]) if self.c["discrete"] else self.rng.uniform(-1.0, 2.0)

    def score(self, state, actions):
        rewards = (self.draw(),) * self.n_agents if self.joint_reward else tuple(self.draw() for _ in actions)
        return Score(rewards, terminated=self.end > 0 and self.rng.random() < self.end)

    def played(self, state, actions):
        return (True, *(not self.route or self.rng.random() < 0.5 for _ in actions[1:]))


def rows_of(seed: int, normalize_std: bool) -> tuple[list, list[dict]]:
    """collab's samples of case ``seed`` with MAGRPO's advantages, and the same samples as Dr. MAS's rows."""
    c = case(seed)
    env = DrawEnv(c)
    batch = tree_batch(ScriptedTeam(lambda agent, messages: "x"), env, env.tasks("train"), c["k"], 1.0)
    set_group_advantages(batch.items, "mean", normalize_std)
    k, n = c["k"], c["n"]
    # tree_batch lists each task's node agent by agent, each agent's K samples in order: sample j is episode j
    rows = [
        dict(uid=pos // (n * k), traj=(pos // (n * k), pos % k), agent=s.agent, score=s.returns)
        for pos, s in enumerate(batch.items)
    ]
    assert [s.agent for s in batch.items] == [(pos // k) % n for pos in range(len(rows))]
    return batch.items, rows


def close(a: list[float], b: list[float]) -> bool:
    scale = 1.0 + max(abs(v) for v in b)
    return len(a) == len(b) and all(abs(x - y) <= 1e-9 * scale for x, y in zip(a, b))


@pytest.mark.parametrize("normalize_std", [True, False])
def test_magrpo_is_dr_mas_agent_wise(normalize_std):
    for seed in SEEDS:
        samples, rows = rows_of(seed, normalize_std)
        assert close([s.advantages for s in samples], agent_wise(rows, normalize_std)), (seed, case(seed))


def test_the_global_rule_differs_only_under_per_agent_rewards():
    """Under a joint reward every agent's rows are its episode's score, so Dr. MAS's two rules agree; with per-agent
    rewards and two or more agents they differ: the cross-check above can tell agent-wise from global."""
    joint = differ = 0
    for seed in SEEDS:
        c = case(seed)
        _, rows = rows_of(seed, True)
        same = close(global_rule(rows, True), agent_wise(rows, True))
        if c["joint"] or c["n"] == 1:
            assert same, seed
            joint += 1
        else:
            differ += not same
    assert joint >= 30 and differ >= 30


# -- whole episodes (MAGRPO's rollout_mode: episodes) ----------------------------------------------------------


def episode_rows(seed: int, normalize_std: bool) -> tuple[list, list[dict]]:
    """collab's decisions of case ``seed`` played as K whole episodes, with MAGRPO's advantages, and the same
    decisions as Dr. MAS's rows: each row's score is its episode's reward, summed here from the decisions' own
    turn rewards (gamma 1, the reference's), independently of their ``returns``. Odd seeds route: agents 1+ are
    played at random turns (their unplayed responses no rows, as unrouted agents make no call in the reference), under
    a joint reward, so that agent 0's rows, one a turn, give the episode's score."""
    route = seed % 2 == 1
    c = {**case(seed), **({"joint": True} if route else {})}
    env = DrawEnv(c, horizon=random.Random(seed).randint(1, 4), end=0.3, offset=2000, route=route)
    batch = episode_batch(ScriptedTeam(lambda agent, messages: "x"), env, env.tasks("train"), c["k"], 1.0)
    set_group_advantages(batch.items, "mean", normalize_std)
    rows, episode, score = [], -1, {}
    for s in batch.items:  # task, episode, turn, agent order: an episode starts where turn 0's first agent acts
        episode += s.turn == 0 and s.agent == 0
        score[episode, s.agent] = score.get((episode, s.agent), 0.0) + s.reward
        rows.append(dict(uid=s.group // c["n"], traj=episode, agent=s.agent))
    for r in rows:
        r["score"] = score[r["traj"], 0 if route else r["agent"]]
    assert len({r["traj"] for r in rows}) == c["tasks"] * c["k"]
    return batch.items, rows


@pytest.mark.parametrize("normalize_std", [True, False])
def test_episodes_are_dr_mas_agent_wise_at_any_number_of_turns(normalize_std):
    """100 cases of 1-4 turns with early ends, half of them routed: every decision's advantage is Dr. MAS's agent-wise
    one, the groups pooling an agent's calls over its task's episodes and turns (a group of one: mean 0, std 1)."""
    lengths, singles = set(), 0
    for seed in SEEDS:
        samples, rows = episode_rows(seed, normalize_std)
        lengths.add(len({(r["traj"], s.turn) for r, s in zip(rows, samples)}) / len({r["traj"] for r in rows}))
        sizes = Counter((r["uid"], r["agent"]) for r in rows)
        singles += sum(n == 1 for n in sizes.values())
        assert close([s.advantages for s in samples], agent_wise(rows, normalize_std)), seed
    assert len(lengths) > 20  # episodes of many lengths: the pooled groups are tested, not one-turn ones
    assert singles >= 3  # groups of one row, an agent routed to once in its task's episodes


def test_episode_returns_by_hand():
    """Two turns of rewards (0.5, 1.0) for agent 0 and (0.0, 2.0) for agent 1: G = r_0 + gamma r_1 for every decision
    of the episode, the first turn's included, with no absorbing repetition after an early end."""
    from collab.envs.base import StepResult
    from collab.rollout.episodes import Episode

    ep = Episode(0, steps=[StepResult(None, (0.5, 0.0), False, {}), StepResult(None, (1.0, 2.0), True, {}, 2)])
    assert episode_return(ep, 0, 0.9) == pytest.approx(0.5 + 0.9 * 1.0)
    assert episode_return(ep, 1, 0.9) == pytest.approx(0.9 * 2.0)
    assert episode_return(ep, 1, 1.0) == pytest.approx(2.0)


def test_at_one_turn_whole_episodes_are_the_tree():
    """At one turn the K episodes of a task are the tree's K joint actions: the tiny model, seeded alike, samples the
    same responses under both rollouts, with the same returns and advantages (so the default run's figures are the
    tree's: docs/measurements.md)."""
    import torch

    from collab.algos import from_config
    from collab.policy.models import BaseConfig
    from tests.support import EarlySolveEnv

    env = EarlySolveEnv(n_agents=2, horizon=1)
    module = from_config("magrpo", base=BaseConfig(name="tiny", seed=0), agents=None, num_generations=3)
    module.build(env)
    seen = []
    for mode in ("tree", "episodes"):
        module.rollout_mode = mode
        torch.manual_seed(0)
        batch = module.prepare(module.rollout(env.tasks("train")[:2]))
        # group // 2: the task (one node a task in the tree, its two agents' groups numbered in turn)
        rows = [(s.agent, s.group // 2, tuple(s.completion_ids), s.returns, s.advantages) for s in batch.items]
        seen.append(sorted(rows))
    assert seen[0] == seen[1] and len(seen[0]) > 0


def test_whole_episodes_under_a_chain_let_an_agent_act_on_its_parents_action():
    """``dependency``: agent 1 acts after agent 0 at each turn, with agent 0's action of that turn in its prompt (Dr.
    MAS's orchestras call their agents one after the other); without one both act on the turn's state alone."""
    from collab.rollout.protocol import Dependency

    def respond(agent, messages):
        if agent == 0:
            return "plan-" + messages[-1]["content"][-1]
        return "saw " + ("plan" if "plan-" in messages[-1]["content"] else "nothing")

    c = dict(case(0), n=2, k=3, tasks=2, joint=True)
    env = DrawEnv(c, horizon=2)
    seen = {}
    for spec in ("chain", "none"):
        dependency = Dependency(spec, 2)
        batch = episode_batch(ScriptedTeam(respond), env, env.tasks("train"), c["k"], 1.0, dependency=dependency)
        seen[spec] = {s.text for s in batch.items if s.agent == 1}
        assert len([s for s in batch.items if s.agent == 1]) == c["tasks"] * c["k"] * 2
    assert seen == {"chain": {"saw plan"}, "none": {"saw nothing"}}


def test_magrpo_builds_its_dependency_as_the_protocol_its_evaluation_plays():
    from collab.algos import from_config
    from collab.policy.models import BaseConfig
    from tests.support import EarlySolveEnv

    env = EarlySolveEnv(n_agents=2, horizon=1)
    chained = from_config("magrpo", base=BaseConfig(name="tiny"), rollout_mode="episodes", dependency="chain")
    chained.build(env)
    assert chained.protocol.parents(0) == [[], [0]]
    plain = from_config("magrpo", base=BaseConfig(name="tiny"), rollout_mode="episodes")
    plain.build(env)
    assert plain.protocol is None
