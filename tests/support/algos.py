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
WRITING = ["--data.env", "writing"]
DEBATE = "{dataset: addition, agents: 2}"
MAPORL_DEBATE = ["--data.env", "debate", "--data.env_options", DEBATE, "--data.num_turns", "2"]

# The teams under fsdp (tests/training/test_fsdp.py): a full agent and a LoRA agent on one base are two sharded models,
# the full agent's own copy and the LoRA agents' shared base.
SHARDED_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 6}
FULL = {"finetune": "full", "lr": 1e-4, "sampling": SHARDED_SAMPLING}
LORA = {"sampling": SHARDED_SAMPLING}


def team(*agents: dict) -> list[str]:
    return ["--model.agents", json.dumps(list(agents))]


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
    fsdp: dict[str, list[str]]
    """Its teams under fsdp (tests/training/test_fsdp.py: the first step of 2 sharded processes against one
    process's), each named by its agents, with their env and options."""
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
        fsdp={
            "full+lora": [*team(FULL, LORA), *WRITING],
            # micro-batches holding both agents' samples: its term split into one per model
            "full+full": [*team(FULL, FULL), *WRITING],
        },
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
        # pairs of joint actions ranked by the team's return; its one pass uses every model
        fsdp={"full+lora": [*team(FULL, LORA), *WRITING]},
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
        # the first step fits the reward model (a LoRA adapter and a head on the LoRA agent's base), the second trains
        # the team on its scores
        fsdp={
            "full+lora": [
                *team(FULL, LORA),
                *WRITING,
                "--model.reward_rollouts",
                "1",
                "--model.num_generations",
                "2",
            ]
        },
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
        # groups by task, turn and agent of its tree rollout (K candidates each)
        fsdp={"full+lora": [*team(FULL, LORA), *WRITING]},
        debate=("--model.num_generations", "2"),
    ),
    "collm_cc": AlgoTests(
        ddp=WRITING,
        eval_tasks=3,
        launcher="srun",
        strategy="fsdp",
        resume=lambda tmp: [*MATRIX, "--data.num_turns", "2"],
        team=DUO,
        terms=1 + 2,
        # the critic reads agent 0, a full agent: a base of its own (with the critic's LoRA), a third sharded model
        fsdp={"full+full": [*team(FULL, FULL), *WRITING]},
    ),
    "collm_dc": AlgoTests(
        ddp=["--data.env", "minecraft", "--data.num_turns", "2"],  # 2 of the 4 turns: the world carried over
        eval_tasks=4,
        resume=lambda tmp: [*MATRIX],
        team=DUO,
        terms=2 + 2,
        # a critic per agent, both adapters on the LoRA agent's base (a full agent's critic reads its untrained base:
        # the one the LoRA agents share)
        fsdp={"full+lora": [*team(FULL, LORA), *WRITING]},
    ),
    "ippo": AlgoTests(
        ddp=["--data.env", "matrix"],
        eval_tasks=1,
        resume=lambda tmp: [*MATRIX, "--data.num_turns", "2", "--model.ppo.num_epochs", "2"],
        team=DUO,
        terms=2 + 2,
        # an LLM critic per agent; with two full agents both critics' adapters are on one base of their own: three
        # sharded models
        fsdp={"full+full": [*team(FULL, FULL), *WRITING]},
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
        # a central MLP critic head on the frozen base: agent 0's untrained one, the LoRA agent's (sharded), with its
        # adapters off
        fsdp={"full+lora": [*team(FULL, LORA), *WRITING]},
    ),
    "marft_t": AlgoTests(
        ddp=["--data.env", "coding"],
        eval_tasks=3,
        resume=lambda tmp: [*MATRIX, "--model.agents", "null", *SAMPLE_THE_POLICY_ARGS, "--model.ppo.num_epochs", "2"],
        team=DUO,
        terms=1 + 2,
        # a token-level MLP critic on the frozen base (the LoRA agent's); agent 0 calls the calculator inside its turn
        # (16 tokens a reply: 11 of the call, room after its result) and its replies go on in a second round
        fsdp={
            "full+lora+tools": [
                *team({**FULL, "sampling": {**SHARDED_SAMPLING, "max_new_tokens": 16}}, LORA),
                "--data.env",
                "math",
                "--data.env_options",
                "{dataset: small_addition, profile: duo, tools: {0: [calculator]}, tool_choice: {0: calculator}}",
            ]
        },
    ),
    "maporl": AlgoTests(
        # the default's members: one adapter per (turn, agent), the turn-1 ones frozen (train_from_turn 2)
        ddp=MAPORL_DEBATE,
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
        # per-agent value heads, a 2-turn debate; with a full agent under a norm bound below the first step's gradient
        # norm (clipping scales every gradient)
        fsdp={
            "lora": [*team(LORA, LORA), *MAPORL_DEBATE],
            "full+lora": [*team(FULL, LORA), *MAPORL_DEBATE, "--model.max_grad_norm", "1e-3"],
        },
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
