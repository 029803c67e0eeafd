"""MADPO's math (:mod:`collab.objectives.preference`) against hand computations, and its pairs, loss and per-agent
gradients against an oracle of the MAGRPO authors' library's rules (CoMLRL, ``comlrl/trainers/preference/madpo.py``
at 4cd3d00 and 055d467, ``comlrl/trainers/reinforce/madpo.py``), written from a reading of that code:

1. At one history the team draws K joint actions, agent i's k-th response in the k-th (``joint_mode`` aligned only);
   each gets the team's reward (collab, beyond the library's one turn: its return through the tree).
2. Candidates: every ordered pair (i, j), i then j in index order, with r_i - r_j > 0 (ties give none).
   ``reward_gap``: sorted by the gap, largest first, a stable sort; ``all``: index order. The first
   ``preference_pairs_per_sample`` are kept (null: all; with ``all`` it must be null).
3. Agent a's delta in a pair: its sequence log-prob (the sum over tokens) of the winner's response less the loser's.
4. Agent a's loss: the mean over the batch's pairs of -log sigmoid(beta (delta_a + the other agents' deltas, taken
   before any agent's step and held constant)); each agent steps on its own loss.

Named reference bugs, not reproduced (docs/fidelity.md): the library's sequence log-prob leaves out the completion's
last token (its logits slice ends one position early), so a one-token response has log-prob 0; a NaN or infinite
loss is replaced by the constant 0.1 (no gradient).
"""

from __future__ import annotations

import json
import random
import zlib

import pytest
import torch
import torch.nn.functional as F

from collab.algos import from_config
from collab.algos.madpo import PreferencePair, node_pairs
from collab.errors import UserError
from collab.objectives import joint_dpo_loss, joint_log_ratios, preference_pairs
from collab.rollout.tree import tree_batch
from tests.algos.test_baselines_reference import RandomTreeEnv, responder
from tests.algos.test_baselines_reference import reward as path_reward
from tests.support import ScriptedTeam


# -- (1) hand computations --------------------------------------------------------------------------------------
def test_pairs_by_reward_gap_keep_index_order_among_equal_gaps():
    # candidates (0, 1) gap 1, (0, 2) gap 0.5, (2, 1) gap 0.5: equal gaps stay in index order
    assert preference_pairs([1.0, 0.0, 0.5]) == [(0, 1), (0, 2), (2, 1)]
    assert preference_pairs([1.0, 0.0, 0.5], "reward_gap", 2) == [(0, 1), (0, 2)]
    assert preference_pairs([0.0, 1.0, 0.5], "reward_gap", 1) == [(1, 0)]
    assert preference_pairs([0.5, 0.0, 1.0], "all") == [(0, 1), (2, 0), (2, 1)]


def test_ties_give_no_pair():
    assert preference_pairs([1.0, 1.0, 0.0], "all") == [(0, 2), (1, 2)]
    assert preference_pairs([0.3, 0.3, 0.3, 0.3]) == []
    assert preference_pairs([2.0]) == []


def test_random_selection_is_a_seeded_subset_of_the_candidates():
    rewards = [0.0, 1.0, 2.0, 3.0]  # 6 candidates
    every = set(preference_pairs(rewards, "all"))
    drawn = preference_pairs(rewards, "random", 3, torch.Generator().manual_seed(0))
    assert len(drawn) == 3 == len(set(drawn)) and set(drawn) <= every
    assert drawn == preference_pairs(rewards, "random", 3, torch.Generator().manual_seed(0))
    assert set(preference_pairs(rewards, "random", None, torch.Generator().manual_seed(1))) == every
    with pytest.raises(ValueError, match="reward_gap, all, random"):
        preference_pairs(rewards, "best")


def test_joint_dpo_loss_sums_the_agents_log_ratios_inside_one_sigmoid():
    # two pairs of a two-agent team: m = (-1 + 3) + (-2 + 1) = 1 and (-4 + 4) + (-5 + 5) = 0
    winners = torch.tensor([[-1.0, -2.0], [-4.0, -5.0]], requires_grad=True)
    losers = torch.tensor([[-3.0, -1.0], [-4.0, -5.0]])
    loss = joint_dpo_loss(winners, losers, beta=0.5)
    # log(1 + e^-0.5) = log 1.6065307 = 0.4740770; a tie of log-probs: log 2
    assert loss.tolist() == pytest.approx([0.4740770, 0.6931472], rel=1e-6)
    loss.sum().backward()
    # d/d log pi_i(y_w) = -beta sigmoid(-beta m): -0.5 x 0.3775407 and -0.5 x 0.5, the same for both agents
    assert winners.grad.flatten().tolist() == pytest.approx([-0.1887703] * 2 + [-0.25] * 2, rel=1e-6)


def test_one_agent_is_dpo_and_the_reference_enters_as_eq_7():
    winners, losers = torch.tensor([[-1.0]]), torch.tensor([[-3.0]])
    # no reference: m = 2, beta 0.1: log(1 + e^-0.2) = 0.5981389
    assert float(joint_dpo_loss(winners, losers, 0.1)) == pytest.approx(0.5981389, rel=1e-6)
    # reference log-probs -2.5 and -3.5: m = 2 - 1 = 1: log(1 + e^-0.1) = 0.6443967
    ref_w, ref_l = torch.tensor([[-2.5]]), torch.tensor([[-3.5]])
    assert float(joint_dpo_loss(winners, losers, 0.1, ref_w, ref_l)) == pytest.approx(0.6443967, rel=1e-6)
    assert float(joint_log_ratios(winners, losers, ref_w, ref_l)) == pytest.approx(1.0)


def test_a_history_ranks_its_joint_actions_by_the_agents_mean_return():
    """Hand-made samples of one node, two agents, K = 3, per-agent returns: joint returns (1 + 0) / 2, (0 + 0) / 2,
    (1 + 1) / 2 = 0.5, 0, 1; the two largest gaps: (2, 1) then (0, 1) and (2, 0) (equal gaps of 0.5: index order)."""
    from collab.rollout.experience import Decision

    returns = {0: [1.0, 0.0, 1.0], 1: [0.0, 0.0, 1.0]}
    samples = [
        Decision(i, i, 0, [i], [10 * i + k], torch.zeros(1), returns=returns[i][k], group=i)
        for i in range(2)
        for k in range(3)
    ]
    pairs, nodes = node_pairs(samples, 2, "reward_gap", 2)
    assert nodes == 1
    assert [([d.completion_ids[0] for d in p.winners], [d.completion_ids[0] for d in p.losers]) for p in pairs] == [
        ([2, 12], [1, 11]),
        ([0, 10], [1, 11]),
    ]
    assert [p.gap for p in pairs] == [1.0, 0.5]
    assert isinstance(pairs[0], PreferencePair) and pairs[0].tokens == 8


@pytest.mark.parametrize(
    "option,value,message",
    [
        ("beta", 0.0, "model.beta must be > 0"),
        ("pairs_per_node", 0, "model.pairs_per_node must be >= 1 or null"),
        ("pair_selection", "best", "reward_gap, all, random"),
        ("num_generations", 1, "num_generations >= 2"),
    ],
)
def test_bad_options_end_in_one_line(option, value, message):
    with pytest.raises(UserError, match=message):
        from_config("madpo", base={"name": "tiny"}, **{option: value})
    with pytest.raises(UserError, match="pairs_per_node null"):
        from_config("madpo", base={"name": "tiny"}, pair_selection="all", pairs_per_node=2)


# -- (2) the library's rules: an oracle on 120 random trees -------------------------------------------------------
SEEDS = range(120)


def case(seed: int) -> dict:
    """A random aligned tree and MADPO's settings. Discrete rewards give ties (equal returns, equal gaps); K is 2 or 4
    below a node with children, so that the means of returns are exact in binary and a tie is one on both sides."""
    rng = random.Random(seed)
    horizon = rng.choice([1, 1, 2])
    selection = rng.choice(["reward_gap", "reward_gap", "all"])
    return dict(
        seed=seed,
        n=rng.choice([1, 2, 2, 3]),
        k=rng.randint(2, 6) if horizon == 1 else rng.choice([2, 4]),
        horizon=horizon,
        discrete=rng.random() < 0.6,
        selection=selection,
        limit=None if selection == "all" else rng.choice([None, 1, 2, 3]),
        beta=rng.choice([0.1, 0.5, rng.uniform(0.01, 2.0)]),
    )


def logprob(c: dict, key: tuple) -> float:
    """The sequence log-prob of agent i's j-th response at a path: (i, path, j) -> a number drawn from it."""
    return random.Random(zlib.crc32(repr(("logprob", c["seed"], key)).encode())).uniform(-30.0, -1.0)


def reference_pairs(c: dict) -> dict[tuple, list[tuple[int, int]]]:
    """Rules 1-2 at every history (path -> its (winner, loser) indices): returns through the tree (gamma 1)."""
    n, k, out = c["n"], c["k"], {}

    def node(path: tuple, turn: int) -> list[float]:
        actions = [tuple(f"a{i}s{j}" for i in range(n)) for j in range(k)]
        returns = [path_reward(c, path + (a,)) for a in actions]
        if turn < c["horizon"] - 1:
            returns = [r + sum(below) / len(below) for r, below in ((r, node(path + (a,), turn + 1)) for r, a in
                                                                    zip(returns, actions))]  # fmt: skip
        candidates = [(ri - rj, i, j) for i, ri in enumerate(returns) for j, rj in enumerate(returns) if ri - rj > 0]
        if c["selection"] == "reward_gap":
            candidates = sorted(candidates, key=lambda x: -x[0])
        if c["limit"] is not None:
            candidates = candidates[: c["limit"]]
        out[path] = [(i, j) for _, i, j in candidates]
        return returns

    node((), 0)
    return out


def reference_update(c: dict, pairs: list[tuple]) -> tuple[float, dict[tuple, float]]:
    """Rules 3-4 on the pairs (path, winner, loser) as one batch: the logged loss (the mean of -log sigmoid of beta
    times the joint delta) and each agent's gradient of its own loss with respect to its log-probs."""
    leaves: dict[tuple, torch.Tensor] = {}

    def lp(key):
        return leaves.setdefault(key, torch.tensor(logprob(c, key), dtype=torch.float64, requires_grad=True))

    deltas = [
        [float(lp((a, p, w)).detach()) - float(lp((a, p, lo)).detach()) for a in range(c["n"])] for p, w, lo in pairs
    ]
    logged = sum(-F.logsigmoid(torch.tensor(c["beta"] * sum(d), dtype=torch.float64)).item() for d in deltas)
    for a in range(c["n"]):
        losses = []
        for (p, w, lo), row in zip(pairs, deltas):
            own = lp((a, p, w)) - lp((a, p, lo))
            losses.append(-F.logsigmoid(c["beta"] * (own + (sum(row) - row[a]))))
        torch.stack(losses).mean().backward()  # agent a's parameters are its own log-probs: others' stay unused
    return logged / len(pairs), {key: float(t.grad) for key, t in leaves.items() if t.grad is not None}


def collab_update(c: dict) -> tuple[dict[tuple, list[tuple[int, int]]], float | None, dict[tuple, float]]:
    """collab's pairs (from MAGRPO's tree and :func:`node_pairs`), loss and gradients on the same log-probs."""
    team, env = ScriptedTeam(responder()), RandomTreeEnv({**c, "gamma": 1.0, "joint_mode": "aligned"})
    samples = tree_batch(team, env, env.tasks("train"), c["k"], 1.0, "aligned").items

    def key(s):
        feedback = [m["content"] for m in team.prompts[s.prompt_ids[0]] if m["role"] == "user"][1:]
        return s.agent, tuple(tuple(json.loads(f)) for f in feedback), int(s.text.split("s")[-1])

    pairs, _ = node_pairs(samples, c["n"], c["selection"], c["limit"])
    by_node: dict[tuple, list[tuple[int, int]]] = {}
    for pair in pairs:
        keys = [key(s) for s in pair.winners + pair.losers]
        assert [k[0] for k in keys] == list(range(c["n"])) * 2 and len({k[1] for k in keys}) == 1
        assert len({k[2] for k in keys[: c["n"]]}) == 1 == len({k[2] for k in keys[c["n"] :]})
        by_node.setdefault(keys[0][1], []).append((keys[0][2], keys[-1][2]))
    if not pairs:
        return by_node, None, {}
    leaves = {key(s): torch.tensor(logprob(c, key(s)), dtype=torch.float64, requires_grad=True) for s in samples}
    winners = torch.stack([torch.stack([leaves[key(s)] for s in p.winners]) for p in pairs])
    losers = torch.stack([torch.stack([leaves[key(s)] for s in p.losers]) for p in pairs])
    loss = joint_dpo_loss(winners, losers, c["beta"]).mean()
    loss.backward()
    return by_node, float(loss.detach()), {k: float(t.grad) for k, t in leaves.items() if t.grad is not None}


def test_pairs_loss_and_per_agent_gradients_equal_the_reference_rules():
    """In every case: the same pairs at every history, in the same order; the same loss; and every agent's gradient
    with respect to each of its responses' log-probs equal to the library's (its own loss, the others' held)."""
    for seed in SEEDS:
        c = case(seed)
        theirs = reference_pairs(c)
        ours, loss, grads = collab_update(c)
        assert ours == {path: p for path, p in theirs.items() if p}, (seed, c)
        flat = [(path, w, lo) for path, p in ours.items() for w, lo in p]
        if not flat:
            assert loss is None
            continue
        ref_loss, ref_grads = reference_update(c, flat)
        assert loss == pytest.approx(ref_loss, rel=1e-9), (seed, c)
        assert grads.keys() >= ref_grads.keys(), (seed, c)
        scale = max(abs(g) for g in ref_grads.values())
        for k, g in grads.items():
            assert abs(g - ref_grads.get(k, 0.0)) <= 1e-9 * scale, (seed, c, k)


def test_the_cases_cover_ties_teams_and_turns():
    cases = [case(s) for s in SEEDS]
    assert {c["n"] for c in cases} == {1, 2, 3} and {c["horizon"] for c in cases} == {1, 2}
    assert {c["selection"] for c in cases} == {"reward_gap", "all"} and {c["limit"] for c in cases} == {None, 1, 2, 3}
    tied = sum(any(len(p) < c["k"] * (c["k"] - 1) // 2 for p in reference_pairs(c).values()) for c in cases
               if c["limit"] is None)  # fmt: skip
    no_pair = sum(any(not p for p in reference_pairs(c).values()) for c in cases)
    assert tied >= 20 and no_pair >= 10, (tied, no_pair)


def test_through_the_model_each_agent_gets_the_librarys_per_agent_gradient(one_thread):
    """On the tiny model's rollout of a two-turn game: the gradient of MADPO's one loss on each agent's adapter equals
    the gradient of the library's loss for that agent, its own log-ratios live and the other agent's held constant."""
    from tests.algos.test_known_optimum import make
    from tests.support import EarlySolveEnv

    env = EarlySolveEnv(n_agents=2, horizon=2)
    torch.manual_seed(0)
    module = make("madpo", seed=0)
    module.build(env)
    module.beta = 0.5
    torch.manual_seed(0)
    batch = module.prepare(module.rollout(env.tasks("train") * 2))
    pairs, scale = batch.items, module.normalizers(batch.items, batch, 0)
    assert len(pairs) >= 3
    groups = module.param_groups()
    module.loss(pairs, scale)[0].backward()
    ours = [[p.grad.clone() for p in g["params"]] for g in groups]
    module.zero_grad(set_to_none=True)

    def delta(a: int, pair) -> torch.Tensor:
        w, lo = pair.winners[a], pair.losers[a]
        lw, ll = module.team.logprobs(w.member, [w.prompt_ids, lo.prompt_ids], [w.completion_ids, lo.completion_ids])
        return lw.sum() - ll.sum()

    with torch.no_grad():
        held = [[float(delta(a, p)) for a in range(2)] for p in pairs]
    for a in range(2):
        losses = [-F.logsigmoid(module.beta * (delta(a, p) + row[1 - a])) for p, row in zip(pairs, held)]
        torch.stack(losses).mean().backward()
        theirs = [p.grad for p in groups[a]["params"]]
        assert any(g.abs().sum() > 0 for g in theirs)
        for x, y in zip(ours[a], theirs):  # float32 sums in another order: noise relative to the tensor's scale
            assert torch.allclose(x, y, atol=1e-5 * float(y.abs().max()) + 1e-12, rtol=1e-5)
        module.zero_grad(set_to_none=True)
