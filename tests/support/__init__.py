"""Helpers shared by several test modules (fixtures stay in ``tests/conftest.py``): small environments, a scripted
team, quiet training loops, and the command-line fit and checkpoint readers of the resume tests."""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
import torch

from collab.algos import data_from_config
from collab.envs.base import AgentRole, Env, Score

TINY_CLI = [
    "--model.base.name",
    "tiny",
    "--trainer.accelerator",
    "cpu",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
]
"""``collab.fit`` arguments of a quiet run on the tiny model and the CPU."""

SAMPLE_THE_POLICY = {"sampling": {"temperature": 1.0, "top_p": 1.0}}
"""``agent_defaults`` of the learning tests whose probabilities are the policy's own: every agent samples from the
softmax it trains (conf/base.yaml's temperature 0.7 and top-p 0.9 would sharpen and truncate it)."""
SAMPLE_THE_POLICY_ARGS = [
    "--model.agent_defaults.sampling.temperature",
    "1.0",
    "--model.agent_defaults.sampling.top_p",
    "1.0",
]
"""The same on ``collab.fit``'s command line: the runs of a few steps whose matrix-game or one-token agents must
disagree within a group for an update to move anything (their draws are the policy's own)."""


class TwoTurnEnv(Env):
    """Two agents pick A or B on each of ``horizon`` turns; each sees only its own prompts.

    Agent i's first prompt is "Player i: pick A or B." and its feedback "Player i, turn t is over;
    pick again.", so a history names its owner. ``reward(turn, choices)`` gets every joint choice so
    far (a tuple of (a_1, a_2) per turn) and returns the joint reward of the turn just played; the
    default pays the fraction of A's of that turn.
    """

    name = "two-turn"

    def __init__(self, reward=None, horizon: int = 2, reward_max: float = 1.0) -> None:
        super().__init__(horizon)
        self.reward = reward or (lambda turn, choices: sum(c == "A" for c in choices[-1]) / 2)
        self.reward_max = reward_max
        self.roles = tuple(
            AgentRole(f"p{i + 1}", f"You are player {i + 1}.", max_new_tokens=1, choices=("A", "B")) for i in range(2)
        )

    def tasks(self, split):
        return [{"id": 0}]

    def observe(self, task):
        return [f"Player {i + 1}: pick A or B." for i in range(self.n_agents)]

    def score(self, state, actions):
        choices = tuple(state.memory.get("choices", ())) + (tuple(actions),)
        r = float(self.reward(state.turn, choices))
        return Score((r,) * self.n_agents, memory={"choices": choices})

    def feedback(self, state, actions, score):
        return [f"Player {i + 1}, turn {state.turn + 1} is over; pick again." for i in range(self.n_agents)]


class CountingEnv(Env):
    """n agents answering A or B for H turns; reward = number of A's (never terminates early)."""

    name = "counting"

    def __init__(self, n_agents: int, horizon: int) -> None:
        super().__init__(horizon)
        self.roles = tuple(AgentRole(f"a{i}", max_new_tokens=1, choices=("A", "B")) for i in range(n_agents))

    def tasks(self, split):
        return [{"id": 0}]

    def observe(self, task):
        return ["Pick A or B."] * self.n_agents

    def score(self, state, actions):
        r = float(sum(a == "A" for a in actions))
        return Score((r,) * self.n_agents)


def prob_of_first_option(module, env) -> list[float]:
    state = env.reset(env.tasks("train")[0])
    out = []
    for i in range(env.n_agents):
        prompt = module.team.encode(i, state.histories[i])
        first = [int(module.team.choice_ids[i][0])]
        out.append(float(module.team.logprobs(i, [prompt], [first])[0].detach().sum().exp()))
    return out


def train(
    module, env_name="matrix", env=None, seed=0, steps=40, batch_size=4, rollouts=None
) -> tuple[list[float], object]:
    """Fit ``module`` for ``steps`` optimizer steps (or ``rollouts`` whole rollouts: :func:`quiet_fit`); returns each
    rollout's mean return and the env."""
    L.seed_everything(seed, verbose=False)
    dm = data_from_config("magrpo", env=env_name, batch_size=batch_size, seed=seed)
    if env is not None:
        dm.env = env
        dm.stream.tasks = list(env.tasks("train"))
    returns = []
    rollout = module.rollout

    def recording(tasks):
        experience = rollout(tasks)
        returns.append(experience.stats["reward/return"])
        return experience

    module.rollout = recording
    quiet_fit(module, dm, -1 if rollouts else steps, rollouts)
    return returns, dm.env


def backward_passes(module, minibatch, scale, stats: dict[str, float]) -> list:
    """The minibatch's backward passes as ``CollabModule.update`` runs them: each micro-batch's terms, each adding its
    statistics to ``stats`` weighted by its micro-batch's share of the minibatch; each returns its loss."""
    from functools import partial

    from collab.algos.base import run_term

    passes = []
    for positions in module.micro_batches(minibatch):
        micro, share = [minibatch[i] for i in positions], len(positions) / len(minibatch)
        passes += [partial(run_term, term, stats, share) for term in module.terms(micro, scale.select(positions))]
    return passes


def minibatch_gradient(module, batch, index: int = 0) -> dict[str, float]:
    """One process's gradient of the loss of one minibatch (all of ``batch.items``), accumulated into the
    parameters' ``.grad`` through the update's own pieces (``normalizers``, then each micro-batch's terms: one
    backward each), without the optimizer; returns the minibatch's statistics."""
    stats: dict[str, float] = {}
    for backward_pass in backward_passes(module, batch.items, module.normalizers(batch.items, batch, index), stats):
        backward_pass().backward()
    return stats


def fit(root: Path, algo: str, args: list[str], steps: int, ckpt: Path | None = None) -> Path:
    """``python -m collab.fit`` on the tiny model and the CPU, in this process; returns the run's version folder."""
    from collab.fit import main

    argv = [
        "--algo",
        algo,
        *TINY_CLI,
        *args,
        "--trainer.max_steps",
        str(steps),
        "--trainer.logger.init_args.save_dir",
        str(root),
    ]
    assert main(argv + (["--ckpt_path", str(ckpt)] if ckpt else [])) == 0
    return max((root / algo).glob("version_*"), key=lambda p: int(p.name.split("_")[1]))


def load(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def assert_same_tensors(a, b, where: str) -> None:
    """``a`` and ``b`` (nested dicts / lists of tensors and plain values) are equal, tensors bitwise."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_tensors(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def adapters(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    folders = sorted((run / "adapters" / "last").iterdir())
    assert folders
    return {f.name: load_file(f / "adapter_model.safetensors") for f in folders}


def quiet_fit(module, datamodule, steps: int = -1, rollouts: int | None = None, callbacks=()):
    """Train ``module`` for ``steps`` optimizer updates on the CPU, without logs, checkpoints or warnings; or for
    ``rollouts`` rollouts, each with all its updates (``max_steps`` would end the last rollout's updates there).
    ``callbacks`` are the Trainer's."""
    import logging

    import lightning as L

    trainer = L.Trainer(
        max_steps=steps,
        **({"limit_train_batches": rollouts, "max_epochs": 1} if rollouts is not None else {}),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        callbacks=list(callbacks),
    )
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule)
    return trainer


class ScriptedTeam:
    """Stands in for the agents where the policy is not under test: each sample's text is
    ``respond(agent, messages)``, ``messages`` being the history the agent was shown."""

    def __init__(self, respond):
        self.respond, self.prompts = respond, []

    def encode(self, agent, messages):
        self.prompts.append(messages)
        return [len(self.prompts) - 1]

    def generate(self, requests, max_new_tokens=128):
        from collab.policy.sampling import Completion

        return [
            [
                Completion(r.agent, r.prompt_ids, [1], self.respond(r.agent, self.prompts[r.prompt_ids[0]]))
                for _ in range(r.n)
            ]
            for r in requests
        ]


class EarlySolveEnv:
    """A 2-turn cooperative game where solving at turn 1 is optimal (the known-optimum learning tests).

    Every agent answers A or B (one token). All A solves the task: reward ``solve``, and the episode
    ends. Anything else earns ``partial`` and the team tries again, up to ``horizon`` turns. With the
    end valued as an absorbing state (the reward repeats until the horizon), solving at turn 1 is worth
    ``solve * H`` and solving at turn 2 ``partial + solve``: with partial < solve, earlier is better. An
    algorithm that kept only the rewards so far would value the early solve at ``solve`` alone and
    learn to postpone it (partial + solve > solve).
    """

    def __new__(cls, n_agents: int = 2, horizon: int = 2, solve: float = 1.0, partial: float = 0.6):
        from collab.envs.base import AgentRole, Env, Score

        class _EarlySolve(Env):
            name = "early_solve"
            reward_max = solve

            def __init__(self):
                super().__init__(horizon)
                self.roles = tuple(
                    AgentRole(f"agent{i}", max_new_tokens=1, choices=("A", "B")) for i in range(n_agents)
                )

            def tasks(self, split):
                return [{"id": 0}]

            def observe(self, task):
                return ["Solve the task together: answer A or B."] * self.n_agents

            def score(self, state, actions):
                solved = all(a.strip() == "A" for a in actions)
                r = solve if solved else partial
                return Score((r,) * self.n_agents, terminated=solved, info={"solved": float(solved)})

            def feedback(self, state, actions, score):
                return ["Not solved yet. Answer A or B again."] * self.n_agents

        return _EarlySolve()


def datamodule_for(env, batch_size: int = 4, seed: int = 0):
    """A RolloutDataModule playing ``env`` (an Env object, e.g. a test environment)."""
    from collab.rollout.datamodule import TaskStream

    dm = data_from_config("magrpo", env="matrix", batch_size=batch_size, seed=seed)
    dm.env = env
    dm.stream = TaskStream(env.tasks("train"), batch_size, True, seed)
    return dm


def tiny_base_folder(folder: Path, layers: int) -> Path:
    """The ``tiny`` base's shape (its tokenizer, hidden size 64) with ``layers`` decoder layers, written as a model
    folder for ``--model.base.name``: FSDP2 over N processes needs a base of at least N layers, and ``tiny`` has 2."""
    from collab.policy.models import TINY, load_tokenizer, tiny_llama

    tokenizer = load_tokenizer(TINY)
    tiny_llama(len(tokenizer), layers=layers).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
