"""Env options written once per env (``conf/env/ENV.yaml``), composed with every algorithm's config: all 49
``--algo X --data.env Y`` pairs build (config parsed, module and datamodule instantiated, no training), and a
pair the algorithm does not train on is refused in one line naming the envs it supports."""

import functools

import pytest
import yaml

from collab.algos import algo_envs, algo_registry, from_config
from collab.algos.configured import algo_config
from collab.envs import env_names
from tests.training.test_cli import ROOT

ALGOS = sorted(algo_registry())
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
    for algo in ALGOS:
        data = yaml.safe_load((ROOT / "conf" / "algo" / f"{algo}.yaml").read_text())["data"]
        assert set(data) == {"env", "batch_size", "shuffle", "seed"}, (algo, data)
    for env in ENVS:
        data = yaml.safe_load((ROOT / "conf" / "env" / f"{env}.yaml").read_text())["data"]
        assert data["env"] == env and set(data) == {"env", "env_options", "num_turns"}, (env, data)


def test_every_pair_builds_or_is_refused():
    from collab.errors import UserError

    built, refused = [], []
    for algo in ALGOS:
        for env in ENVS:
            if env not in algo_envs(algo):
                with pytest.raises(UserError, match=rf"--algo {algo} does not train on env '{env}'; it supports: "):
                    algo_config(algo, env)
                refused.append((algo, env))
                continue
            config = algo_config(algo, env)
            assert config["data"]["env"] == env
            parsed = parser(algo).parse_object({"model": config["model"], "data": config["data"]})
            module = from_config(algo)
            dm = datamodule(yaml.safe_dump(config["data"]))
            assert dm.env.name == env and parsed.data.env == env and module.team is None
            built.append((algo, env))
    assert len(built) + len(refused) == 49 and refused == [("maporl", e) for e in ENVS if e != "debate"]


def test_the_default_env_keeps_its_algorithms_choice():
    """marft_a trains math on small_addition with the duo profile, one attempt (as before the split); on
    writing its data options are the writing env's, not math's."""
    assert algo_config("marft_a")["data"] == {"env": "math", "env_options": {"dataset": "small_addition", "profile": "duo"},
                                              "num_turns": 1, "batch_size": 8, "shuffle": True, "seed": 0}
    assert algo_config("marft_a", "writing")["data"]["env_options"] == {}
    assert algo_config("marft_t")["data"]["env_options"] == {"dataset": "addition", "profile": "duo"}


@pytest.mark.parametrize("env", ["math", "writing"])
def test_a_refused_pair_is_one_line(env, capsys):
    from collab.fit import main

    code = main(["--algo", "maporl", "--data.env", env, "--model.base.name", "tiny"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and lines == [f"error: --algo maporl does not train on env '{env}'; it supports: debate"]
