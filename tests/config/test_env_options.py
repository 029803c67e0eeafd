"""``data.env_options`` reach the environment as their YAML gave them, and a string as the env's parameter reads
it (``collab.envs.typed_options``): the splits ``"[0:8]"``, ``"[8:10]"``, ``"[0:66]"``, ``"[16:]"`` stay splits
from a ``--config`` file, a ``--data.env_options`` mapping or one ``--data.env_options.KEY VALUE`` each (typed
``Any``, the option had every string read as YAML once more: ``"[0:8]"`` became the list ``['0:8']`` and
``"[8:10]"`` the list ``[490]``, YAML 1.1's sexagesimal 8:10), and ``--data.env_options.num_eval 8`` is the
number its parameter takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from collab.envs import Env
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
@pytest.mark.parametrize("source", ["--config", "mapping", "quoted"])
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
    else:  # one option each, quoted as YAML strings (as the mapping's values are)
        argv = ["--data.env", "minecraft", "--data.env_options.dataset", houses]
        argv += ["--data.env_options.train_split", f'"{train}"', f"--data.env_options.eval_split='{evaluation}'"]
    cli = build("magrpo", *argv)
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


class Options(Env):
    """An env whose parameters take each kind of value (typed_options reads only the annotations)."""

    def __init__(
        self,
        count: int = 1,
        share: float = 0.5,
        flag: bool = False,
        split: str | None = None,
        limit: int | None = None,
        weights: dict[str, float] | None = None,
        anything: Any = None,
    ) -> None:
        pass


# (option, the value given, the value the env gets)
READINGS = [
    ("count", "8", 8),
    ("count", 8, 8),
    ("share", "1e-3", 0.001),  # as jsonargparse reads it (PyYAML's YAML 1.1 wants a dot: the string "1e-3")
    ("flag", "false", False),
    ("split", "[0:8]", "[0:8]"),  # a string parameter keeps the text YAML would read as a list
    ("split", "8:10", "8:10"),  # ... or as the sexagesimal 490
    ("split", '"[0:8]"', "[0:8]"),  # a quoted YAML string: the string inside the quotes
    ("split", "'[16:]'", "[16:]"),
    ("split", "8", "8"),
    ("split", "null", None),  # None where the parameter takes it
    ("split", "tldr:data/train-*.parquet", "tldr:data/train-*.parquet"),
    ("limit", "null", None),
    ("limit", "12", 12),
    ("weights", "{a: 1.5}", {"a": 1.5}),
    ("anything", "[1, 2]", "[1, 2]"),  # Any: as given
    ("count", "[1, 2", "[1, 2"),  # not YAML: the text, for the env's own check to name
]


@pytest.mark.parametrize("option,given,expected", READINGS)
def test_a_string_is_read_as_its_parameter_takes_it(option, given, expected):
    from collab.envs import typed_options

    typed = typed_options(Options, {option: given})
    assert typed == {option: expected} and type(typed[option]) is type(expected)


def test_an_option_on_the_command_line_reaches_the_env_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["--data.env", "math", "--data.env_options.dataset", "small_addition", "--data.env_options.num_eval", "8"]
    env = build("magrpo", *argv, "--data.env_options.fallback", "false").datamodule.env
    assert len(env.tasks("eval")) == 8 and env.fallback is False


@pytest.mark.parametrize("where", ["file", "command line"])
def test_an_unquoted_split_is_one_line(where, houses, tmp_path, monkeypatch):
    """``[0:8]`` unquoted is the YAML list ``['0:8']``, in a file and as ``--data.env_options.train_split [0:8]``
    (jsonargparse reads the value as YAML): one line saying how to quote it, not a traceback from the env."""
    monkeypatch.chdir(tmp_path)
    if where == "file":
        path = tmp_path / "run.yaml"
        path.write_text(f"data:\n  env: minecraft\n  env_options:\n    dataset: {houses}\n    train_split: [0:8]\n")
        argv = ["--config", str(path)]
    else:
        argv = ["--data.env", "minecraft", "--data.env_options.dataset", houses]
        argv += ["--data.env_options.train_split", "[0:8]"]
    with pytest.raises(UserError, match=r"bad split \['0:8'\]: a split is a slice string .*'\"\[0:8\]\"'"):
        build("magrpo", *argv)
