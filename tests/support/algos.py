"""Each algorithm's settings in the tests that run every algorithm, one row per ``--algo`` name of
``collab.algos.algo_registry()``: the per-algorithm tests take their list of algorithms from the registry and
their settings from here, so that a new algorithm's row is what puts it in all of them
(``tests/algos/test_registry.py`` checks that every registered algorithm has one)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import collab.algos
from tests.support import SAMPLE_THE_POLICY_ARGS

MATRIX = ["--data.env", "matrix", "--data.env_options", "{}"]


@dataclass(frozen=True)
class AlgoTests:
    ddp: list[str]
    """The env and options of its 2-process run on the tiny model (tests/training/test_ddp.py); the rows together
    cover every env of src/collab/envs."""
    eval_tasks: int
    """The eval tasks of that run's held-out evaluation: fewer than the 2 processes, or not divisible into 2
    processes x batches of 2 tasks, in some rows."""
    resume: Callable[[Path], list[str]]
    """What its resume test plays (tests/training/test_resume.py), given the test's folder."""
    team: list[tuple[float | None, int]]
    """Its default run's agents, (lr, max_new_tokens) each (tests/config/test_agent_defaults.py and test_pairs.py)."""
    terms: int
    """Terms per micro-batch of a 2-agent team (tests/algos/test_skeleton.py): one (one forward gives the loss), or
    each critic's and each agent's actor term."""
    micro_batches: bool = True
    """Whether tests/algos/test_skeleton.py checks its micro-batches (else its own test file does)."""
    launcher: str = "lightning"
    """How the 2 processes of its DDP run start: Lightning's launcher, or as a cluster would (``torchrun``, ``srun``:
    docs/distributed.md's launches)."""
    strategy: str = "ddp"
    """The strategy of its DDP run (``fsdp``: collab's FSDP2, every model of the team sharded: collab.training.fsdp)."""
    debate: tuple[str, ...] = ()
    """Its options on top of tests/algos/test_one_env_for_all.py's debate of 4 agents."""
    agent_per_turn: bool = False
    """Whether its default trains an adapter per (turn, agent): its checkpoint lists every agent once a turn."""


def seven(folder: Path) -> str:
    """The debate of tests/algos/test_maporl.py: the answer is the one token "7"; agents choose between 7 and 3."""
    path = folder / "seven.json"
    path.write_text(json.dumps([{"problem": f"Question {i}: say 7.", "answer": "7"} for i in range(4)]))
    return str(path)


def eval_every_step(folder: Path) -> str:
    """Callbacks with a sampled (not greedy, not seeded) evaluation after every step: it draws from the
    training's random stream between rollouts, and a resumed run must still repeat the straight one."""
    path = folder / "eval_every_step.yaml"
    path.write_text("""trainer:
  callbacks:
    - class_path: collab.training.callbacks.ModelCheckpoint
      init_args: {save_last: true, every_n_train_steps: 5}
    - class_path: collab.training.callbacks.AdapterCheckpoint
    - class_path: collab.training.callbacks.RewardSummary
    - class_path: collab.training.callbacks.EvaluationCallback
      init_args: {every_n_steps: 1, num_samples: 2, ks: [1], max_tasks: 2}
""")
    return str(path)


DUO = [(1e-4, 32), (3e-4, 24)]
"""The math env's duo team (the Reasoner, the Actor) of most defaults."""

# The resume runs play the matrix game (MARFT: two turns, critic warm-up and round-robin agents; MARFT-T and IPPO:
# two updates per rollout) and the MAPoRL debate with a per-turn adapter and value head for every (turn, agent). A
# team given there samples from the policy itself (temperature 1, no top-p). The DDP runs: see test_ddp.py.
ALGO_TESTS: dict[str, AlgoTests] = {
    "magrpo": AlgoTests(
        # a team of one (search_qa's solo agent) searching the shipped corpus over 2 turns
        ddp=["--data.env", "search_qa", "--data.env_options", "{team: solo}", "--data.num_turns", "2"],
        eval_tasks=3,
        launcher="torchrun",
        resume=lambda tmp: [*MATRIX, "--config", eval_every_step(tmp)],
        team=DUO,
        terms=1,
        # its tree at K = 4 is 20 joint actions a task (4 + 16 over the 2 turns); at 2, 6
        debate=("--model.num_generations", "2"),
    ),
    "madpo": AlgoTests(
        # a grid game (2 of its turns) whose eval split holds 1 puzzle: rank 1 scores none
        ddp=[
            "--data.env",
            "sudoku",
            "--data.env_options",
            "{num_train: 8, num_eval: 1, max_new_tokens: 16}",
            "--data.num_turns",
            "2",
        ],
        eval_tasks=1,
        resume=lambda tmp: [*MATRIX],
        team=DUO,
        terms=1,
        debate=("--model.num_generations", "2"),
    ),
    "marlhf": AlgoTests(
        # a grid game (2 of its turns, K = 2): the reward model's pairs at every history of a 2-turn tree
        ddp=[
            "--data.env",
            "sokoban",
            "--data.env_options",
            "{num_train: 8, num_eval: 3, max_new_tokens: 16}",
            "--data.num_turns",
            "2",
            "--model.num_generations",
            "2",
        ],
        eval_tasks=3,
        # one rollout fits the reward model, the next ones train the team on its scores
        resume=lambda tmp: [*MATRIX, "--model.reward_rollouts", "1"],
        team=DUO,
        terms=1,
        debate=("--model.num_generations", "2"),
    ),
    "at_grpo": AlgoTests(
        # a grid game (2 of its turns): its tool agent's programs run in the sandbox on both ranks
        ddp=[
            "--data.env",
            "plan_path",
            "--data.env_options",
            "{num_train: 8, num_eval: 3, max_new_tokens: 16}",
            "--data.num_turns",
            "2",
        ],
        eval_tasks=3,
        resume=lambda tmp: [*MATRIX, "--data.num_turns", "2"],
        team=DUO,
        terms=1,
        debate=("--model.num_generations", "2"),
    ),
    "collm_cc": AlgoTests(
        ddp=["--data.env", "writing"],
        eval_tasks=3,
        launcher="srun",
        strategy="fsdp",
        resume=lambda tmp: [*MATRIX, "--data.num_turns", "2"],
        team=DUO,
        terms=1 + 2,
    ),
    "collm_dc": AlgoTests(
        ddp=["--data.env", "minecraft", "--data.num_turns", "2"],  # 2 of the 4 turns: the world carried over
        eval_tasks=4,
        resume=lambda tmp: [*MATRIX],
        team=DUO,
        terms=2 + 2,
    ),
    "ippo": AlgoTests(
        ddp=["--data.env", "matrix"],
        eval_tasks=1,
        resume=lambda tmp: [*MATRIX, "--data.num_turns", "2", "--model.ppo.num_epochs", "2"],
        team=DUO,
        terms=2 + 2,
    ),
    "marft_a": AlgoTests(
        ddp=["--data.env", "competitive_coding"],
        eval_tasks=3,
        resume=lambda tmp: [
            *MATRIX,
            "--data.num_turns",
            "2",
            "--model.agents",
            "null",
            *SAMPLE_THE_POLICY_ARGS,
            "--model.critic_warmup",
            "1",
            "--model.agent_schedule",
            "round_robin",
        ],
        team=[(1e-4, 32), (1e-3, 24)],
        terms=1 + 2,
    ),
    "marft_t": AlgoTests(
        ddp=["--data.env", "coding"],
        eval_tasks=3,
        resume=lambda tmp: [*MATRIX, "--model.agents", "null", *SAMPLE_THE_POLICY_ARGS, "--model.ppo.num_epochs", "2"],
        team=DUO,
        terms=1 + 2,
    ),
    "maporl": AlgoTests(
        # the default's members: one adapter per (turn, agent), the turn-1 ones frozen (train_from_turn 2)
        ddp=["--data.env", "debate", "--data.env_options", "{dataset: addition, agents: 2}", "--data.num_turns", "2"],
        eval_tasks=5,
        resume=lambda tmp: [
            "--data.env_options",
            json.dumps(
                {
                    "dataset": seven(tmp),
                    "agents": 2,
                    "train_split": "0:4",
                    "eval_split": "0:4",
                    "stop_on_consensus": False,
                }
            ),
            "--model.agents",
            '[{choices: ["7", "3"]}, {choices: ["7", "3"]}]',
            *SAMPLE_THE_POLICY_ARGS,
            "--model.per_turn",
            "true",
            "--data.batch_size",
            "2",
        ],
        team=[(None, 32), (None, 32)],
        terms=1,
        micro_batches=False,  # tests/algos/test_maporl.py
        agent_per_turn=True,
    ),
}


def algos() -> list[str]:
    """The registered ``--algo`` names, sorted: every per-algorithm test's parameter list."""
    return sorted(collab.algos.algo_registry())


def settings(algo: str) -> AlgoTests:
    """``algo``'s row; an algorithm without one fails the test that asks, naming it."""
    if algo not in ALGO_TESTS:
        raise KeyError(f"--algo {algo} is registered but has no test settings: add its row to tests/support/algos.py")
    return ALGO_TESTS[algo]
