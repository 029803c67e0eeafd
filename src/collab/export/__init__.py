"""``python -m collab.export RUN_DIR OUT [--adapters last|step_N] [--merge] [--base-id [BASE=]HUB_ID] [--algo NAME]``.

Turns a trained run into folders that plain transformers, peft and vLLM load without collab: ``OUT/agentI/``
(adapter, tokenizer, ``collab_agent.json``, model card; a full-parameter agent's whole model), ``OUT/team.json``
(the manifest), ``OUT/agentI/merged/`` with ``--merge``, ``OUT/base/`` for the ``tiny`` test base. Layout, the
manifest's fields and which base an adapter names: docs/export.md.

The team is rebuilt from the run's ``config.yaml`` as ``collab.fit`` built it (on the CPU, unquantized, collab's
own engine) and the adapters loaded into it, which checks that they are the team's. Bad input ends in one
``error:`` line, exit 2, before anything is loaded or written; everything is written into a hidden folder next
to ``OUT`` and renamed at the end, so a failed export leaves no half-written ``OUT``.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from collab.errors import OneLineParser, require
from collab.export.checks import adapter_folder, base_ids, check_out, run_algo
from collab.export.team import build_module, checkpoint_step, left_out
from collab.export.writing import base_reference, merge, model_card, serve_commands, write_agent, write_full

EXAMPLE = "runs/magrpo/version_0"


def _parser():
    p = OneLineParser(
        prog="python -m collab.export",
        description="Turn a trained run into folders that transformers, "
        "peft and vLLM load without collab (docs/export.md).",
    )
    p.add_argument("run_dir", help=f"the run's folder, written by collab.fit (e.g. {EXAMPLE})")
    p.add_argument("out", help="the folder to write (new or empty)")
    p.add_argument("--adapters", default="last", help="last, step_N or a folder of adapters (default last)")
    p.add_argument("--merge", action="store_true", help="also write each agent merged into its base (agentI/merged)")
    p.add_argument(
        "--base-id",
        dest="base_ids",
        action="append",
        default=[],
        metavar="HUB_ID",
        help="HUB_ID or BASE=HUB_ID: the hub id the adapters name for a local-folder base",
    )
    p.add_argument("--algo", default=None, metavar="NAME", help="the run's algorithm (default: its logger's name)")
    return p


def export(
    run_dir: str | Path,
    out: str | Path,
    adapters: str = "last",
    merge_agents: bool = False,
    base_id: list[str] | None = None,
    algo: str | None = None,
) -> dict:
    """Export a run's team (see the module docstring); the manifest written to ``OUT/team.json``."""
    from collab.config import load_yaml
    from collab.policy.models import BaseConfig

    run_dir, out = Path(run_dir), Path(out)
    require(
        run_dir.is_dir(), f"run folder not found: {run_dir} (expected a folder written by collab.fit, e.g. {EXAMPLE})"
    )
    config_file = run_dir / "config.yaml"
    require(config_file.is_file(), f"{run_dir} has no config.yaml: not a run folder of collab.fit (e.g. {EXAMPLE})")
    source = adapter_folder(run_dir, adapters)
    check_out(out)
    config = load_yaml(config_file, "the run's config")  # one line for a file that is not UTF-8 or not YAML
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
    run = {
        "algorithm": algo,
        "env": env.name,
        "source": {"run_dir": str(run_dir.resolve()), "adapters": source.name, "step": step},
        "quantization": (model.get("base") or {}).get("quantization", "none"),
    }

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        agents = [export_agent(team, i, source, tmp, out, ids, merge_agents) for i in range(len(team.names))]
        manifest = team_manifest(module, run, agents, out)
        for agent in agents:
            (tmp / agent["folder"] / "README.md").write_text(
                model_card({**agent, "folder": str(out.resolve() / agent["folder"])}, manifest)
            )
        (tmp / "team.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if merge_agents:
            merge_into_bases(team, agents, tmp)
        if out.is_dir():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def export_agent(team, i: int, source: Path, tmp: Path, out: Path, ids, merged: bool) -> dict:
    """Agent ``i``'s folder under ``tmp`` (its adapter, or its whole model for ``finetune: full``, and
    ``collab_agent.json``; the random ``tiny`` base's weights in ``tmp/base``, once) and its entry of the manifest."""
    from collab.policy.models import TINY, model_folder
    from collab.policy.vllm_engine import export_base

    name, spec = team.names[i], team.specs[i]
    base_name = spec.base or team.base_config.name
    whole = team.agents[i].adapter is None
    base = None if whole else base_reference(base_name, out, ids)
    if base_name == TINY and not whole and not (tmp / "base").exists():  # the random model exists nowhere else
        export_base(team.model_of(i), team.tokenizer_of(i), tmp / "base")
    if whole:
        write_full(source / name, tmp / name, spec.sampling)
    else:
        lora = write_agent(team, i, source / name, tmp / name, base)
    folder = base if base_name == TINY else model_folder(base_name)
    trained_on = None if folder is None else str(Path(folder).resolve()) if Path(folder).exists() else folder
    agent = {
        "index": i,
        "name": name,
        "role": spec.role,
        "system_prompt": spec.system_prompt,
        "folder": name,
        "finetune": spec.finetune,
        "model": name if whole else (f"{name}/merged" if merged else None),
        "base": base,
        "base_name": base_name,
        "trained_on": trained_on,
        "lora": None
        if whole
        else {"r": lora["r"], "alpha": lora["lora_alpha"], "target_modules": sorted(lora["target_modules"])},
        "sampling": asdict(spec.sampling),
        "choices": spec.choices,
        "merged": f"{name}/merged" if merged and not whole else None,
    }
    (tmp / name / "collab_agent.json").write_text(json.dumps({**agent, "spec": asdict(spec)}, indent=2) + "\n")
    return agent


def team_manifest(module, run: dict, agents: list[dict], out: Path) -> dict:
    """``team.json``: the run (``algorithm``, ``env``, ``source``, ``quantization``), the agents, their turn order
    and dependency, the trained parts left out and the ``vllm serve`` commands."""
    import collab

    team = module.team
    protocol = getattr(module, "protocol", None)
    return {
        "format": "collab-team/1",
        "collab_version": collab.__version__,
        "algorithm": run["algorithm"],
        "env": run["env"],
        "source": run["source"],
        "dtype": team.base_config.dtype,
        "quantization": run["quantization"],
        "policy": "softmax(logits / temperature), over the token ids of `choices` where an agent has them; "
        "top_p/top_k truncate it when sampling (a temperature of 0 is greedy)",
        "max_new_tokens": getattr(module, "max_new_tokens", None),
        "agents": agents,
        "turn_order": team.turn_agents,
        "dependency": None
        if protocol is None
        else {
            "option": getattr(module, "dependency", None),
            "parents_at_step_0": protocol.parents(0),
            "how": "agent j's last user message gets 'ROLE: ACTION' appended for each parent i, in agent order",
        },
        "left_out": left_out(module),
        "serve": serve_commands(agents, out),
    }


def merge_into_bases(team, agents: list[dict], tmp: Path) -> None:
    """``--merge``: each adapter agent merged into its base, in ``agentI/merged`` (a full agent is a whole model
    already)."""
    from collab.policy.models import BaseConfig

    for i, agent in enumerate(agents):
        if agent["finetune"] == "full":
            continue
        config_i = BaseConfig(**{**asdict(team.base_config), "name": agent["base_name"]})
        merge(config_i, tmp / agent["folder"], team.tokenizer_of(i), team.specs[i].sampling, tmp / agent["merged"])


def run(argv: list[str]) -> dict:
    options = _parser().parse_args(argv)
    from transformers.utils import logging

    logging.disable_progress_bar()  # the summary below says what was written
    manifest = export(options.run_dir, options.out, options.adapters, options.merge, options.base_ids, options.algo)
    out = Path(options.out)
    source = manifest["source"]
    print(
        f"exported {len(manifest['agents'])} agents of {manifest['algorithm']} on {manifest['env']} "
        f"({source['run_dir']}, adapters/{source['adapters']}, step {source['step']}) to {out}:"
    )
    for a in manifest["agents"]:
        merged = f" + {a['merged']}" if a["merged"] else ""
        what = "its whole model (finetune: full)" if a["finetune"] == "full" else f"over {a['base']}"
        print(f"  {a['folder']}{merged}: {a['role']} {what}")
    for part in manifest["left_out"]:
        print(f"  not exported: {part['part']} ({part['kind']}, {part['parameters']} parameters; in {part['weights']})")
    print(f"manifest: {out / 'team.json'}; serve: {manifest['serve'][0]}")
    return manifest


def main(argv: list[str] | None = None) -> int:
    from collab.fit import report_errors

    return report_errors(lambda: run(list(sys.argv[1:] if argv is None else argv)))
