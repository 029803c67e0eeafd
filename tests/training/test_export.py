"""``python -m collab.export RUN_DIR OUT``: a real run exported, and each agent loaded without collab.

Two runs made with ``python -m collab.fit`` on the matrix game:

- MAGRPO on the ``tiny`` base, 2 updates, adapters saved after each (``step_1``, ``step_2``, ``last``), exported
  with ``--merge``. The ``tiny`` base exists nowhere else, so the export writes it to ``OUT/base``;
- CoLLM-CC on two architectures: agent 0 (and the centralized critic) on a local Llama folder, agent 1 on a Qwen2
  folder with another tokenizer and chat template, exported by the command line with ``--base-id`` naming the Qwen2
  folder's hub id.

Each exported agent, loaded with plain transformers + peft (``PeftModel.from_pretrained`` on the base its folder
names, ``AutoPeftModelForCausalLM`` offline, the merged folder with ``AutoModelForCausalLM`` alone), gives the
log-probs collab's team gives with the run's adapters (``AgentTeam.logprobs``, the agent's temperature and action
vocabulary from the manifest), to float32 noise relative to their size; the adapters change the base's logits by
far more than that, so a wrong or missing adapter fails. Bad input ends in one ``error:`` line and writes nothing.
A MAGRPO run with a full-parameter agent exports it as a whole model folder that ``AutoModelForCausalLM`` loads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support import warm

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")  # build_cli in-process, as evaluate's

ROOT = Path(__file__).resolve().parents[2]
RTOL = 1e-4
POLICY = "{temperature: 1.0, top_p: 1.0}"
"""The sampling of the teams given here: the policy itself (temperature 1, no top-p)."""
"""Two float32 forwards of the same weights (batched and padded vs one row; LoRA vs merged weights) differ by
about 1e-6 of the values' size; an adapter left out changes the logits by 1e-2 of it or more."""
CALLBACKS = """
trainer:
  callbacks:
  - class_path: collab.training.callbacks.ModelCheckpoint
    init_args: {save_last: true}
  - class_path: collab.training.callbacks.AdapterCheckpoint
    init_args: {every_n_steps: 1}
"""
"""Adapters after every update, and no held-out evaluation (the run stays short)."""
COMPLETION = ["A", "B", "B", "A"]
"""Teacher-forced actions (the matrix game's closed vocabulary, one token each)."""


def command(module: str, *args, cwd, env_extra=None, timeout=300):
    """``python -m module args``, forked warm (tests/support/warm.py)."""
    return warm.run(list(args), cwd, warm.child_env(OMP_NUM_THREADS="1", **(env_extra or {})), module, timeout)


def train(root: Path, algo: str, *args) -> Path:
    (root / "callbacks.yaml").write_text(CALLBACKS)
    result = command(
        "collab.fit",
        "--algo",
        algo,
        "--data.env",
        "matrix",
        "--config",
        "callbacks.yaml",
        "--trainer.accelerator",
        "cpu",
        "--model.agent_lr",
        "1e-2",
        "--data.batch_size",
        "1",
        *args,
        cwd=root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "runs" / algo / "version_0"


def collab_module(run: Path, algo: str, adapters: str = "last"):
    """The run's team as collab builds it (as ``collab.evaluate`` does), with the run's adapters."""
    from collab.fit import build_cli

    cli = build_cli(
        algo, ["--config", str(run / "config.yaml"), "--trainer.logger", "false", "--model.base.device", "cpu"]
    )
    cli.model.build(cli.datamodule.env)
    cli.model.team.load_adapters(run / "adapters" / adapters)
    return cli.model


def chat(agent: dict) -> list[dict]:
    return [
        {"role": "system", "content": agent["system_prompt"]},
        {"role": "user", "content": "Round 1. Your partner has not played yet. Choose A or B."},
    ]


def policy_logprobs(model, tokenizer, agent: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs of COMPLETION under the agent's policy as the manifest describes it, the raw logits), from a
    plain transformers/peft ``model`` and the exported tokenizer."""
    prompt = tokenizer.apply_chat_template(chat(agent), add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"
    ]
    completion = [tokenizer.encode(c, add_special_tokens=False)[0] for c in COMPLETION]
    choices = torch.tensor([tokenizer.encode(c, add_special_tokens=False)[0] for c in agent["choices"]])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    scaled = logits / agent["sampling"]["temperature"]
    masked = torch.full_like(scaled, float("-inf"))
    masked[:, choices] = scaled[:, choices]
    return masked.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1), logits


def team_logprobs(module, i: int, agent: dict) -> torch.Tensor:
    team = module.team
    prompt = team.encode(i, chat(agent))
    completion = [team.tokenizer_of(i).encode(c, add_special_tokens=False)[0] for c in COMPLETION]
    with torch.no_grad():
        return team.logprobs(i, [prompt], [completion])[0].float()


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    scale = expected.abs().max().clamp_min(1.0)
    assert (actual - expected).abs().max() <= RTOL * scale, (actual, expected)


def peft_agent(out: Path, agent: dict):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(agent["base"] if Path(agent["base"]).exists() else agent["trained_on"])
    return PeftModel.from_pretrained(base, out / agent["folder"]).eval(), AutoTokenizer.from_pretrained(
        out / agent["folder"]
    )


def test_which_base_an_adapter_names(tmp_path):
    """The embedded default by its hub id, a hub id as itself, ``tiny`` as ``OUT/base``, a local folder by its absolute
    path or the hub id ``--base-id`` gives it (alone, or as FOLDER=HUB_ID among several folders)."""
    from collab.errors import UserError
    from collab.export.checks import base_ids
    from collab.export.writing import base_reference

    out = tmp_path / "out"
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
    assert base_reference("smollm2-135m-instruct", out, {}) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_reference("Qwen/Qwen2.5-0.5B-Instruct", out, {}) == "Qwen/Qwen2.5-0.5B-Instruct"
    assert base_reference("tiny", out, {}) == str(out.resolve() / "base")
    assert base_reference(str(folders[0]), out, {}) == str(folders[0].resolve())
    assert base_ids(["org/a"], ["tiny", str(folders[0])]) == {str(folders[0]): "org/a"}
    two = [str(folders[0]), str(folders[1]), "tiny"]
    assert base_ids([f"{folders[1]}=org/b"], two) == {str(folders[1]): "org/b"}
    for given, message in [
        (["org/a"], "2 local-folder bases"),
        ([f"{tmp_path / 'c'}=org/c"], "not a local-folder base"),
        (["not-a-hub-id"], "expected a hub id"),
    ]:
        with pytest.raises(UserError, match=message):
            base_ids(given, two)


# -- the tiny MAGRPO run -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def magrpo(tmp_path_factory):
    """(run folder, OUT, manifest): 2 updates on ``tiny``, exported in-process with ``--merge``."""
    from collab.export import export

    root = tmp_path_factory.mktemp("magrpo")
    run = train(root, "magrpo", "--model.base.name", "tiny", "--model.ppo.num_epochs", "1", "--trainer.max_steps", "2")
    out = root / "exported"
    manifest = export(run, out, merge_agents=True)
    return run, out, manifest


@pytest.fixture(scope="module")
def magrpo_team(magrpo):
    return collab_module(magrpo[0], "magrpo")


def test_manifest_and_agent_folders(magrpo):
    run, out, manifest = magrpo
    assert json.loads((out / "team.json").read_text()) == manifest
    assert (manifest["algorithm"], manifest["env"]) == ("magrpo", "matrix")
    assert manifest["source"] == {"run_dir": str(run.resolve()), "adapters": "last", "step": 2}
    assert manifest["left_out"] == [] and manifest["turn_order"] is None
    assert [a["role"] for a in manifest["agents"]] == ["player1", "player2"]
    for i, agent in enumerate(manifest["agents"]):
        folder = out / f"agent{i}"
        assert agent["folder"] == f"agent{i}" and agent["base"] == str((out / "base").resolve())
        assert agent["system_prompt"].startswith("You are playing a game") and agent["choices"] == ["A", "B"]
        saved = json.loads((run / "adapters" / "last" / f"agent{i}" / "agent.json").read_text())
        assert agent["sampling"] == saved["sampling"] and agent["lora"]["r"] == saved["lora"]["r"]
        assert (folder / "adapter_model.safetensors").read_bytes() == (
            run / "adapters" / "last" / f"agent{i}" / "adapter_model.safetensors"
        ).read_bytes()
        assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == agent["base"]
        assert json.loads((folder / "collab_agent.json").read_text())["role"] == agent["role"]
        card = (folder / "README.md").read_text()
        assert agent["role"] in card and agent["system_prompt"] in card
    assert "--max-lora-rank 8" in manifest["serve"][0] and "agent1=" in manifest["serve"][0]
    assert not list(out.parent.glob(".exported-*")), "the temporary folder is left behind"


def test_peft_agents_give_the_teams_logprobs(magrpo, magrpo_team):
    """Each agent as plain peft over ``OUT/base``: the team's policy log-probs, its prompt tokens and chat template."""
    _, out, manifest = magrpo
    for i, agent in enumerate(manifest["agents"]):
        model, tokenizer = peft_agent(out, agent)
        ids = tokenizer.apply_chat_template(chat(agent), add_generation_prompt=True, tokenize=True, return_dict=True)
        assert ids["input_ids"] == magrpo_team.team.encode(i, chat(agent))
        logprobs, logits = policy_logprobs(model, tokenizer, agent)
        assert_close(logprobs, team_logprobs(magrpo_team, i, agent))
        with model.disable_adapter():
            _, base_logits = policy_logprobs(model, tokenizer, agent)
        assert (logits - base_logits).abs().max() > 100 * RTOL * logits.abs().max(), "the adapter changes nothing"


def test_merged_agents_equal_their_peft_models(magrpo):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, out, manifest = magrpo
    for agent in manifest["agents"]:
        folder = out / agent["merged"]
        merged = AutoModelForCausalLM.from_pretrained(folder).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder)
        assert not any("lora" in n for n in merged.state_dict()) and merged.dtype == torch.float32
        peft_model, _ = peft_agent(out, agent)
        assert_close(policy_logprobs(merged, tokenizer, agent)[1], policy_logprobs(peft_model, tokenizer, agent)[1])
        assert merged.generation_config.temperature == agent["sampling"]["temperature"]


def test_auto_peft_loads_offline_from_anywhere(magrpo, tmp_path):
    """``AutoPeftModelForCausalLM.from_pretrained(OUT/agent0)`` in a fresh process, offline, in another folder."""
    _, out, manifest = magrpo
    script = (
        f"import torch; from peft import AutoPeftModelForCausalLM; "
        f"m = AutoPeftModelForCausalLM.from_pretrained({str(out / 'agent0')!r}).eval(); "
        f"print(m(input_ids=torch.tensor([[1, 5, 9, 42]])).logits[0, -1].tolist())"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    model, _ = peft_agent(out, manifest["agents"][0])
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([[1, 5, 9, 42]])).logits[0, -1]
    assert_close(torch.tensor(json.loads(result.stdout.strip().splitlines()[-1])), expected)


def test_a_step_folder_and_an_unmatched_checkpoint(magrpo, tmp_path):
    """``--adapters step_1`` exports that step's weights; ``last`` names the checkpoint's step only when the
    checkpoint holds the same adapters (here a copy of the run whose ``last`` adapters are step 1's: unknown)."""
    from collab.export import export

    run, _, _ = magrpo
    step1 = run / "adapters" / "step_1" / "agent0" / "adapter_model.safetensors"
    assert step1.read_bytes() != (run / "adapters" / "last" / "agent0" / "adapter_model.safetensors").read_bytes()
    manifest = export(run, tmp_path / "step1", adapters="step_1")
    assert (
        manifest["source"]["step"] == 1
        and (tmp_path / "step1" / "agent0" / "adapter_model.safetensors").read_bytes() == step1.read_bytes()
    )
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "adapters" / "last")
    shutil.copytree(run / "adapters" / "step_1", copy / "adapters" / "last")
    assert export(copy, tmp_path / "mismatch", algo="magrpo")["source"]["step"] is None


def test_bad_input_is_one_line_and_writes_nothing(magrpo, tmp_path, capsys):
    from collab.export import main

    run, _, _ = magrpo
    empty_run = tmp_path / "empty_run"
    empty_run.mkdir()
    shutil.copy(run / "config.yaml", empty_run / "config.yaml")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    cases = [
        ([str(tmp_path / "nope"), str(tmp_path / "o1")], "run folder not found"),
        ([str(tmp_path), str(tmp_path / "o2")], "has no config.yaml"),
        ([str(empty_run), str(tmp_path / "o3")], "no adapters in"),
        ([str(run), str(tmp_path / "o4"), "--adapters", "step_9"], "valid: last, step_1, step_2"),
        ([str(run), str(full)], "exists and is not empty"),
        ([str(run), str(tmp_path / "o5"), "--base-id", "org/model"], "0 local-folder bases"),
        ([str(run)], "required: out"),
    ]
    for argv, expected in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty_run", "full"]
    assert [p.name for p in full.iterdir()] == ["keep.txt"]


# -- CoLLM-CC on two architectures ------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_bases(tmp_path_factory):
    """(run, OUT, manifest, qwen2 folder): agent 0 and the critic on a Llama folder, agent 1 on a Qwen2 folder with
    another tokenizer; exported by the command line."""
    sys.path.insert(0, str(ROOT))
    from tests.support.architectures import model_dir, other_tokenizer

    root = tmp_path_factory.mktemp("two_bases")
    llama = model_dir("llama", root / "models")
    qwen2 = model_dir("qwen2", root / "models", tokenizer=other_tokenizer(root / "models"))
    run = train(
        root,
        "collm_cc",
        "--model.base.name",
        llama,
        "--model.agents",
        f"[{{base: null, sampling: {POLICY}}}, {{base: {qwen2}, sampling: {POLICY}}}]",
        "--trainer.max_steps",
        "1",
    )
    out = root / "exported"
    result = command("collab.export", str(run), str(out), "--base-id", f"{qwen2}=Qwen/Qwen2-0.5B", cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "not exported: critics" in result.stdout
    return run, out, json.loads((out / "team.json").read_text()), qwen2


def test_two_architectures_with_a_critic(two_bases):
    """Each agent names its own base; the critic is left out and said to be; agent 1's tokenizer is its base's."""
    run, out, manifest, qwen2 = two_bases
    module = collab_module(run, "collm_cc")
    llama = module.team.base_config.name
    agents = manifest["agents"]
    assert [a["base"] for a in agents] == [str(Path(llama).resolve()), "Qwen/Qwen2-0.5B"]
    assert agents[1]["trained_on"] == str(Path(qwen2).resolve())
    assert "base_model: Qwen/Qwen2-0.5B" in (out / "agent1" / "README.md").read_text()
    assert len(manifest["serve"]) == 2 and manifest["serve"][1].startswith("vllm serve Qwen/Qwen2-0.5B ")
    [critics] = manifest["left_out"]
    assert critics["part"] == "critics" and [c["base"] for c in critics["critics"]] == [llama]
    assert not (out / "critic0").exists() and sorted(p.name for p in out.iterdir()) == ["agent0", "agent1", "team.json"]
    for i, agent in enumerate(agents):
        model, tokenizer = peft_agent(out, agent)
        assert type(model.get_base_model()).__name__ == ["LlamaForCausalLM", "Qwen2ForCausalLM"][i]
        assert ("### Assistant:" in tokenizer.chat_template) == (i == 1)
        assert_close(policy_logprobs(model, tokenizer, agent)[0], team_logprobs(module, i, agent))


# -- a full-parameter agent ------------------------------------------------------------------------------
def test_a_full_agent_exports_as_a_whole_model(tmp_path, monkeypatch, capsys):
    """MAGRPO with agent 0 full-parameter and agent 1 LoRA, 2 updates (in-process): the export writes agent 0 as a
    folder ``AutoModelForCausalLM`` loads alone, holding the checkpoint's trained weights and giving the team's policy
    log-probs (its generation config samples as the agent does), ``finetune: full`` in team.json with a ``vllm
    serve`` of its own, beside agent 1's peft folder; ``collab.evaluate`` plays the run's ``adapters/last`` and its
    checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from collab.evaluate import main as evaluate
    from collab.export import export
    from tests.support import TINY_CLI, fit, load

    monkeypatch.chdir(tmp_path)
    team = f"[{{finetune: full, sampling: {POLICY}}}, {{sampling: {POLICY}}}]"  # a signal in 2 steps of 4 draws
    args = ["--data.env", "matrix", "--data.env_options", "{}", "--model.agents", team]
    run = fit(tmp_path, "magrpo", [*args, "--model.agent_lr", "1e-3"], 2)
    out = tmp_path / "out"
    manifest = export(run, out)
    full, lora = manifest["agents"]
    assert (full["finetune"], full["model"], full["lora"], full["base"]) == ("full", "agent0", None, None)
    assert lora["finetune"] == "lora" and lora["lora"]["r"] == 8 and lora["base"] == str((out / "base").resolve())
    assert json.loads((out / "team.json").read_text()) == manifest
    assert f"vllm serve {out.resolve() / 'agent0'} --served-model-name agent0" in manifest["serve"]
    assert "agent1=" in manifest["serve"][1] and "agent0=" not in manifest["serve"][1]
    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(out / "agent0"),
        AutoTokenizer.from_pretrained(out / "agent0"),
    )
    prefix = "team.models.full0."
    trained = {k[len(prefix) :]: v for k, v in load(run)["state_dict"].items() if k.startswith(prefix)}
    assert trained.keys() == dict(model.named_parameters()).keys()
    assert all(torch.equal(p, trained[n]) for n, p in model.named_parameters())
    assert model.generation_config.do_sample and model.generation_config.temperature == full["sampling"]["temperature"]
    module = collab_module(run, "magrpo")
    ours, logits = policy_logprobs(model.eval(), tokenizer, full)
    assert_close(ours, team_logprobs(module, 0, full))
    untrained, _ = policy_logprobs(module.team.untrained(0).get_base_model(), tokenizer, full)
    assert (ours - untrained).abs().max() > 100 * RTOL  # the trained weights, not the base's
    assert "AutoModelForCausalLM" in (out / "agent0" / "README.md").read_text()
    assert (out / "agent1" / "adapter_model.safetensors").is_file()
    capsys.readouterr()
    argv = ["--algo", "magrpo", *TINY_CLI, *args, "--num_samples", "2", "--k", "1", "--max_tasks", "1"]
    assert evaluate([*argv, "--adapters", str(run / "adapters" / "last")]) == 0
    assert f"weights: {run / 'adapters' / 'last'}" in capsys.readouterr().out
    assert evaluate([*argv, "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]) == 0  # the full model from it
    assert f"weights: {run / 'checkpoints' / 'last.ckpt'}" in capsys.readouterr().out
