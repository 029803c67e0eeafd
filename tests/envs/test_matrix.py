"""The matrix game of MAGRPO appendix A, and the Dec-POMDP vs POSG learning claim."""

import lightning as L
import pytest
import torch

from collab.algos import data_from_config, from_config
from collab.envs import make_env
from collab.envs.matrix.env import parse_choice, utilities
from collab.errors import UserError
from collab.policy.models import BaseConfig
from tests.support import SAMPLE_THE_POLICY, prob_of_first_option, quiet_fit


@pytest.mark.parametrize(
    "text,choice", [("A", 0), ("B", 1), ("I pick B.", 1), ("Answer: A", 0), ("ABBA", None), ("", None)]
)
def test_parse_choice(text, choice):
    assert parse_choice(text) == choice


def test_payoff_tables():
    assert utilities("table1", [0, 0], -1) == (10, 10)
    assert utilities("table1", [0, 1], -1) == (7, 7)
    assert utilities("table2a", [1, 0], -1) == (4, 3)
    assert utilities("table2b", [0, 1], -1) == (1, 6)
    assert utilities("table2b", [1, 1], -1) == (0, 0)


def test_unparseable_answer_gets_the_penalty():
    # agent 2 unparseable: it scores the penalty; agent 1's A is valued at its worst case, min(5, 1) = 1
    assert utilities("table2b", [0, None], -1.0) == (1, -1.0)
    env = make_env("matrix", preset="table1", constrained=False, invalid_penalty=-3.0)
    state = env.reset(env.tasks("train")[0])
    step = env.step(state, ["A", "no idea"])
    assert step.rewards == (-3.0, -3.0) and step.info["invalid"] == 1.0


def test_joint_and_individual_rewards():
    t1 = make_env("matrix", preset="table1")
    s = t1.reset(t1.tasks("train")[0])
    assert t1.step(s, ["A", "B"]).rewards == (7.0, 7.0)
    t2b = make_env("matrix", preset="table2b")
    assert not t2b.joint_reward
    assert t2b.step(t2b.reset({}), ["A", "B"]).rewards == (1.0, 6.0)
    team = make_env("matrix", preset="table2b", team_reward=True)
    assert team.step(team.reset({}), ["A", "B"]).rewards == (7.0, 7.0)


def test_unknown_preset():
    with pytest.raises(UserError, match="valid: table1, table2a, table2b"):
        make_env("matrix", preset="table3")


def train_matrix(preset: str, seed: int, steps: int = 10, players: int = 2) -> list[float]:
    """MAGRPO with the tiny model: 4 episodes x K=4 per rollout, one update each, lr 1e-2. 10 updates settle both
    games on seeds 0-9: Table 1 at (A, A) on every seed, Table 2b on none, as after 15 and 20 (docs/measurements.md)."""
    L.seed_everything(seed, verbose=False)
    options = {"preset": preset, **({"players": players} if players != 2 else {})}
    dm = data_from_config("magrpo", env="matrix", env_options=options, batch_size=4, seed=seed)
    module = from_config(
        "magrpo",
        agents=None,
        agent_defaults=SAMPLE_THE_POLICY,
        base=BaseConfig(name="tiny", seed=seed),
        agent_lr=1e-2,
        num_generations=4,
        ppo={"num_epochs": 1},
        log_kl_every=0,
    )
    quiet_fit(module, dm, steps)
    return prob_of_first_option(module, dm.env)


def test_magrpo_reaches_the_joint_optimum_under_the_joint_reward():
    """Table 1 (Dec-POMDP): both agents end up preferring A, the joint optimum (utility 10)."""
    probs = [train_matrix("table1", seed) for seed in range(3)]
    at_optimum = [all(p > 0.5 for p in ps) for ps in probs]
    assert sum(at_optimum) >= 2, probs


def test_a_team_of_four_reaches_the_joint_optimum_of_table_1_for_four_players():
    """Table 1 for 4 players (10 when all pick A): the four agents, four adapters on one base, all come to prefer A."""
    assert all(p > 0.5 for p in train_matrix("table1", 0, players=4))


def test_table_1_for_n_players_and_its_two_player_case():
    assert utilities("table1", [0, 0, 0, 0], -1) == (10,) * 4
    assert utilities("table1", [0, 1, 1], -1) == (7,) * 3
    assert utilities("table1", [1, 1, 1], -1) == (0,) * 3
    assert utilities("table1", [1, None, 0], -2) == (0, -2, 7)  # the valid ones at their worst case, as for two
    four = make_env("matrix", players=4)
    assert [r.name for r in four.roles] == ["player1", "player2", "player3", "player4"]
    step = four.step(four.reset({}), ["A", "A", "A", "A"])
    assert step.rewards == (10.0,) * 4 and step.info["optimum"] == 1.0
    assert make_env("matrix").roles[0].system_prompt == make_env("matrix", players=2).roles[0].system_prompt
    with pytest.raises(UserError, match=r"^matrix preset table2b is a two-player table; 3 players play table1"):
        make_env("matrix", preset="table2b", players=3)
    with pytest.raises(UserError, match=r"^matrix players must be an integer >= 2, got 1$"):
        make_env("matrix", players=1)


def test_independent_learners_miss_the_joint_optimum_in_table_2b():
    """Table 2b (POSG, per-agent rewards): (A, A) is not an equilibrium, so independent learners leave it."""
    probs = [train_matrix("table2b", seed) for seed in range(3)]
    at_optimum = [all(p > 0.5 for p in ps) for ps in probs]
    assert sum(at_optimum) <= 1, probs


def test_a_rollout_without_signal_still_counts_toward_max_steps():
    """Greedy agents always agree, so every advantage is zero; the run must still end at max_steps."""
    from collab.policy.team import AgentSpec, SamplingSpec

    L.seed_everything(0, verbose=False)
    dm = data_from_config("magrpo", env="matrix", batch_size=1)
    greedy = [AgentSpec(sampling=SamplingSpec(temperature=0.0)) for _ in range(2)]
    module = from_config("magrpo", base=BaseConfig(name="tiny"), agents=greedy, num_generations=2, log_kl_every=0)
    before = None
    trainer = quiet_fit(module, dm, 3)
    assert trainer.global_step == 3 and module.rollouts == 3
    before = from_config("magrpo", base=BaseConfig(name="tiny"), agents=greedy, num_generations=2)
    before.build(dm.env)
    for (name, p), (_, q) in zip(module.team.named_parameters(), before.team.named_parameters()):
        if "lora_B" in name:
            assert torch.equal(p, q), name  # no update moved anything


def test_single_agent_grpo_learns_the_rewarded_option():
    """n = 1 is single-agent GRPO: one agent, reward 1 for A and 0 for B, learns to prefer A."""
    from tests.support import CountingEnv

    L.seed_everything(0, verbose=False)
    dm = data_from_config("magrpo", env="matrix", batch_size=4)
    dm.env = CountingEnv(1, 1)
    dm.stream.tasks = list(dm.env.tasks("train"))
    module = from_config(
        "magrpo",
        agents=None,
        agent_defaults=SAMPLE_THE_POLICY,
        base=BaseConfig(name="tiny"),
        agent_lr=1e-2,
        num_generations=4,
        ppo={"num_epochs": 1},
        log_kl_every=0,
    )
    quiet_fit(module, dm, 20)
    assert len(module.team) == 1
    assert prob_of_first_option(module, dm.env)[0] > 0.8
