"""Every agent's defaults in one place: ``model.agent_defaults`` (``conf/base.yaml``) is what an agent takes for each
fine-tuning, LoRA and sampling field it leaves out, field by field; no dataclass supplies a value of its own.

The expected values are read here from the YAML files themselves, in the order ``collab.config`` composes them
(the block of ``conf/base.yaml``, then the env's, the algorithm's, the env's ``algos:`` section's, each
``--config`` file's, each ``--model.agent_defaults.KEY`` option; the team of the last source that names one),
each entry laid over the block (:func:`tests.support.presets.overlay`), and compared with the agents the module
built from the command line's parse holds. Composes and instantiates the modules only: no model is loaded but the
tiny one, once."""

from __future__ import annotations

import dataclasses
import re
import shlex

import pytest
import yaml

from collab.algos import algo_registry, from_config
from collab.algos.configured import instantiate
from collab.policy.specs import AgentDefaults, AgentSpec, LoraSpec, SamplingSpec, check_agent_defaults
from tests.support.algos import settings
from tests.support.presets import ROOT, composed, overlay, preset_runs

CONF = ROOT / "conf"
ALGOS = sorted(algo_registry())
BLOCK_FIELDS = ("finetune", "lora", "sampling")
NULLABLE = {"sampling.max_new_tokens"}
"""Block fields whose null is a value: the env role's length."""


def load(path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def base_block() -> dict:
    return load(CONF / "base.yaml")["model"]["agent_defaults"]


# -- what conf/ says, read apart from collab.config --------------------------------------------------------------
def packaged_sources(algo: str, env: str) -> list[dict]:
    """The ``model`` sections of the packaged layers of ``--algo algo`` on ``env``, in order."""
    env_file = load(CONF / "env" / f"{env}.yaml")
    own = (env_file.get("algos") or {}).get(algo) or {}
    layers = [load(CONF / "base.yaml"), env_file, load(CONF / "algo" / f"{algo}.yaml"), own]
    return [layer.get("model") or {} for layer in layers]


def run_env(algo: str, argv: list[str]) -> str:
    env = load(CONF / "algo" / f"{algo}.yaml")["data"]["env"]
    for name, value in zip(argv, argv[1:]):
        if name == "--config":
            env = (load(ROOT / value).get("data") or {}).get("env", env)
        elif name == "--data.env":
            env = value
    return env


def expected(algo: str, argv: list[str]) -> tuple[dict, list[dict] | None]:
    """(the run's block, its agents as they train: each entry over the block), from the files and options."""
    sources = packaged_sources(algo, run_env(algo, argv))
    block, team = {}, None
    for model in sources:
        block = overlay(block, model.get("agent_defaults") or {})
        team = model["agents"] if "agents" in model else team
    for name, value in zip(argv, argv[1:]):
        if name == "--config":
            model = load(ROOT / value).get("model") or {}
            block = overlay(block, model.get("agent_defaults") or {})
            team = model["agents"] if "agents" in model else team
        elif name == "--model.agents":
            team = yaml.safe_load(value)
        elif name.startswith("--model.agent_defaults."):
            keys = name.removeprefix("--model.agent_defaults.").split(".")
            block = overlay(
                block,
                {keys[0]: yaml.safe_load(value)} if len(keys) == 1 else {keys[0]: {keys[1]: yaml.safe_load(value)}},
            )
    return block, None if team is None else [overlay(block, entry) for entry in team]


# -- what the run trains with -----------------------------------------------------------------------------------
def built(algo: str, argv: list[str]):
    """The module of ``python -m collab.fit --algo algo ARGV``: its options as the command line parses them
    (``--print_config``), instantiated by the same parser group, on the tiny base (nothing is loaded)."""
    model = composed(algo, argv)["model"]
    return instantiate("model", algo_registry()[algo], {**model, "base": {"name": "tiny"}})


def trained(spec: AgentSpec) -> dict:
    return {k: v for k, v in dataclasses.asdict(spec).items() if k in (*BLOCK_FIELDS, "lr", "base")}


def check_run(algo: str, argv: list[str]) -> None:
    block, agents = expected(algo, argv)
    module = built(algo, argv)
    assert dataclasses.asdict(module.agent_defaults) == block
    check_agent_defaults(module.agent_defaults)
    if agents is None:
        assert module.agent_specs is None
        return
    want = [{k: a.get(k) for k in (*BLOCK_FIELDS, "lr", "base")} for a in agents]
    assert [trained(s) for s in module.agent_specs] == want
    for spec in module.agent_specs:  # nothing left unset, nothing from a dataclass
        assert spec.finetune is not None
        unset = [f"{part}.{f.name}" for part in ("lora", "sampling") for f in dataclasses.fields(getattr(spec, part))]
        assert [k for k in unset if _get(spec, k) is None and k not in NULLABLE] == []


def _get(spec, key: str):
    part, name = key.split(".")
    return getattr(getattr(spec, part), name)


# -- the dataclasses ---------------------------------------------------------------------------------------------
def defaults_of(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def nulls(value) -> bool:
    return all(nulls(v) for v in value.values()) if isinstance(value, dict) else value is None


def test_no_agent_dataclass_has_a_value_of_its_own():
    """A field left out is None ("unset") in every dataclass an agent is made of, so that only conf/ decides it."""
    for cls in (LoraSpec, SamplingSpec, AgentDefaults):
        assert nulls(defaults_of(cls)), cls.__name__
    spec = defaults_of(AgentSpec)
    assert nulls({k: spec[k] for k in (*BLOCK_FIELDS, "lr")}), spec


def test_the_block_of_conf_base_sets_every_field_in_range():
    block = base_block()
    assert set(block) == {f.name for f in dataclasses.fields(AgentDefaults)}
    for part, cls in (("lora", LoraSpec), ("sampling", SamplingSpec)):
        assert set(block[part]) == {f.name for f in dataclasses.fields(cls)}, part
        assert [k for k, v in block[part].items() if v is None and f"{part}.{k}" not in NULLABLE] == [], part
    from collab.policy.specs import packaged_defaults

    assert dataclasses.asdict(packaged_defaults()) == block
    check_agent_defaults(packaged_defaults())


def test_a_team_built_in_python_takes_conf_base_for_what_its_specs_leave_out():
    from collab.policy.models import BaseConfig
    from collab.policy.team import AgentTeam

    team = AgentTeam(
        [AgentSpec(sampling=SamplingSpec(max_new_tokens=3)), AgentSpec(lora=LoraSpec(r=4))], BaseConfig(name="tiny")
    )
    block = base_block()
    assert dataclasses.asdict(team.specs[0].sampling) == {**block["sampling"], "max_new_tokens": 3}
    assert dataclasses.asdict(team.specs[1].lora) == {**block["lora"], "r": 4}
    assert [s.finetune for s in team.specs] == [block["finetune"]] * 2


# -- every shipped run ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ALGOS)
def test_each_algorithms_default_run_keeps_its_agents(algo):
    """Each ``--algo`` default's agents: its team of tests/support/algos.py ((lr, max_new_tokens) each), every one a
    rank-8 all-linear LoRA adapter sampling at temperature 0.7, top-p 0.9: the values every measured default run
    trained with."""
    check_run(algo, [])
    lora = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["all-linear"]}
    got = [
        (
            s.lr,
            s.sampling.max_new_tokens,
            s.finetune,
            dataclasses.asdict(s.lora),
            s.sampling.temperature,
            s.sampling.top_p,
            s.sampling.top_k,
        )
        for s in built(algo, []).agent_specs
    ]
    assert got == [(lr, tokens, "lora", lora, 0.7, 0.9, 0) for lr, tokens in settings(algo).team]


def shipped_runs():
    runs = [(p, a, ["--config", str(p.relative_to(ROOT))]) for p, a in preset_runs()]
    for path in sorted((CONF / "compare").glob("*.yaml")):
        extra = ["--data.env", "debate"] if path.stem == "debate" else []
        runs += [
            (path, a, ["--config", str(path.relative_to(ROOT)), *extra])
            for a in ALGOS
            if path.stem == "debate" or a != "maporl"
        ]
    return [pytest.param(a, argv, id=f"{p.parent.name}/{p.stem}-{a}") for p, a, argv in runs]


@pytest.mark.parametrize("algo,argv", shipped_runs())
def test_every_preset_and_grid_config(algo, argv, monkeypatch):
    monkeypatch.chdir(ROOT)
    check_run(algo, argv)


def doc_examples() -> list[tuple[str, list[str]]]:
    """Each ``--model.agents VALUE`` of the README and docs/ (with the ``--algo``, ``--data.env`` and packaged
    ``--config`` of its command line, where it has them): (where, argv)."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text().replace("\\\n", " ")
        for n, line in enumerate(text.splitlines(), 1):
            for match in re.finditer(r"--model\.agents\s+('[^']*'|\"[^\"]*\"|null)", line):
                value = shlex.split(match.group(1))[0]
                algo = re.search(r"--algo\s+(\w+)", line)
                env = re.search(r"--data\.env\s+(\w+)", line)
                argv = ["--data.env", env.group(1)] if env else []
                argv += [a for c in re.findall(r"--config\s+(conf/\S+\.yaml)", line) for a in ("--config", c)]
                out.append((f"{path.name}:{n}", [algo.group(1) if algo else "magrpo", *argv, "--model.agents", value]))
    return out


EXAMPLES = doc_examples()


def test_the_docs_examples_are_found():
    assert any(where.startswith("README.md") for where, _ in EXAMPLES) and len(EXAMPLES) >= 6, EXAMPLES


@pytest.mark.parametrize("algo,argv", [pytest.param(a[0], a[1:], id=w) for w, a in EXAMPLES])
def test_every_docs_example_of_a_team(algo, argv, monkeypatch):
    monkeypatch.chdir(ROOT)
    check_run(algo, argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["--model.agents", "[{sampling: {max_new_tokens: 7}}]"],
        ["--model.agents", "[{lr: 0.5, finetune: full}, {sampling: {temperature: 0.2}, lora: {r: 4}}]"],
        ["--model.agents", "[{}, {}]", "--model.agent_defaults.sampling.top_p", "0.5"],
        ["--model.agent_defaults.lora.alpha", "32", "--model.agent_defaults.finetune", "full"],
        ["--model.agents", "null", "--model.agent_defaults.sampling.temperature", "1.0"],
    ],
    ids=["one-agent", "two-agents", "block-option", "block-over-packaged-team", "null"],
)
def test_a_team_given_on_the_command_line(argv):
    check_run("marft_a", argv)


def test_readme_example_samples_at_conf_values():
    """The README's full-parameter example: both agents at conf/base.yaml's temperature and top-p (they sampled at
    a dataclass's 1.0 before the block)."""
    argv = ["--data.env", "matrix", "--model.agents", "[{finetune: full, lr: 5.0e-6}, {}]"]
    specs = built("magrpo", argv).agent_specs
    block = base_block()["sampling"]
    assert [(s.finetune, s.lr, s.sampling.temperature, s.sampling.top_p) for s in specs] == [
        ("full", 5e-6, block["temperature"], block["top_p"]),
        ("lora", None, block["temperature"], block["top_p"]),
    ]


# -- roles, Python, --explain ----------------------------------------------------------------------------------
def test_roles_past_the_last_agent_and_null_teams_take_the_block():
    from collab.envs import make_env

    env = make_env("matrix", players=3)
    module = built(
        "magrpo",
        ["--model.agents", "[{sampling: {max_new_tokens: 7}}]", "--model.agent_defaults.sampling.temperature", "1.0"],
    )
    specs = module.team_specs(env)
    assert [(s.role, s.sampling.temperature, s.sampling.max_new_tokens) for s in specs] == [
        (r.name, 1.0, 7) for r in env.roles
    ]
    specs = built("magrpo", ["--model.agents", "null"]).team_specs(env)
    block = base_block()
    assert all(dataclasses.asdict(s.sampling) == {**block["sampling"], "max_new_tokens": 1} for s in specs)
    assert all(s.finetune == block["finetune"] and dataclasses.asdict(s.lora) == block["lora"] for s in specs)


def test_from_config_fills_agents_from_the_block_and_merges_a_block_override():
    spec = AgentSpec(sampling=SamplingSpec(max_new_tokens=5))
    module = from_config("magrpo", base={"name": "tiny"}, agents=[spec, AgentSpec(lr=0.1)])
    block = base_block()
    assert dataclasses.asdict(module.agent_specs[0].sampling) == {**block["sampling"], "max_new_tokens": 5}
    assert module.agent_specs[1].lr == 0.1 and dataclasses.asdict(module.agent_specs[1].lora) == block["lora"]
    module = from_config(
        "magrpo", base={"name": "tiny"}, agents=[spec], agent_defaults={"sampling": {"temperature": 1.0}}
    )
    assert dataclasses.asdict(module.agent_specs[0].sampling) == {
        **block["sampling"],
        "temperature": 1.0,
        "max_new_tokens": 5,
    }
    module = from_config("magrpo", base={"name": "tiny"}, agents=[spec], agent_defaults=AgentDefaults(finetune="full"))
    assert (
        module.agent_specs[0].finetune == "full" and module.agent_defaults.sampling.top_p == block["sampling"]["top_p"]
    )


def test_explain_shows_each_agents_values_and_their_source(tmp_path, capsys):
    from collab.fit import main

    own = tmp_path / "own.yaml"
    own.write_text(
        "model:\n  agent_defaults: {sampling: {temperature: 1.0}}\n  agents: [{lr: 0.5}, {sampling: {top_k: 5}}]\n"
    )
    argv = ["--algo", "magrpo", "--data.env", "matrix", "--model.base.name", "tiny", "--config", str(own)]
    assert main([*argv, "--model.agent_defaults.lora.r", "4", "--explain"]) == 0
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["model.agents[0].sampling.temperature"] == f"1.0  # --config {own} (model.agent_defaults)"
    assert lines["model.agents[0].sampling.top_p"] == "0.9  # base.yaml (model.agent_defaults)"
    assert lines["model.agents[0].lora.r"] == "4  # --model.agent_defaults.lora.r (model.agent_defaults)"
    assert lines["model.agents[0].lora.target_modules"] == "[all-linear]  # base.yaml (model.agent_defaults)"
    assert lines["model.agents[0].finetune"] == "lora  # base.yaml (model.agent_defaults)"
    assert lines["model.agents[0].lr"] == f"0.5  # --config {own}"
    assert lines["model.agents[1].lr"] == "0.001  # base.yaml (model.agent_lr)"
    assert lines["model.agents[1].sampling.top_k"] == f"5  # --config {own}"
    assert lines["model.agents[1].sampling.max_new_tokens"] == "null  # base.yaml (model.agent_defaults)"
    assert lines["model.agent_defaults.sampling.temperature"] == f"1.0  # --config {own}"
