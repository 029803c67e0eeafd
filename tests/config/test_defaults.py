"""Every default written once: the classes' options have no default, ``conf/algo/ALGO.yaml`` holds them,
and what ``--print_config`` shows is what the module uses (from the command line and from Python)."""

import dataclasses
import inspect

import pytest

from collab.algos import algo_registry, from_config
from collab.errors import UserError
from tests.support.presets import ROOT, effective_agents, preset_runs

ALGOS = sorted(algo_registry())
ATTRIBUTE = {"num_generations": "k", "critic": "critic_mode", "agents": "agent_specs", "reward_model": "reward_spec"}
"""Options the modules keep under another attribute name."""


def test_no_option_has_a_default_in_code():
    from collab.algos.base import CollabModule
    from collab.rollout.datamodule import RolloutDataModule

    classes = {k for cls in algo_registry().values() for k in cls.__mro__ if k.__module__.startswith("collab.")}
    for cls in classes | {CollabModule, RolloutDataModule}:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        with_default = [p.name for p in inspect.signature(init).parameters.values() if p.default is not p.empty]
        assert not with_default, f"{cls.__name__}.__init__ has defaults for {with_default}: they belong in conf/"


def used(module, name):
    if name in ("alpha0", "alpha1", "beta0", "beta1"):
        return module.incentives[name]
    value = getattr(module, ATTRIBUTE.get(name, name))
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
        return [dataclasses.asdict(v) for v in value]
    return value


@pytest.mark.parametrize("algo", ALGOS)
def test_print_config_is_what_the_module_uses(algo, tmp_path, monkeypatch):
    from collab.fit import build_cli

    monkeypatch.chdir(tmp_path)
    cli = build_cli(algo, ["--model.base.name", "tiny", "--trainer.accelerator", "cpu", "--trainer.logger", "false"])
    printed = cli.config.as_dict()["model"]  # the values --print_config prints
    direct = from_config(algo, base={"name": "tiny"})
    compared = 0
    for name, value in printed.items():
        if name == "engine_options":  # vLLM settings, kept only with --model.engine vllm
            assert value is None and cli.model.engine_options is None
            continue
        if name == "agents":  # the entries say what differs from model.agent_defaults: the module holds both
            value = effective_agents(printed)
        assert used(cli.model, name) == value, (algo, name)
        assert used(direct, name) == value, (algo, name)
        compared += 1
    assert compared == len(printed) - 1 >= 14  # AT-GRPO, the fewest: MAGRPO's options less those it fixes


def test_from_config_overrides_and_refuses():
    module = from_config("magrpo", base={"name": "tiny"}, agents=None, ppo={"clip": 0.1})
    assert module.ppo.clip == 0.1 and module.agent_specs is None and module.base.name == "tiny"
    with pytest.raises(UserError, match=r"model.clip is not an option of --algo magrpo; valid: .*ppo"):
        from_config("magrpo", clip=0.1)


@pytest.mark.parametrize("algo", ALGOS)
def test_a_part_of_a_group_keeps_the_rest_from_conf(algo, tmp_path, monkeypatch):
    """``--model.ppo.clip``, a ``--config`` file that sets one member, ``from_config(ppo={...})``: the other members
    are conf/'s (the groups' dataclasses have no defaults to fall back on)."""
    from collab.fit import build_cli

    monkeypatch.chdir(tmp_path)
    own = tmp_path / "own.yaml"
    own.write_text("model:\n  ppo: {num_epochs: 3}\n")
    common = ["--model.base.name", "tiny", "--trainer.accelerator", "cpu", "--trainer.logger", "false"]
    packaged = from_config(algo, base={"name": "tiny"})
    for module, changed in (
        (build_cli(algo, [*common, "--model.ppo.clip", "0.1"]).model, {"clip": 0.1}),
        (build_cli(algo, [*common, "--config", str(own)]).model, {"num_epochs": 3}),
        (from_config(algo, base={"name": "tiny"}, ppo={"minibatch_size": 2}), {"minibatch_size": 2}),
    ):
        assert dataclasses.asdict(module.ppo) == {**dataclasses.asdict(packaged.ppo), **changed}
    if hasattr(packaged, "value_head"):
        module = build_cli(algo, [*common, "--model.value_head.lr", "0.5"]).model
        assert dataclasses.asdict(module.value_head) == {**dataclasses.asdict(packaged.value_head), "lr": 0.5}


TEAM = [{"sampling": {"max_new_tokens": 7}}, {"sampling": {"max_new_tokens": 9}}]
"""Two agents that set only their length: conf/algo/marft_a.yaml's agents set lr (1e-4, 1e-3)."""


@pytest.mark.parametrize("source", ["--config", "--model", "--model.agents", "one agent"])
def test_a_later_team_replaces_the_packaged_team_whole(source, tmp_path, capsys):
    """A team given after the packaged config (a ``--config`` file, a ``--model`` file, the option itself)
    replaces the packaged agents whole, as ``from_config(agents=...)`` does: no packaged ``lr`` is kept, and what the
    entries leave out is ``model.agent_defaults``' (temperature 0.7), whatever the team's size. (jsonargparse merged
    a list of the same length item by item: the debate grid's MARFT runs kept marft_a.yaml's two rates; one agent
    replaced the list, so the result hung on the team's size.)"""
    import json

    import yaml

    from collab.fit import print_config

    team = TEAM[:1] if source == "one agent" else TEAM
    path = tmp_path / "team.yaml"
    if source == "--config":
        path.write_text(yaml.safe_dump({"model": {"agents": team}}))
        argv = ["--config", str(path)]
    elif source == "--model":
        path.write_text(yaml.safe_dump({"agents": team}))
        argv = [f"--model={path}"]
    else:
        argv = ["--model.agents", json.dumps(team)]
    with pytest.raises(SystemExit):
        print_config("marft_a", argv + ["--print_config"])
    agents = effective_agents(yaml.safe_load(capsys.readouterr().out)["model"])
    direct = [dataclasses.asdict(a) for a in from_config("marft_a", base={"name": "tiny"}, agents=team).agent_specs]
    assert agents == direct
    assert [(a["lr"], a["sampling"]["temperature"], a["sampling"]["max_new_tokens"]) for a in agents] == [
        (None, 0.7, 7),
        (None, 0.7, 9),
    ][: len(team)]


def test_parser_args_reset_the_team_before_each_source_that_sets_it(tmp_path):
    import yaml

    from collab.config import parser_args, read_command_line

    team, other = tmp_path / "team.yaml", tmp_path / "other.yaml"
    team.write_text("model:\n  agents: [{lr: 0.1}]\n")
    other.write_text("model:\n  agent_lr: 0.1\n")
    argv = [
        "--config",
        str(other),
        f"--config={team}",
        "--model.agents",
        "[]",
        "--model.agent_lr",
        "1",
        "--model.agents=null",
    ]
    args = parser_args({"model": {"agents": [{"lr": 0.5}]}}, read_command_line(argv))
    assert yaml.safe_load(args[1]) == {"model": {"agents": [{"lr": 0.5}]}} and args[0] == "--config"
    assert args[2:] == [
        "--config",
        str(other),
        "--model.agents",
        "null",
        f"--config={team}",
        "--model.agents",
        "null",
        "--model.agents",
        "[]",
        "--model.agent_lr",
        "1",
        "--model.agents",
        "null",
        "--model.agents=null",
    ]


def _preset_runs():
    """(config, algo, extra argv) for every preset (with each algorithm it is for) and every grid config of
    conf/compare (with each algorithm, on debate)."""
    root = ROOT / "conf"
    runs = [(p, a, []) for p, a in preset_runs()]
    runs += [(p, a, ["--data.env", "debate"]) for p in sorted((root / "compare").glob("*.yaml")) for a in ALGOS]
    return [pytest.param(*run, id=f"{run[0].parent.name}/{run[0].stem}-{run[1]}") for run in runs]


@pytest.mark.parametrize("config,algo,extra", _preset_runs())
def test_a_config_gets_its_own_team(config, algo, extra, capsys):
    """Every preset and grid config that names a team gets that team, its unset fields at its own
    ``model.agent_defaults`` (else conf/base.yaml's): before the whole-list rule the MARFT-A, MARFT-T and IPPO paper
    presets (agent_lr 1e-6 to 3e-5, the papers') trained at the packaged small-model rates of their agents (1e-4
    with 1e-3 or 3e-4)."""
    import yaml

    from collab.fit import print_config

    model = yaml.safe_load(config.read_text()).get("model") or {}
    team = model.get("agents")
    if team is None:
        pytest.skip(f"{config.name} keeps the algorithm's team")
    with pytest.raises(SystemExit):
        print_config(algo, ["--config", str(config), *extra, "--print_config"])
    agents = effective_agents(yaml.safe_load(capsys.readouterr().out)["model"])
    block = {"agent_defaults": model["agent_defaults"]} if "agent_defaults" in model else {}
    direct = from_config(algo, base={"name": "tiny"}, agents=team, **block)
    assert agents == [dataclasses.asdict(a) for a in direct.agent_specs]


def test_null_is_a_value_of_an_option_typed_with_several_types_and_none(tmp_path, monkeypatch):
    """``micro_batch_tokens: int | "auto" | None``: ``null`` (one pass) from the command line and from Python, where
    jsonargparse alone reads it as missing; a value of none of the types is still refused in one line."""
    from collab.fit import build_cli

    monkeypatch.chdir(tmp_path)
    common = ["--model.base.name", "tiny", "--trainer.accelerator", "cpu", "--trainer.logger", "false"]
    cli = build_cli("magrpo", [*common, "--model.micro_batch_tokens", "null"])
    assert cli.model.micro_batch_tokens is None
    assert build_cli("magrpo", [*common, "--model.micro_batch_tokens", "64"]).model.micro_batch_tokens == 64
    assert from_config("magrpo", base={"name": "tiny"}, micro_batch_tokens=None).micro_batch_tokens is None
    assert from_config("magrpo", base={"name": "tiny"}).micro_batch_tokens == "auto"  # the packaged default
    with pytest.raises(UserError, match="micro_batch_tokens"):
        build_cli("magrpo", [*common, "--model.micro_batch_tokens", "many"])
    with pytest.raises(UserError, match="micro_batch_tokens"):
        from_config("magrpo", base={"name": "tiny"}, micro_batch_tokens="many")


# -- the dataclasses the constructors take --------------------------------------------------------------------------
UNSET = (None, "")
"""Defaults that give no value: an agent's field left to ``model.agent_defaults`` (an empty role: the env's)."""


def option_dataclasses(hint) -> list[tuple[type, bool]]:
    """The dataclasses in an option's type hint, each with whether it is the option itself (``ppo: PPOOptions``,
    ``base: BaseConfig``) rather than an item of it (``agents: list[AgentSpec]``)."""
    import typing

    if dataclasses.is_dataclass(hint):
        return [(hint, True)]
    out = []
    for arg in typing.get_args(hint):
        item = typing.get_origin(hint) in (list, tuple)
        out += [(cls, whole and not item) for cls, whole in option_dataclasses(arg)]
    return out


def disagreements(cls: type, conf, path: str) -> list[str]:
    """The fields of ``cls`` whose default is a value (not unset) other than ``conf``'s, at any depth (``conf`` None:
    the option holds items, so a default may only be unset)."""
    out = []
    for f in dataclasses.fields(cls):
        value = conf.get(f.name) if isinstance(conf, dict) else None
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out += disagreements(type(default), value, f"{path}.{f.name}")
        elif default is not dataclasses.MISSING and default not in UNSET and default != value:
            out.append(f"{path}.{f.name}: {default!r} in {cls.__name__}, {value!r} in conf/")
    return out


def test_a_default_against_conf_is_found():
    @dataclasses.dataclass
    class Inner:
        width: int = 3
        left: str | None = None

    @dataclasses.dataclass
    class Outer:
        rate: float
        inner: Inner = dataclasses.field(default_factory=Inner)
        flag: bool = False

    assert disagreements(Outer, {"rate": 1.0, "inner": {"width": 3}, "flag": False}, "model.o") == []
    assert disagreements(Outer, {"inner": {"width": 4}, "flag": True}, "model.o") == [
        "model.o.inner.width: 3 in Inner, 4 in conf/",
        "model.o.flag: False in Outer, True in conf/",
    ]
    assert disagreements(Outer, None, "model.o") == [
        "model.o.inner.width: 3 in Inner, None in conf/",
        "model.o.flag: False in Outer, None in conf/",
    ]


@pytest.mark.parametrize("algo", ALGOS)
def test_no_dataclass_default_disagrees_with_conf(algo):
    """Every dataclass an algorithm's constructor takes (the option groups, the critics' spec, the base, the agents'
    specs) has no default, an unset one, or conf/'s value: a class used from Python without conf/ (a test, a
    notebook) cannot quietly run with another value than the command line."""
    import typing

    from collab.config import packaged_config

    model = packaged_config(algo)["model"]
    checked, bad = set(), []
    for cls in algo_registry()[algo].__mro__:
        init = cls.__dict__.get("__init__")
        if init is None or not cls.__module__.startswith("collab."):
            continue
        for name, hint in typing.get_type_hints(init).items():
            for option, whole in option_dataclasses(hint):
                checked.add(option.__name__)
                bad += disagreements(option, model.get(name) if whole else None, f"model.{name}")
    assert not bad, bad
    assert {"BaseConfig", "AgentSpec", "AgentDefaults", "PPOOptions"} <= checked, checked
