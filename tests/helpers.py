"""Helpers shared by several test modules: small environments, a training loop that records each
rollout's return, and the command-line fit and checkpoint readers of the resume tests."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from collab.envs.base import AgentRole, Env, Score
from collab.rollout.datamodule import RolloutDataModule
from tests.conftest import quiet_fit

TINY_CLI = ["--model.base.name", "tiny", "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false"]
"""``collab.fit`` arguments of a quiet run on the tiny model and the CPU."""


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
        self.roles = tuple(AgentRole(f"p{i + 1}", f"You are player {i + 1}.", max_new_tokens=1, choices=("A", "B"))
                           for i in range(2))

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


def train(module, env_name="matrix", env=None, seed=0, steps=40, batch_size=4) -> tuple[list[float], object]:
    """Fit ``module`` for ``steps`` optimizer steps; returns each rollout's mean return and the env."""
    L.seed_everything(seed, verbose=False)
    dm = RolloutDataModule(env=env_name, batch_size=batch_size, seed=seed)
    if env is not None:
        dm.env = env
        dm.stream.tasks = list(env.tasks("train"))
    returns = []
    rollout = module.rollout

    def recording(env, tasks):
        batch = rollout(env, tasks)
        returns.append(batch.stats["reward/return"])
        return batch

    module.rollout = recording
    quiet_fit(module, dm, steps)
    return returns, dm.env


def fit(root: Path, algo: str, args: list[str], steps: int, ckpt: Path | None = None) -> Path:
    """``python -m collab.fit`` on the tiny model and the CPU, in this process; returns the run's version folder."""
    from collab.fit import main

    argv = ["--algo", algo, *TINY_CLI, *args, "--trainer.max_steps", str(steps),
            "--trainer.logger.init_args.save_dir", str(root)]
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
