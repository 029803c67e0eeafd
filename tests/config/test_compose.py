"""How the packaged configs compose (``collab.config``): base, env, algorithm, the env's choices for the
algorithm; mappings merged key by key, lists whole, callbacks by class path; which file set each value
(``--explain``); the command line read once; a config file that cannot be read ends in one line."""

import re

import pytest
import yaml

from collab.algos import algo_registry
from collab.config import Layer, compose, packaged_conf, packaged_config, packaged_layers, read_command_line
from collab.errors import UserError

ALGOS = sorted(algo_registry())
CONF = packaged_conf()


def test_mappings_merge_lists_replace_callbacks_merge_by_class_path():
    first = {
        "model": {"a": 1, "b": {"c": 2, "d": 3}, "agents": [{"lr": 1}, {"lr": 2}]},
        "trainer": {
            "callbacks": [
                {"class_path": "X", "init_args": {"p": 1, "q": 2}},
                {"class_path": "Y", "init_args": {"r": 3}},
            ]
        },
    }
    second = {
        "model": {"b": {"c": 5}, "agents": [{"lr": 9}]},
        "trainer": {"callbacks": [{"class_path": "Y", "init_args": {"r": 4}}, {"class_path": "Z"}]},
    }
    merged, origin = compose([Layer("one", first), Layer("two", second)])
    assert merged["model"] == {"a": 1, "b": {"c": 5, "d": 3}, "agents": [{"lr": 9}]}
    assert merged["trainer"]["callbacks"] == [
        {"class_path": "X", "init_args": {"p": 1, "q": 2}},
        {"class_path": "Y", "init_args": {"r": 4}},
        {"class_path": "Z"},
    ]
    assert origin["model.a"] == "one" and origin["model.b.c"] == "two" and origin["model.b.d"] == "one"
    assert origin["model.agents[0].lr"] == "two" and "model.agents[1].lr" not in origin  # the list replaced whole
    assert origin["trainer.callbacks[1].init_args.r"] == "two" and origin["trainer.callbacks[0].init_args.q"] == "one"
    assert origin["trainer.callbacks[2].class_path"] == "two"
    assert first["model"]["b"] == {"c": 2, "d": 3}  # the layers themselves are not changed


def test_the_layers_of_a_run_in_order():
    names = [layer.name for layer in packaged_layers("magrpo", "math")]
    assert names == [
        "base.yaml",
        "the run's name",
        "env/math.yaml",
        "algo/magrpo.yaml",
        "env/math.yaml algos.magrpo",
        "the run's env",
    ]
    names = [layer.name for layer in packaged_layers("marft_a", "debate")]
    assert names == ["base.yaml", "the run's name", "env/debate.yaml", "algo/marft_a.yaml", "the run's env"]
    names = [layer.name for layer in packaged_layers("reinforce:Reinforce", "guess_env:GuessEnv")]
    assert names == ["base.yaml", "the run's name", "the run's env"]
    assert packaged_layers("reinforce:Reinforce", None)[1].values == {
        "trainer": {"logger": {"init_args": {"name": "reinforce"}}}
    }


@pytest.mark.parametrize("algo", ALGOS)
def test_an_algorithms_own_choice_wins_over_the_envs_and_the_pairs_over_both(algo):
    """The run's name and env are the algorithm's and the env's whatever the files say; MARFT's own team wins over
    the math team; CoLLM's critic rate on math (the env's section) wins over its file's."""
    config = packaged_config(algo)
    assert config["trainer"]["logger"]["init_args"]["name"] == algo
    assert config["data"]["env"] == yaml.safe_load((CONF / "algo" / f"{algo}.yaml").read_text())["data"]["env"]
    if algo == "marft_a":
        assert [a["lr"] for a in config["model"]["agents"]] == [1e-4, 1e-3]
    if algo.startswith("collm"):
        assert config["model"]["critic_lr"] == 1e-4 and packaged_config(algo, "writing")["model"]["critic_lr"] == 1e-3


def test_no_value_is_written_twice_in_the_layers_of_a_default():
    """Every default once: no layer restates a value that a layer applying to the same runs already gives (the
    same value set again would be a second place to change it). conf/base.yaml applies to every run, so neither
    an env's file nor an algorithm's repeats it; an env's section for an algorithm repeats neither of those. (An
    algorithm's own choice may equal an env's: it applies on every env, MARFT-T's team and MARFT's 8 problems
    a rollout on math among them.)"""
    for algo in ALGOS:
        layers = [
            layer
            for layer in packaged_layers(algo, packaged_config(algo)["data"]["env"])
            if not layer.name.startswith("the run's")
        ]
        base = _flat(layers[0].values)
        for i, layer in enumerate(layers[1:], 1):
            before = _flat(compose(layers[:i])[0]) if " algos." in layer.name else base
            for key, value in _flat(layer.values).items():
                assert before.get(key, object()) != value or key == "data.env", (algo, layer.name, key)


def _flat(values: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in values.items():
        if isinstance(value, dict) and value and key != "env_options":
            out.update(_flat(value, f"{prefix}{key}."))
        elif not (prefix.startswith("trainer.") and key == "callbacks"):
            out[f"{prefix}{key}"] = value
    return out


def test_the_algorithm_files_hold_under_40_lines_of_keys():
    for algo in ALGOS:
        lines = (CONF / "algo" / f"{algo}.yaml").read_text().splitlines()
        keys = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
        assert len(keys) < 40, (algo, len(keys))


def test_the_command_line_read_once():
    line = read_command_line(
        [
            "--model.ppo.clip",
            "0.1",
            "--algo=ippo",
            "--config",
            "a.yaml",
            "--explain",
            "--data.env=writing",
            "--config=b.yaml",
            "--print_config",
        ]
    )
    assert line.algo == "ippo" and line.explain and line.print_config
    assert line.args == [
        "--model.ppo.clip",
        "0.1",
        "--config",
        "a.yaml",
        "--data.env=writing",
        "--config=b.yaml",
        "--print_config",
    ]
    assert line.configs == ["a.yaml", "b.yaml"] and line.values("--data.env") == ["writing"]
    assert read_command_line([]).algo == "magrpo" and read_command_line([]).env() == "math"
    with pytest.raises(UserError, match="--algo needs a name"):
        read_command_line(["--algo"])


def test_the_env_is_the_last_one_given(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("data: {env: debate}\n")
    assert read_command_line(["--algo", "marft_a", "--data.env", "matrix", "--config", str(config)]).env() == "debate"
    assert read_command_line(["--algo", "marft_a", "--config", str(config), "--data.env", "matrix"]).env() == "matrix"


@pytest.mark.parametrize(
    "content,message",
    [
        (
            b"model:\n  agent_lr: 1\xe9\n",
            r"--config .*bad.yaml: not UTF-8 text \(byte 20\); a config is a YAML file in UTF-8",
        ),
        (b"model: [1,\n", r"--config .*bad.yaml: not valid YAML"),
        (b"- 1\n- 2\n", r"--config .*bad.yaml: holds a list, not a mapping of sections"),
    ],
)
def test_a_config_that_cannot_be_read_is_one_line(tmp_path, capsys, content, message):
    from collab.fit import main

    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    code = main(["--algo", "magrpo", "--config", str(path), "--model.base.name", "tiny"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert re.search(message, err), err


def test_explain_names_the_file_of_every_value(capsys, tmp_path):
    from collab.fit import main

    own = tmp_path / "own.yaml"
    own.write_text("model:\n  ppo: {clip: 0.3}\n")
    assert main(["--algo", "collm_dc", "--config", str(own), "--model.ppo.gamma", "0.9", "--explain"]) == 0
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["model.critic"] == "decentralized  # algo/collm_dc.yaml"
    assert lines["model.critic_lr"] == "0.0001  # env/math.yaml algos.collm_dc"
    assert lines["model.agents[1].lr"] == "0.0003  # env/math.yaml"
    assert lines["model.agent_lr"] == "0.001  # base.yaml"
    assert (
        lines["model.ppo.clip"] == f"0.3  # --config {own}" and lines["model.ppo.gamma"] == "0.9  # --model.ppo.gamma"
    )
    assert lines["trainer.logger.init_args.name"] == "collm_dc  # the run's name"
    assert lines["trainer.callbacks[3].init_args.tasks_per_batch"] == "16  # base.yaml"
    assert lines["trainer.max_steps"] == "16  # algo/collm_dc.yaml" and lines["trainer.num_nodes"] == "1  # default"
