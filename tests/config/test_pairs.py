"""Env options written once per env (``conf/env/ENV.yaml``), composed with every algorithm's config: all 70
``--algo X --data.env Y`` pairs build (config parsed, module and datamodule instantiated, no training), and a
pair the algorithm does not train on is refused in one line naming the envs it supports."""

import functools

import pytest
import yaml

from collab.algos import algo_envs, algo_registry, data_from_config, from_config
from collab.config import packaged_config
from collab.envs import env_names
from tests.support.algos import algos, settings
from tests.training.test_cli import ROOT

ALGOS = algos()
ENVS = env_names()


@functools.lru_cache(maxsize=None)
def parser(algo: str):
    """The model and data groups of ``collab.fit``'s parser (the trainer's is checked per algorithm elsewhere)."""
    from jsonargparse import ArgumentParser

    from collab.rollout.datamodule import RolloutDataModule

    p = ArgumentParser(exit_on_error=False)
    p.add_class_arguments(algo_registry()[algo], "model")
    p.add_class_arguments(RolloutDataModule, "data")
    return p


@functools.lru_cache(maxsize=None)
def datamodule(data: str):
    from collab.rollout.datamodule import RolloutDataModule

    return RolloutDataModule(**yaml.safe_load(data))


def test_algo_configs_hold_no_env_option():
    """An algorithm's file names its default env and at most its rollout size; the env's options are the env's
    file's (conf/env/ENV.yaml, whose ``algos:`` section holds an algorithm's own choices on that env)."""
    for algo in ALGOS:
        data = yaml.safe_load((ROOT / "conf" / "algo" / f"{algo}.yaml").read_text())["data"]
        assert set(data) <= {"env", "batch_size"} and "env" in data, (algo, data)
    for env in ENVS:
        data = yaml.safe_load((ROOT / "conf" / "env" / f"{env}.yaml").read_text())["data"]
        assert data["env"] == env and set(data) <= {"env", "env_options", "num_turns", "batch_size"}, (env, data)


def test_every_pair_builds_or_is_refused():
    from collab.errors import UserError

    built, refused = [], []
    for algo in ALGOS:
        for env in ENVS:
            if env not in algo_envs(algo):
                with pytest.raises(UserError, match=rf"--algo {algo} does not train on env '{env}'; it supports: "):
                    data_from_config(algo, env=env)
                refused.append((algo, env))
                continue
            config = packaged_config(algo, env)
            assert config["data"]["env"] == env
            parsed = parser(algo).parse_object({"model": config["model"], "data": config["data"]})
            module = from_config(algo)
            dm = datamodule(yaml.safe_dump(config["data"]))
            assert dm.env.name == env and parsed.data.env == env and module.team is None
            built.append((algo, env))
    assert len(built) + len(refused) == len(ALGOS) * len(ENVS) and refused == [
        ("maporl", e) for e in ENVS if e != "debate"
    ]


MATH_DEFAULTS = [algo for algo in ALGOS if packaged_config(algo)["data"]["env"] == "math"]
"""The algorithms whose default is one task: the math env's small sums, one attempt, a duo team."""


@pytest.mark.parametrize("algo", MATH_DEFAULTS)
def test_the_default_env_keeps_its_algorithms_choice(algo):
    """Each of these trains math on small_addition with the duo profile, one attempt, and its team of
    tests/support/algos.py (the Reasoner at 1e-4, the Actor at 1e-3 (MARFT-A) or 3e-4 (the others), 32 and 24
    tokens); on writing its data options are the writing env's and its agents the algorithm file's, not math's."""
    config = packaged_config(algo)
    assert config["data"]["num_turns"] == 1
    assert config["data"]["env_options"] == {"dataset": "small_addition", "profile": "duo"}
    team = [(a["lr"], a["sampling"]["max_new_tokens"]) for a in config["model"]["agents"]]
    assert team == settings(algo).team, algo
    writing = packaged_config(algo, "writing")
    assert writing["data"]["env_options"] == {} and writing["data"]["env"] == "writing"
    if algo in ("collm_cc", "collm_dc", "ippo"):
        # CoLLM's raw TD error needs a slower critic on this task (conf/env/math.yaml's algos section); IPPO normalizes
        # its advantages and keeps 1e-3; on writing every critic keeps its algorithm file's 1e-3
        assert config["model"]["critic_lr"] == (1.0e-3 if algo == "ippo" else 1.0e-4), algo
        assert writing["model"]["critic_lr"] == 1.0e-3
    if algo.startswith("marft"):
        return
    assert [a["sampling"]["max_new_tokens"] for a in writing["model"]["agents"]] == [48, 96]
    assert all("lr" not in a for a in writing["model"]["agents"])


@pytest.mark.parametrize("env", ["math", "writing", "plan_path", "sudoku", "sokoban"])
def test_a_refused_pair_is_one_line(env, capsys):
    from collab.fit import main

    code = main(["--algo", "maporl", "--data.env", env, "--model.base.name", "tiny"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and lines == [f"error: --algo maporl does not train on env '{env}'; it supports: debate"]
