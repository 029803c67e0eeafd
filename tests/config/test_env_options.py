"""``data.env_options`` reach the environment as their YAML gave them: a quoted string stays that string (the
splits ``"[0:8]"``, ``"[8:10]"``, ``"[0:66]"``, ``"[16:]"``, from a ``--config`` file, a ``--data.env_options``
mapping or one ``--data.env_options.KEY VALUE`` each), and numbers, bools, lists, mappings and null keep their
types. (Typed ``Any``, the option had every string read as YAML once more: ``"[0:8]"`` became the list
``['0:8']`` and ``"[8:10]"`` the list ``[490]``, YAML 1.1's sexagesimal 8:10.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from collab.errors import UserError
from tests.training.test_cli import ROOT, TINY

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"

HOUSE = {
    "inventory": {"A": "air", "S": "stone"},
    "count": {"S": 2},
    "target_spec": {"type": "y_layers", "size": [2, 1, 1], "layers": [{"y": 0, "rows": ["SS"]}]},
    "bbox": {"from": [0, 0, 0], "to": [1, 0, 0]},
}
"""One house of the authors' HouseBuild ``data.json`` (tests/envs/test_published.py has its format)."""


@pytest.fixture
def houses(tmp_path):
    """A HouseBuild file of 70 houses, ``house_0`` to ``house_69``."""
    path = tmp_path / "houses.json"
    path.write_text(json.dumps([{**HOUSE, "task_id": f"house_{i}"} for i in range(70)]))
    return f"housebuild:{path}"


def build(algo: str, *argv: str):
    from collab.fit import build_cli

    return build_cli(algo, [*TINY, "--trainer.logger", "false", *argv])


def ids(env, split: str) -> list[int]:
    return [int(task["task_id"].removeprefix("house_")) for task in env.tasks(split)]


SPLITS = {"[0:8]": range(0, 8), "[8:10]": range(8, 10), "[0:66]": range(0, 66), "[16:]": range(16, 70)}


@pytest.mark.parametrize("train,evaluation", [("[0:8]", "[8:10]"), ("[0:66]", "[16:]")])
@pytest.mark.parametrize("source", ["--config", "mapping", "options"])
def test_splits_reach_the_env_as_written(source, train, evaluation, houses, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if source == "--config":  # as the presets write them
        path = tmp_path / "run.yaml"
        path.write_text(
            f'data:\n  env: minecraft\n  env_options:\n    dataset: {houses}\n    train_split: "{train}"\n'
            f'    eval_split: "{evaluation}"\n'
        )
        argv = ["--config", str(path)]
    elif source == "mapping":  # docs/environments.md's command line
        options = f'{{dataset: {houses}, train_split: "{train}", eval_split: "{evaluation}"}}'
        argv = ["--data.env", "minecraft", "--data.env_options", options]
    else:  # one option each, the splits quoted as YAML strings
        argv = ["--data.env", "minecraft", "--data.env_options.dataset", houses]
        argv += ["--data.env_options.train_split", f'"{train}"', f'--data.env_options.eval_split="{evaluation}"']
    cli = build("magrpo", *argv)
    assert cli.config.data.env_options == {"dataset": houses, "train_split": train, "eval_split": evaluation}
    env = cli.datamodule.env
    assert ids(env, "train") == list(SPLITS[train]) and ids(env, "eval") == list(SPLITS[evaluation])
    assert cli.datamodule.stream.tasks == list(env.tasks("train"))


@pytest.mark.skipif(not (SHARED / "housebuild.json").is_file(), reason="no shared/data/housebuild.json")
def test_the_minecraft_preset_splits_the_published_houses(tmp_path, monkeypatch):
    """conf/presets/collm_minecraft_paper.yaml's ``"[0:8]"`` and ``"[8:10]"`` of the authors' 10 houses: CoLLM's
    8 training houses and 2 held out (before, the list ``['0:8']`` ended in a traceback)."""
    monkeypatch.chdir(tmp_path)
    preset = ROOT / "conf" / "presets" / "collm_minecraft_paper.yaml"
    dataset = f"housebuild:{SHARED / 'housebuild.json'}"
    cli = build("collm_cc", "--config", str(preset), "--data.env_options.dataset", dataset)
    assert cli.config.data.env_options == {"dataset": dataset, "train_split": "[0:8]", "eval_split": "[8:10]"}
    houses = json.loads((SHARED / "housebuild.json").read_text())
    env = cli.datamodule.env
    assert [t["task_id"] for t in env.tasks("train")] == [h["task_id"] for h in houses[0:8]]
    assert [t["task_id"] for t in env.tasks("eval")] == [h["task_id"] for h in houses[8:10]]


def test_splits_from_python(houses):
    """``data_from_config`` reads its options with the same parser: the splits as given."""
    from collab.algos import data_from_config

    options = {"dataset": houses, "train_split": "[0:66]", "eval_split": "[8:10]"}
    data = data_from_config("magrpo", env="minecraft", env_options=options)
    assert ids(data.env, "train") == list(range(66)) and ids(data.env, "eval") == [8, 9]


def printed_options(capsys, *argv: str) -> dict:
    from collab.fit import print_config

    with pytest.raises(SystemExit):
        print_config("magrpo", [*argv, "--print_config"])
    return yaml.safe_load(capsys.readouterr().out)["data"]["env_options"]


def test_values_keep_their_yaml_types(tmp_path, capsys):
    """Quoted strings that look like YAML stay strings; numbers, bools, lists, mappings and null keep their
    types, from a file and from the command line (a bare ``--data.env_options.num_eval 8`` is the int 8)."""
    path = tmp_path / "run.yaml"
    path.write_text(
        "data:\n  env_options:\n"
        '    s8: "8"\n    strue: "true"\n    snull: "null"\n    ssexagesimal: "8:10"\n    slist: "[1, 2]"\n'
        "    int: 8\n    float: 0.5\n    exp: 1e-3\n    bool: true\n    list: [1, '2', [0:8]]\n"
        "    mapping: {a: 1, b: '[0:8]'}\n    none: null\n"
    )
    options = printed_options(
        capsys,
        "--config",
        str(path),
        "--data.env_options.num_eval",
        "8",
        "--data.env_options.share=0.25",
        "--data.env_options.flag",
        "false",
        "--data.env_options.items",
        "[1, 2]",
        "--data.env_options.weights",
        "{a: 1.5}",
        "--data.env_options.off",
        "null",
        "--data.env_options.path",
        "tldr:data/train-*.parquet",
        "--data.env_options.quoted",
        '"8"',
    )
    assert options == {
        "s8": "8",
        "strue": "true",
        "snull": "null",
        "ssexagesimal": "8:10",
        "slist": "[1, 2]",
        "int": 8,
        "float": 0.5,
        "exp": 0.001,
        "bool": True,
        "list": [1, "2", ["0:8"]],
        "mapping": {"a": 1, "b": "[0:8]"},
        "none": None,
        "num_eval": 8,
        "share": 0.25,
        "flag": False,
        "items": [1, 2],
        "weights": {"a": 1.5},
        "off": None,
        "path": "tldr:data/train-*.parquet",
        "quoted": "8",
    }
    assert {k: type(v) for k, v in options.items() if k in ("int", "num_eval", "bool", "flag")} == {
        "int": int,
        "num_eval": int,
        "bool": bool,
        "flag": bool,
    }


def test_an_option_goes_to_the_parser_as_the_whole_mapping(tmp_path):
    """``--data.env_options.KEY VALUE`` goes to the parser as the whole mapping, ``VALUE`` read as YAML, merged
    into what the earlier arguments left: the packaged config's mapping, a ``--config`` file's or a ``--data``
    file's (which replace it whole), a ``--data.env_options`` value; a file without env options keeps it."""
    from collab.config import parser_args, read_command_line

    options, other, section = tmp_path / "options.yaml", tmp_path / "other.yaml", tmp_path / "data.yaml"
    options.write_text('data:\n  env_options: {dataset: x.json, eval_split: "[8:10]", lr: 1e-3}\n')
    other.write_text("data:\n  batch_size: 2\n")
    section.write_text("env_options: {preset: table1}\n")
    argv = ["--data.env_options.num_eval", "8", "--config", str(options), "--config", str(other)]
    argv += ['--data.env_options.train_split="[0:8]"', "--data", str(section), "--data.env_options.team_reward", "true"]
    argv += ["--data.env_options", "{a: {b: 1}}", "--data.env_options.a.c", "8:10"]
    argv += ["--data.env_options", "null", "--data.env_options.seed", "-1"]
    packaged = {"data": {"env_options": {"dataset": "small_addition", "split": "[16:]"}}}
    args = parser_args(packaged, read_command_line(argv))
    assert yaml.safe_load(args[1]) == packaged
    whole = [
        {"dataset": "small_addition", "split": "[16:]", "num_eval": 8},
        {
            "dataset": "x.json",
            "eval_split": "[8:10]",
            "lr": 0.001,
            "train_split": "[0:8]",
        },  # 1e-3 as the parser reads it
        {"preset": "table1", "team_reward": True},
        {"a": {"c": 490}},  # jsonargparse's a.c: {a: {c: VALUE}}; 8:10 unquoted is YAML 1.1's 490
        {"seed": -1},
    ]
    assert args[2:] == [
        *("--data.env_options", json.dumps(whole[0])),
        *("--config", str(options), "--config", str(other)),
        *("--data.env_options", json.dumps(whole[1])),
        *("--data", str(section), "--data.env_options", json.dumps(whole[2])),
        *("--data.env_options", "{a: {b: 1}}", "--data.env_options", json.dumps(whole[3])),
        *("--data.env_options", "null", "--data.env_options", json.dumps(whole[4])),
    ]


MERGES = [
    [
        "--data.env_options.num_eval",
        "n",
        "--config",
        "options.yaml",
        "--config",
        "other.yaml",
        "--data.env_options.t=t",
    ],
    ["--config", "options.yaml", "--data", "data.yaml", "--data.env_options.team_reward", "r"],
    ["--data.env_options", "{a: {b: x}, k: v}", "--data.env_options.a.c", "y", "--data.env_options.k", "w"],
    ["--data.env_options", "null", "--data.env_options.seed", "s"],
    ["--data.env_options", "null", "--data.env_options.a.c", "y", "--data.env_options.a.d", "z"],
    ["--data.env_options", "{k: v}", "--data.env_options.a.c", "y"],
    ["--data", "{env_options: {q: r}}", "--data.env_options.seed", "s"],
    ["--data", "{batch_size: 2}", "--data.env_options.seed", "s", "--data.env_options.seed", "t"],
]


@pytest.mark.parametrize("argv", MERGES, ids=range(len(MERGES)))
def test_the_whole_mapping_is_the_one_the_parser_would_merge(argv, tmp_path, capsys, monkeypatch):
    """With values every reading keeps as strings, the parser ends with the same mapping whether it is given
    the whole mappings or the options themselves (jsonargparse's own merge)."""
    from collab.config import EnvOptions

    monkeypatch.chdir(tmp_path)
    (tmp_path / "options.yaml").write_text("data:\n  env_options: {dataset: x, eval_split: e}\n")
    (tmp_path / "other.yaml").write_text("data:\n  batch_size: 2\n")
    (tmp_path / "data.yaml").write_text("env_options: {preset: table1}\nbatch_size: 3\n")
    whole = printed_options(capsys, *argv)
    follow = EnvOptions.follow
    monkeypatch.setattr(EnvOptions, "follow", lambda self, source: follow(self, source) and source)
    assert printed_options(capsys, *argv) == whole


def test_an_unquoted_split_is_one_line(houses, tmp_path, monkeypatch):
    """``--data.env_options.train_split [0:8]`` unquoted is the YAML list ``['0:8']``: one line saying how to
    quote it, not a traceback from the env."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"bad split \['0:8'\]: a split is a slice string .*'\"\[0:8\]\"'"):
        build(
            "magrpo",
            "--data.env",
            "minecraft",
            "--data.env_options.dataset",
            houses,
            "--data.env_options.train_split",
            "[0:8]",
        )
