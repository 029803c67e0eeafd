"""What ``python -m collab.export`` writes for each agent: the base its adapter names, its folder (adapter,
peft config, tokenizer; a full-parameter agent's whole model), its model card, the agent merged into its base, and
the ``vllm serve`` commands of the manifest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from collab.export.checks import adapter_config

HUB_IDS = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}
"""collab's names of embedded bases -> the hub id of the same model."""


def base_reference(name: str, out: Path, ids: dict[str, str]) -> str:
    """What an exported adapter names as its base (see :mod:`collab.export`)."""
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
    whole = agent["finetune"] == "full"
    hub = agent["base"] if not whole and agent["base"].count("/") == 1 and not agent["base"].startswith("/") else None
    front = (
        ["---", f"library_name: {'transformers' if whole else 'peft'}"]
        + [f"tags: [collab, {'full-parameter' if whole else 'lora'}, multi-agent]"]
        + ([f"base_model: {hub}"] if hub else [])
        + ["---"]
    )
    source = manifest["source"]
    step = f"step {source['step']}" if source["step"] is not None else f"adapters/{source['adapters']}"
    prompt = "\n".join("> " + line for line in (agent["system_prompt"] or "(none)").splitlines())
    sampling = ", ".join(f"{k} {v}" for k, v in agent["sampling"].items())
    choices = f"\nIts actions are one of {agent['choices']} (one token each).\n" if agent["choices"] else ""
    what = (
        f"Every parameter of `{agent['base_name']}` trained (full-parameter): this folder is the whole model"
        if whole
        else f"A LoRA adapter (rank {agent['lora']['r']}) over\n`{agent['base']}`"
    )
    load = "AutoModelForCausalLM" if whole else "AutoPeftModelForCausalLM"
    return (
        "\n".join(front)
        + f"""

# {agent["name"]}: {agent["role"]}

Agent {agent["index"]} of a team of {len(manifest["agents"])} trained with collab ({manifest["algorithm"]} on the
{manifest["env"]} env; {step} of {source["run_dir"]}). {what}; the team and its other agents: `../team.json`.

System prompt (the first message of each of its chats):

{prompt}

Sampling: {sampling}.
{choices}
```python
from {"transformers" if whole else "peft"} import {load}
from transformers import AutoTokenizer

model = {load}.from_pretrained("{agent["folder"]}")  # this folder
tokenizer = AutoTokenizer.from_pretrained("{agent["folder"]}")
```
"""
    )


def write_agent(team, i: int, source: Path, folder: Path, base: str) -> dict:
    """``folder``: agent i's adapter (copied) and its config naming ``base`` (returned), and its tokenizer."""
    folder.mkdir(parents=True)
    shutil.copyfile(source / "adapter_model.safetensors", folder / "adapter_model.safetensors")
    config = adapter_config(source)
    config.update(base_model_name_or_path=base, inference_mode=True)
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    team.tokenizer_of(i).save_pretrained(folder)
    return config


def write_full(source: Path, folder: Path, sampling) -> None:
    """``folder``: a full-parameter agent's model folder (:func:`collab.policy.full.save_full`) copied, its generation
    config set to the agent's sampling (:func:`generation_settings`)."""
    from transformers import GenerationConfig

    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("agent.json"))
    generation = GenerationConfig.from_pretrained(folder) if (folder / "generation_config.json").is_file() else None
    generation = generation or GenerationConfig()
    generation_settings(generation, sampling)
    generation.save_pretrained(folder)


def generation_settings(generation, sampling) -> None:
    """A transformers ``GenerationConfig`` set to sample as the agent does."""
    generation.do_sample = sampling.temperature > 0  # collab's temperature 0 is greedy decoding
    if generation.do_sample:
        generation.temperature, generation.top_p, generation.top_k = (
            sampling.temperature,
            sampling.top_p,
            sampling.top_k,
        )
    if sampling.max_new_tokens:
        generation.max_new_tokens = sampling.max_new_tokens


def merge(base_config, adapter: Path, tokenizer, sampling, folder: Path) -> None:
    """Agent merged into a fresh copy of its base (in the run's dtype) as a plain transformers folder."""
    import gc

    from peft import PeftModel

    from collab.policy.models import load_model

    model = PeftModel.from_pretrained(load_model(base_config), adapter).merge_and_unload()
    generation_settings(model.generation_config, sampling)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    gc.collect()


def serve_commands(agents: list[dict], out: Path) -> list[str]:
    """One ``vllm serve`` per base, with its agents as LoRA modules (vLLM's ranks: 8, 16, 32, ...), and one per
    full-parameter agent (its own folder)."""
    from collab.policy.vllm_engine import _lora_rank

    commands = [
        f"vllm serve {out.resolve() / a['folder']} --served-model-name {a['name']}"
        for a in agents
        if a["finetune"] == "full"
    ]
    for base in dict.fromkeys(a["base"] for a in agents if a["finetune"] != "full"):
        mine = [a for a in agents if a["base"] == base]
        modules = " ".join(f"{a['name']}={out.resolve() / a['folder']}" for a in mine)
        rank = _lora_rank(max(a["lora"]["r"] for a in mine))
        commands.append(
            f"vllm serve {base} --tokenizer {out.resolve() / mine[0]['folder']} --enable-lora "
            f"--lora-modules {modules} --max-lora-rank {rank} --max-loras {len(mine)}"
        )
    return commands
