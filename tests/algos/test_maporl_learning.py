"""Known-optimum learning test of MAPoRL: a debate in which agreeing on the right answer at turn 1 is
optimal, with the early stop on consensus valued as an absorbing state.

The debate: two agents, two turns, one question whose answer is "7"; each agent answers with one token, "7" or "3"
(a closed action vocabulary), and the debate stops when both give the same answer (``stop_on_consensus``). The
verifier gives 1 to the right answer and 0.8 to the wrong one (partial credit, as a learned verifier might), and
Definition 1 uses gamma = 0.5. Rewards of a turn-1 answer (m: the agents' mean score at turn 2, in [0.8, 1]):

    turn-1 answers     absorbing (collab)                    skipped turns ignored (scored as missing/0)
    7, 7  (stop)       1                                     1 / 1.5 = 0.667
    3, 3  (stop)       (0.8 + 0.5 * 0.8) / 1.5 = 0.8          0.8 / 1.5 = 0.533
    7, 3               7: (1 + 0.5 m) / 1.5 in [0.93, 1]     the same
                       3: (0.8 + 0.5 m) / 1.5 in [0.8, 0.87]

With the absorbing end, "7" beats "3" by 2/15 or more whatever the other agent says: answering right at once is
the optimum, and a right answer reached only at turn 2 is worth less. With the skipped turn ignored, answering
"3" when the other says "7" would be better (0.8 or more against 0.667): the test would fail
(``test_the_known_optimum_needs_the_absorbing_end`` checks these numbers). With this test's settings (40 updates)
both agents end with P(7) at turn 1 above 0.9 on seeds 0-2; with the skipped turn scored 0, one agent ends below
0.5 on each of them (per-seed figures: docs/measurements.md).

The agents sample at temperature 0.5: the tiny random model's final RMSNorm caps its logit gap between "7" and
"3" at about 1.76, i.e. P(7) <= 0.85 at temperature 1, 0.97 at 0.5.
"""

import json

import lightning as L
import pytest
import torch

from collab.algos import from_config
from collab.envs.debate.env import DebateEnv
from collab.envs.debate.verifier import Verifier
from collab.objectives import debate_rewards, episode_rewards, majority_of_others_table
from collab.policy.models import BaseConfig
from collab.policy.team import AgentSpec, SamplingSpec
from tests.support import datamodule_for, quiet_fit

GAMMA, PARTIAL = 0.5, 0.8


class PartialCredit(Verifier):
    """1 for the right answer (7), 0.8 for any other."""

    def score(self, tasks, texts):
        return [1.0 if text.strip() == str(task["answer"]) else PARTIAL for task, text in zip(tasks, texts)]


@pytest.fixture
def seven(tmp_path):
    path = tmp_path / "seven.json"
    path.write_text(json.dumps([{"problem": "Say 7.", "answer": "7"}]))
    return str(path)


def debate(path) -> DebateEnv:
    return DebateEnv(
        dataset=path,
        agents=2,
        horizon=2,
        train_split="[0:1]",
        eval_split="[0:1]",
        verifier=PartialCredit(),
        stop_on_consensus=True,
    )


def p_right_at_turn_1(module, env) -> list[float]:
    """Each agent's probability of answering 7 at turn 1 (its policy: restricted to 7/3, at its temperature)."""
    state = env.reset(env.tasks("train")[0])
    out = []
    with torch.no_grad():
        for a in range(env.n_agents):
            member = module.team.acting(0, a)
            prompt = module.team.encode(member, state.histories[a])
            seven_id = [int(module.team.choice_ids[member][0])]
            out.append(float(module.team.logprobs(member, [prompt], [seven_id])[0].sum().exp()))
    return out


def test_the_known_optimum_needs_the_absorbing_end():
    """The module docstring's table, from the reward functions: against a partner who says 7, saying 7 is best only
    when the stopped debate is extended (the absorbing end); scored on the played turn alone, 3 would be."""
    right, wrong = ("7", True, 1.0), ("3", False, PARTIAL)

    def turn_1_reward(first, second=None, agent=0):
        rows = [first] + ([second] if second else [])
        scores = torch.tensor([[s for _, _, s in row] for row in rows])
        answers, correct = [tuple(a for a, _, _ in row) for row in rows], [tuple(c for _, c, _ in row) for row in rows]
        absorbing = float(episode_rewards(scores, answers, correct, 2 - len(rows), GAMMA)[0, agent])
        padded = torch.cat([scores, torch.zeros(2 - len(rows), 2)])  # the skipped turn scored 0
        ignored = float(
            debate_rewards(
                padded,
                torch.tensor(correct + [(False, False)] * (2 - len(rows))),
                majority_of_others_table(
                    answers + [(None, None)] * (2 - len(rows)), correct + [(False, False)] * (2 - len(rows))
                ),
                GAMMA,
            )[0, agent]
        )
        return absorbing, ignored

    both_right = turn_1_reward((right, right))
    assert both_right == pytest.approx((1.0, 1 / 1.5), rel=1e-6)
    for turn_2 in [(right, right), (right, wrong), (wrong, wrong)]:  # m = 1, 0.9, 0.8
        deviate = turn_1_reward((wrong, right), turn_2)  # agent 1 says 3 while agent 2 says 7
        assert deviate[0] == deviate[1] < both_right[0]  # absorbing: saying 7 is better
        assert deviate[1] > both_right[1]  # skipped turn ignored: saying 3 would be better
    assert turn_1_reward((wrong, wrong)) == pytest.approx((0.8, 0.8 / 1.5), rel=1e-6)


def test_maporl_learns_to_agree_on_the_right_answer_at_turn_1(seven, one_thread):
    """Per-(turn, agent) adapters, 8 debates per rollout, 2 PPO epochs: P(7 at turn 1) rises from about 1/2 to
    above 0.9 for both agents (seed 0)."""
    L.seed_everything(0, verbose=False)
    env = debate(seven)
    agents = [AgentSpec(choices=["7", "3"], sampling=SamplingSpec(temperature=0.5, top_p=1.0)) for _ in range(2)]
    module = from_config(
        "maporl",
        base=BaseConfig(name="tiny", device="cpu", seed=0),
        agents=agents,
        ppo={"gamma": GAMMA, "num_epochs": 2},
        per_turn=True,
        train_from_turn=1,
        agent_lr=2e-2,
        kl_coef=0.0,
        value_head={"hidden": [32], "lr": 1e-2},
    )
    module.build(env)
    before = p_right_at_turn_1(module, env)
    assert all(0.3 < p < 0.7 for p in before), before  # the start is a coin flip: the rise below is learned
    quiet_fit(module, datamodule_for(env, batch_size=8, seed=0), 40)
    after = p_right_at_turn_1(module, env)
    assert all(p > 0.9 for p in after), (before, after)
