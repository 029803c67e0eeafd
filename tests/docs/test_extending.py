"""docs/extending.md's two worked examples, run as a newcomer runs them.

The examples (``docs/examples/``: an algorithm, ``reinforce.py`` + ``reinforce.yaml``, and an env,
``guess_env.py`` + ``guess.yaml``) are copied into a folder of their own, outside the repository, and
trained from there for one step on the tiny model: the algorithm on a built-in env (matrix), the env
with a built-in algorithm (magrpo), and the two together. The three launches run side by side. Each must
exit 0 and write ``last.ckpt`` under its ``--trainer.default_root_dir``; the example algorithm's loss
and advantages logged must be finite. In-process: the algorithm's ``prepare`` against a hand
computation, and the bad class paths, each ending in one ``error:`` line and exit code 2.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.support import warm

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
FILES = ("reinforce.py", "reinforce.yaml", "guess_env.py", "guess.yaml")
ONE_STEP = ("--model.base.name", "tiny", "--trainer.accelerator", "cpu", "--trainer.max_steps", "1")
SMALL_GUESS = ("--data.env_options", "{num_tasks: 4, num_eval_tasks: 2}", "--data.batch_size", "2")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A researcher's own folder holding a copy of the four example files."""
    path = tmp_path_factory.mktemp("my_project")
    for name in FILES:
        shutil.copy(EXAMPLES / name, path / name)
    return path


RUNS = {
    "algorithm": ("--algo", "reinforce:Reinforce", "--config", "reinforce.yaml", "--data.env", "matrix"),
    "env": (
        "--algo",
        "magrpo",
        "--config",
        "guess.yaml",
        *SMALL_GUESS,
        "--data.num_turns",
        "1",
        "--model.agents",
        "[{sampling: {max_new_tokens: 6}}, {sampling: {max_new_tokens: 6}}]",
    ),
    "both": ("--algo", "reinforce:Reinforce", "--config", "reinforce.yaml", "--config", "guess.yaml", *SMALL_GUESS),
}


@pytest.fixture(scope="module")
def runs(folder) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    def launch(name: str):  # forked warm (tests/support/warm.py)
        root = folder / f"root_{name}"
        args = [*RUNS[name], *ONE_STEP, "--trainer.default_root_dir", str(root)]
        return warm.run(args, folder, warm.child_env(), timeout=300), root

    with ThreadPoolExecutor(len(RUNS)) as pool:
        return dict(zip(RUNS, pool.map(launch, RUNS)))


@pytest.mark.parametrize("name", list(RUNS))
def test_example_trains_one_step(runs, folder, name):
    result, root = runs[name]
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(root.rglob("last.ckpt")), f"no last.ckpt under {root}"
    assert not (folder / "runs").exists()  # everything under the root it was given
    if name != "env":  # the example algorithm's own numbers
        from collab.evaluation.analysis.runs import read_scalars
        from collab.evaluation.analysis.runs import runs as run_folders

        (run,) = run_folders(root)
        scalars = read_scalars(run)
        for tag in ("train/loss", "train/adv_mean", "train/adv_abs_max"):
            assert scalars.get(tag) and all(math.isfinite(v) for _, v in scalars[tag]), (tag, sorted(scalars))


def test_prepare_is_the_hand_computation(folder, monkeypatch):
    """A = G - b_i, b_i the mean of agent i's returns (baseline mean), per agent; none: A = G."""
    monkeypatch.syspath_prepend(str(folder))
    from reinforce import Reinforce

    from collab.rollout.experience import Decision, Experience

    returns = [(0, 1.0), (1, 4.0), (0, 3.0), (1, 0.0), (0, 5.0)]  # (agent, G)
    items = [Decision(a, a, 0, [1], [2], torch.zeros(1), returns=g) for a, g in returns]
    batch = Reinforce.prepare(SimpleNamespace(baseline="mean", normalize_std=False), Experience(items))
    assert [d.advantages for d in batch.items] == pytest.approx([-2.0, 2.0, 0.0, -2.0, 2.0])
    assert batch.metrics["train/adv_abs_max"] == pytest.approx(2.0)
    batch = Reinforce.prepare(SimpleNamespace(baseline="none", normalize_std=False), Experience(items))
    assert [d.advantages for d in batch.items] == pytest.approx([g for _, g in returns])


BAD = [
    (
        ("--algo", "no_such_module:Algo"),
        r"--algo no_such_module:Algo: cannot import module 'no_such_module'.*magrpo.*module:Class",
    ),
    (
        ("--algo", "reinforce:Missing"),
        r"--algo reinforce:Missing: module 'reinforce' .* has no 'Missing'.*module:Class",
    ),
    (("--algo", "guess_env:GuessEnv"), r"GuessEnv is not a collab.algos.base.CollabModule subclass.*magrpo"),
    (("--algo", "reinforce"), r"unknown algo 'reinforce'|algo.*reinforce.*magrpo"),
    (
        ("--algo", "magrpo", "--data.env", "reinforce:Reinforce"),
        r"Reinforce is not a collab.envs.base.Env subclass.*matrix",
    ),
    (("--algo", "magrpo", "--data.env", "guess_env:Missing"), r"has no 'Missing'.*matrix"),
    (
        ("--algo", "maporl", "--config", "guess.yaml"),
        r"--algo maporl does not train on env 'guess_env:GuessEnv'; it supports: debate",
    ),
]


@pytest.mark.parametrize("args,line", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_class_path_is_one_line(folder, monkeypatch, capsys, args, line):
    import re

    from collab.fit import main

    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    assert main([*args, *ONE_STEP, "--trainer.default_root_dir", str(folder / "bad")]) == 2
    errors = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and re.search(line, errors[0]), errors
