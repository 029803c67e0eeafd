"""``python -m collab.export RUN_DIR OUT [--adapters last|step_N] [--merge] [--base-id [BASE=]HUB_ID] [--algo NAME]``.

Turns a trained run (``runs/ALGO/version_N``) into folders that plain transformers, peft and vLLM load
without collab (docs/export.md):

- ``OUT/agentI/``: agent I as a standalone peft adapter (``adapter_model.safetensors`` copied byte for byte,
  ``adapter_config.json`` whose ``base_model_name_or_path`` names the base, see below), the tokenizer collab
  used (its chat template included), ``collab_agent.json`` (role, system prompt, sampling settings, closed
  action vocabulary) and a ``README.md`` model card;
- ``OUT/team.json``: the manifest: algorithm, env, the agents in order with their bases and folders, turn
  order and dependency where the algorithm has them, the trained parts that were left out (critics, value
  heads: they live in ``checkpoints/last.ckpt``), the source run and step, and a ``vllm serve`` command per base;
- with ``--merge``, ``OUT/agentI/merged/``: the agent merged into its base (peft ``merge_and_unload`` on a fresh
  copy, in the run's dtype) with its tokenizer, a model folder ``AutoModelForCausalLM.from_pretrained`` loads alone.

The base an adapter names: the embedded default ``smollm2-135m-instruct`` is the hub's
``HuggingFaceTB/SmolLM2-135M-Instruct`` (collab trained on its Q4_1 GGUF dequantized; the merged folders are
made from those weights, the ones the adapters were trained on); a hub id stays itself; a local folder is named
by its absolute path unless ``--base-id`` gives its hub id; the random ``tiny`` test model has neither, so its
weights are written to ``OUT/base/`` and the adapters point there.

The team is rebuilt from the run's ``config.yaml`` as ``collab.fit`` built it (as ``collab.evaluate`` does; on the
CPU, unquantized, with collab's own decoding engine): the roles and prompts are those of the run, and the
adapters are loaded into it, which checks that they are the team's. Bad input (no run folder, no adapters, an
``OUT`` that holds files) ends in one ``error:`` line and exit code 2 before anything is loaded or written.
Everything is written into a hidden folder next to ``OUT`` and renamed to ``OUT`` at the end: an export that
fails leaves no half-written ``OUT``.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from collab.errors import OneLineParser, UserError, require

HUB_IDS = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}
"""collab's names of embedded bases -> the hub id of the same model."""
EXAMPLE = "runs/magrpo/version_0"


def _parser():

    p = OneLineParser(prog="python -m collab.export", add_help=False)
    p.add_argument("run_dir")
    p.add_argument("out")
    p.add_argument("--adapters", default="last")
    p.add_argument("--merge", action="store_true")
    p.add_argument("--base-id", dest="base_ids", action="append", default=[])
    p.add_argument("--algo", default=None)
    return p


# -- checks before anything is loaded ----------------------------------------------------------------
def adapter_folder(run_dir: Path, choice: str) -> Path:
    """``RUN_DIR/adapters/CHOICE`` (``last`` or ``step_N``), or a folder path; a UserError listing the valid ones."""
    root = run_dir / "adapters"
    saved = sorted((p.name for p in root.iterdir() if p.is_dir()), key=lambda n: (n != "last", len(n), n)) \
        if root.is_dir() else []
    require(bool(saved) or Path(choice).is_dir(),
            f"no adapters in {run_dir} ({root} is missing or empty); collab.fit writes adapters/last when training ends")
    folder = root / choice
    if not folder.is_dir() and Path(choice).is_dir():
        folder = Path(choice)
    require(folder.is_dir(), f"no adapters {choice!r} in {root}; valid: {', '.join(saved)}")
    require(any(folder.glob("agent*/adapter_model.safetensors")),
            f"{folder} holds no agent adapters (expected agent0/adapter_model.safetensors, ...)")
    return folder


def run_algo(run_dir: Path, config: dict, given: str | None) -> str:
    """The algorithm that trained the run: ``--algo``, else the logger's name (``runs/ALGO/version_N``)."""
    from collab.algos import algo_registry
    from collab.training.configs import is_class_path

    if given:
        return given
    registry = algo_registry()
    logger = (config.get("trainer") or {}).get("logger")
    loggers = logger if isinstance(logger, list) else [logger]
    names = [((x or {}).get("init_args") or {}).get("name") for x in loggers if isinstance(x, dict)]
    for name in names + [run_dir.parent.name]:
        if isinstance(name, str) and (name in registry or is_class_path(name)):
            return name
    raise UserError(f"cannot tell which algorithm trained {run_dir} (its logger is named {names[0] if names else None!r}); "
                    f"give --algo NAME ({', '.join(sorted(registry))}) or --algo module:Class")


def check_out(out: Path) -> None:
    require(not out.is_file(), f"OUT {out} is a file; give a new or empty folder")
    require(not (out.is_dir() and any(out.iterdir())),
            f"OUT {out} exists and is not empty; give a new or empty folder (nothing was written)")


def base_ids(given: list[str], bases: list[str]) -> dict[str, str]:
    """``--base-id`` values (``HUB_ID``, or ``BASE=HUB_ID`` for a team of several local-folder bases) as base -> hub id."""
    from collab.policy.models import DEFAULT_BASE, TINY

    local = [b for b in bases if b not in (DEFAULT_BASE, TINY) and Path(b).expanduser().exists()]
    out = {}
    for item in given:
        name, _, hub = item.rpartition("=")
        require(hub.count("/") == 1 and not hub.startswith((".", "/", "~")),
                f"--base-id {item!r}: expected a hub id org/name, or BASE=org/name")
        if not name:
            require(len(local) == 1, f"--base-id {item!r}: the team has {len(local)} local-folder bases "
                    f"({', '.join(local) or 'none'}); " + ("give BASE=HUB_ID for each" if local else
                                                           "--base-id names the hub id of a local-folder base"))
            out[local[0]] = hub
            continue
        match = [b for b in local if Path(b).expanduser().resolve() == Path(name).expanduser().resolve()]
        require(bool(match), f"--base-id {item!r}: {name} is not a local-folder base of the team; "
                f"valid: {', '.join(local) or 'none (the team has no local-folder base)'}")
        out[match[0]] = hub
    return out


# -- the team as collab.fit built it ------------------------------------------------------------------
def build_module(algo: str, config_file: Path):
    """The run's LightningModule with its team built (CPU, unquantized, collab's engine) and its env."""
    from collab.fit import build_cli
    from collab.training.checks import release_logs

    overrides = ["--trainer.logger", "false", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
                 "--trainer.num_nodes", "1", "--trainer.strategy", "auto", "--model.base.device", "cpu",
                 "--model.base.quantization", "none", "--model.base.gradient_checkpointing", "false",
                 "--model.engine", "torch"]
    cli = build_cli(algo, ["--config", str(config_file), *overrides])
    module, env = cli.model, cli.datamodule.env
    module.build(env)
    release_logs(show=False)  # the run's start-up messages say nothing about an export
    return module, env


def checkpoint_step(run_dir: Path, team) -> int | None:
    """The global step of ``checkpoints/last.ckpt`` when its agent adapters are exactly the team's (as loaded
    from the exported folder), else ``None``."""
    import torch

    path = run_dir / "checkpoints" / "last.ckpt"
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        state = checkpoint["state_dict"]
        tags = tuple(f".{name}." for name in team.names)
        mine = [(f"team.{n}", p) for n, p in team.named_parameters() if "lora_" in n and any(t in n for t in tags)]
        same = bool(mine) and all(k in state and torch.equal(state[k], p.detach().cpu()) for k, p in mine)
        return int(checkpoint["global_step"]) if same else None
    except Exception:  # no checkpoint, or not one of this team: the step is unknown
        return None


def left_out(module, team) -> list[dict]:
    """The trained parts that are not agents (critics, value heads): what they are and where their weights are."""
    from collab.algos.llm_critics import Critics

    parts = []
    for name, child in module.named_children():
        critics = isinstance(child, Critics)
        trained = [p for j in range(len(child)) for p in child.parameters_of(j)] if critics else \
            [p for p in child.parameters() if p.requires_grad]
        if name == "team" or not trained:
            continue
        entry = {"part": name, "kind": type(child).__name__, "parameters": sum(p.numel() for p in trained),
                 "weights": f"checkpoints/last.ckpt, state_dict keys {name}.*"}
        if critics:  # LLM critics: an adapter (or an agent's) and a value head each, on a base
            entry["critics"] = []
            for j, (adapter, key) in enumerate(zip(child.names, child.keys)):
                base = child.spec.base if key in child.own else next(
                    team.specs[i].base or team.base_config.name for i in range(len(team)) if team.base_of[i] == key)
                entry["critics"].append({"name": f"critic{j}", "mode": child.mode, "base": base, "value_head": f"{name}.heads.{j}",
                                         "adapter": f"{adapter} (the agent's own)" if child.spec.share_agent_adapter else adapter})
            if not child.spec.share_agent_adapter and any(key not in child.own for key in child.keys):
                entry["weights"] += " and team.models.*.critic<j> (the critics' adapters on the agents' base)"
        parts.append(entry)
    return parts


# -- writing -------------------------------------------------------------------------------------------
def base_reference(name: str, out: Path, ids: dict[str, str]) -> str:
    """What an exported adapter names as its base (see the module docstring)."""
    from collab.policy.models import TINY

    if name == TINY:
        return str(out.resolve() / "base")
    if name in HUB_IDS:
        return HUB_IDS[name]
    if name in ids:
        return ids[name]
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def model_card(agent: dict, manifest: dict) -> str:
    hub = agent["base"] if agent["base"].count("/") == 1 and not agent["base"].startswith("/") else None
    front = ["---", "library_name: peft", "tags: [collab, lora, multi-agent]"] + ([f"base_model: {hub}"] if hub else []) + ["---"]
    source = manifest["source"]
    step = f"step {source['step']}" if source["step"] is not None else f"adapters/{source['adapters']}"
    prompt = "\n".join("> " + line for line in (agent["system_prompt"] or "(none)").splitlines())
    sampling = ", ".join(f"{k} {v}" for k, v in agent["sampling"].items())
    choices = f"\nIts actions are one of {agent['choices']} (one token each).\n" if agent["choices"] else ""
    return "\n".join(front) + f"""

# {agent['name']}: {agent['role']}

Agent {agent['index']} of a team of {len(manifest['agents'])} trained with collab ({manifest['algorithm']} on the
{manifest['env']} env; {step} of {source['run_dir']}). A LoRA adapter (rank {agent['lora']['r']}) over
`{agent['base']}`; the team and its other agents: `../team.json`.

System prompt (the first message of each of its chats):

{prompt}

Sampling: {sampling}.
{choices}
```python
from peft import AutoPeftModelForCausalLM
from transformers import AutoTokenizer

model = AutoPeftModelForCausalLM.from_pretrained("{agent['folder']}")  # this folder
tokenizer = AutoTokenizer.from_pretrained("{agent['folder']}")
```
"""


def write_agent(team, i: int, source: Path, folder: Path, base: str) -> dict:
    """``folder``: agent i's adapter (copied) and its config naming ``base`` (returned), and its tokenizer."""
    folder.mkdir(parents=True)
    shutil.copyfile(source / "adapter_model.safetensors", folder / "adapter_model.safetensors")
    config = json.loads((source / "adapter_config.json").read_text())
    config.update(base_model_name_or_path=base, inference_mode=True)
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    team.tokenizer_of(i).save_pretrained(folder)
    return config


def merge(base_config, adapter: Path, tokenizer, sampling, folder: Path) -> None:
    """Agent merged into a fresh copy of its base (in the run's dtype) as a plain transformers folder."""
    import gc

    from peft import PeftModel

    from collab.policy.models import load_model

    model = PeftModel.from_pretrained(load_model(base_config), adapter).merge_and_unload()
    generation = model.generation_config
    generation.do_sample = sampling.temperature > 0  # collab's temperature 0 is greedy decoding
    if generation.do_sample:
        generation.temperature, generation.top_p, generation.top_k = sampling.temperature, sampling.top_p, sampling.top_k
    if sampling.max_new_tokens:
        generation.max_new_tokens = sampling.max_new_tokens
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    gc.collect()


def serve_commands(agents: list[dict], out: Path) -> list[str]:
    """One ``vllm serve`` per base, with its agents as LoRA modules (vLLM's ranks: 8, 16, 32, ...)."""
    from collab.policy.vllm_engine import _lora_rank

    commands = []
    for base in dict.fromkeys(a["base"] for a in agents):
        mine = [a for a in agents if a["base"] == base]
        modules = " ".join(f"{a['name']}={out.resolve() / a['folder']}" for a in mine)
        rank = _lora_rank(max(a["lora"]["r"] for a in mine))
        commands.append(f"vllm serve {base} --tokenizer {out.resolve() / mine[0]['folder']} --enable-lora "
                        f"--lora-modules {modules} --max-lora-rank {rank} --max-loras {len(mine)}")
    return commands


def export(run_dir: str | Path, out: str | Path, adapters: str = "last", merge_agents: bool = False,
           base_id: list[str] | None = None, algo: str | None = None) -> dict:
    """Export a run's team (see the module docstring); the manifest written to ``OUT/team.json``."""
    import yaml

    import collab
    from collab.policy.models import TINY, BaseConfig, model_folder
    from collab.policy.vllm_engine import export_base

    run_dir, out = Path(run_dir), Path(out)
    require(run_dir.is_dir(), f"run folder not found: {run_dir} (expected a folder written by collab.fit, e.g. {EXAMPLE})")
    config_file = run_dir / "config.yaml"
    require(config_file.is_file(), f"{run_dir} has no config.yaml: not a run folder of collab.fit (e.g. {EXAMPLE})")
    source = adapter_folder(run_dir, adapters)
    check_out(out)
    config = yaml.safe_load(config_file.read_text()) or {}
    algo = run_algo(run_dir, config, algo)
    model = config.get("model") or {}
    default_base = (model.get("base") or {}).get("name") or BaseConfig().name
    bases = [default_base] + [a.get("base") for a in model.get("agents") or [] if isinstance(a, dict) and a.get("base")]
    ids = base_ids(base_id or [], bases)

    module, env = build_module(algo, config_file)
    team = module.team
    team.load_adapters(source)  # every agent's adapter, of the team's shapes
    step_match = re.fullmatch(r"step_(\d+)", source.name)
    step = int(step_match.group(1)) if step_match else checkpoint_step(run_dir, team)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        agents = []
        for i, (name, spec) in enumerate(zip(team.names, team.specs)):
            base_name = spec.base or team.base_config.name
            base = base_reference(base_name, out, ids)
            if base_name == TINY and not (tmp / "base").exists():  # the random test model exists nowhere else
                export_base(team.model_of(i), team.tokenizer_of(i), tmp / "base")
            lora = write_agent(team, i, source / name, tmp / name, base)
            folder = base if base_name == TINY else model_folder(base_name)
            trained_on = str(Path(folder).resolve()) if Path(folder).exists() else folder  # a hub id: itself
            agent = {"index": i, "name": name, "role": spec.role, "system_prompt": spec.system_prompt,
                     "folder": name, "base": base, "base_name": base_name, "trained_on": trained_on,
                     "lora": {"r": lora["r"], "alpha": lora["lora_alpha"], "target_modules": sorted(lora["target_modules"])},
                     "sampling": asdict(spec.sampling), "choices": spec.choices,
                     "merged": f"{name}/merged" if merge_agents else None}
            (tmp / name / "collab_agent.json").write_text(json.dumps({**agent, "spec": asdict(spec)}, indent=2) + "\n")
            agents.append(agent)
        protocol = getattr(module, "protocol", None)
        manifest = {
            "format": "collab-team/1",
            "collab_version": collab.__version__,
            "algorithm": algo,
            "env": env.name,
            "source": {"run_dir": str(run_dir.resolve()), "adapters": source.name, "step": step},
            "dtype": team.base_config.dtype,
            "quantization": (model.get("base") or {}).get("quantization", "none"),
            "policy": "softmax(logits / temperature), over the token ids of `choices` where an agent has them; "
                      "top_p/top_k truncate it when sampling (a temperature of 0 is greedy)",
            "max_new_tokens": getattr(module, "max_new_tokens", None),
            "agents": agents,
            "turn_order": team.turn_agents,
            "dependency": None if protocol is None else
            {"option": getattr(module, "dependency", None), "parents_at_step_0": protocol.parents(0),
             "how": "agent j's last user message gets 'ROLE: ACTION' appended for each parent i, in agent order"},
            "left_out": left_out(module, team),
            "serve": serve_commands(agents, out),
        }
        for agent in agents:
            (tmp / agent["folder"] / "README.md").write_text(
                model_card({**agent, "folder": str(out.resolve() / agent["folder"])}, manifest))
        (tmp / "team.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if merge_agents:
            for i, agent in enumerate(agents):
                config_i = BaseConfig(**{**asdict(team.base_config), "name": agent["base_name"]})
                merge(config_i, tmp / agent["folder"], team.tokenizer_of(i), team.specs[i].sampling, tmp / agent["merged"])
        if out.is_dir():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def run(argv: list[str]) -> dict:
    options = _parser().parse_args(argv)
    from transformers.utils import logging

    logging.disable_progress_bar()  # the summary below says what was written
    manifest = export(options.run_dir, options.out, options.adapters, options.merge, options.base_ids, options.algo)
    out = Path(options.out)
    source = manifest["source"]
    print(f"exported {len(manifest['agents'])} agents of {manifest['algorithm']} on {manifest['env']} "
          f"({source['run_dir']}, adapters/{source['adapters']}, step {source['step']}) to {out}:")
    for a in manifest["agents"]:
        merged = f" + {a['merged']}" if a["merged"] else ""
        print(f"  {a['folder']}{merged}: {a['role']} over {a['base']}")
    for part in manifest["left_out"]:
        print(f"  not exported: {part['part']} ({part['kind']}, {part['parameters']} parameters; in {part['weights']})")
    print(f"manifest: {out / 'team.json'}; serve: {manifest['serve'][0]}")
    return manifest


def main(argv: list[str] | None = None) -> int:
    from collab.fit import report_errors

    return report_errors(lambda: run(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
