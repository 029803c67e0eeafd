"""Memory per process under ``--trainer.strategy fsdp``, measured: a full-parameter team at a real width, one step.

The team is MAGRPO's writing preset (``conf/presets/magrpo_writing_paper.yaml``: two Qwen3-1.7B agents, each
``finetune: full``) composed as ``python -m collab.fit`` composes it (``benchmarks/paper_shapes.py``'s override:
random-weight bases from the published ``config.json`` values, nothing downloaded, packaged writing posts), in
``--dtype`` (default bfloat16), with ``--layers`` decoder layers (default the model's 28) and ``--vocab`` rows
(default its 151,936): the width, heads, head size and MLP of Qwen3-1.7B, fewer layers (or rows) where a machine
cannot hold the whole team (``--smoke``: the family's tiny shape of ``paper_shapes.py``, for tests). One optimizer
step runs under collab's FSDP2 strategy on ``--devices`` gloo CPU processes (1: one process, no sharding), with
``paper_shapes.vary_rewards`` so that the update runs.

Each process reports, for the models fsdp shards (:func:`collab.training.fsdp.team_models`: here each agent's copy):
the local bytes of their weights, of their gradients (just before the optimizer step) and of AdamW's two moments
(after it), their sum (the trained state) against the whole state / N (weights, gradients and moments of the whole
team, 4 x its weights: :data:`collab.runtime.projection.FULL_COPIES`), and its peak resident memory
(``getrusage``, which includes the load: each process builds both agents whole before sharding them). Beside them
the projection of the same shape (:func:`collab.runtime.projection.sharded_bytes` of the parameters the start-of-run
check counts from the config, :func:`collab.policy.models.base_parameters`): the state a process holds, and what a
backward pass gathers whole on top of it (one model a pass: its weights, and a full agent's gradients), which the
peak resident memory is compared with; and what each pass did gather (``Lockstep.backward``'s roots, recorded by
:func:`watch_backward`).

    PYTHONPATH=src python benchmarks/fsdp_memory.py --devices 2 --layers 2 --vocab 8192 --max-new-tokens 8
    PYTHONPATH=src python benchmarks/fsdp_memory.py --devices 4 --out fsdp4.json     # the whole model: ~52 GiB in all

A timing is not a measurement here (other processes share the CPU); the bytes are.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import paper_shapes  # noqa: E402  (benchmarks/ is not a package: the preset's override, random weights, rewards)

ARCH = "Qwen3-1.7B"
PRESETS = ("magrpo_writing_paper", "collm_writing_paper")
"""The presets whose every model is Qwen3-1.7B: MAGRPO's two writers, and CoLLM's with its critic on a base of its
own (frozen, sharded: a LoRA adapter and a value head train on it)."""
WORKDIR_ENV = "COLLAB_FSDP_MEMORY_WORKDIR"
"""The folder of the models and of each rank's figures, passed to the processes Lightning starts."""
GIB = 2**30


def local_bytes(tensor) -> int:
    """Bytes of this process's part of ``tensor`` (a DTensor's local shard; a plain tensor whole)."""
    if tensor is None:
        return 0
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def whole_bytes(tensor) -> int:
    """Bytes of ``tensor`` whole (a DTensor's global shape)."""
    return tensor.numel() * tensor.element_size()


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


RSS = {"start": 0, "backward": 0, "gpu_backward": 0, "gathered": 0}
"""This process's resident memory before the team is built, and the most right after a backward pass ran (its models
whole: weights and gradients before their reduce-scatter); on a GPU, its allocated memory there too; and the most
bytes a pass gathered whole (the weights of the models it gathered, and their trained weights' gradients).
"""


def watch_backward() -> None:
    """Record :data:`RSS` ``backward`` inside each of ``Lockstep.backward``'s passes, after the backward ran and
    before the gradients' reduce-scatter and the reshard (where the gathered models are whole)."""
    from collab.runtime.lockstep import Lockstep

    backward = Lockstep.backward

    def watched(self, run):
        roots = [self.roots[key] for key in sorted(self._used)]  # what the pass gathers (Lockstep.backward)
        params = {id(p): p for root in roots for p in root.parameters()}.values()
        whole = sum(whole_bytes(p) * (2 if p.requires_grad else 1) for p in params)
        RSS["gathered"] = max(RSS["gathered"], whole)

        def then():
            import torch

            run()
            RSS["backward"] = max(RSS["backward"], rss())
            if torch.cuda.is_available():
                RSS["gpu_backward"] = max(RSS["gpu_backward"], torch.cuda.memory_allocated())

        return backward(self, then)

    Lockstep.backward = watched


def sharded_parameters(module) -> list:
    """The parameters of the models fsdp shards (each agent's copy), each once."""
    from collab.training.fsdp import team_models

    seen: dict[int, object] = {}
    for model in team_models(module):
        for p in model.parameters():
            seen.setdefault(id(p), p)
    return list(seen.values())


def probe_callback(workdir: str):
    """A callback recording this process's bytes: gradients before the optimizer step, weights and moments after
    the step, the peak resident memory; written to ``workdir/rankR.json``, then a barrier."""
    import lightning as L
    import torch.distributed as dist

    class Probe(L.Callback):
        grads = 0

        def on_before_optimizer_step(self, trainer, module, optimizer) -> None:
            self.grads = sum(local_bytes(p.grad) for p in sharded_parameters(module))

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            params = sharded_parameters(module)
            optimizer = module.optimizers().optimizer
            moments = sum(
                local_bytes(optimizer.state.get(p, {}).get(key)) for p in params for key in ("exp_avg", "exp_avg_sq")
            )
            import torch

            rank = dist.get_rank() if dist.is_initialized() else 0
            cuda = torch.cuda.is_available() and next(module.parameters()).device.type == "cuda"
            record = {
                "rank": rank,
                "parameters": sum(p.numel() for p in params),
                "weights": sum(local_bytes(p) for p in params),
                "whole_weights": sum(whole_bytes(p) for p in params),
                # every weight whole, and a trained one's gradient and two moments (their dtype is the weight's)
                "whole_state": sum(whole_bytes(p) * (4 if p.requires_grad else 1) for p in params),
                "grads": self.grads,
                "moments": moments,
                "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "rss_start": RSS["start"],
                "rss_backward": RSS["backward"] or None,
                "peak_gpu": torch.cuda.max_memory_allocated() if cuda else None,
                "gpu_backward": RSS["gpu_backward"] or None,
                "gathered": RSS["gathered"],
                "optimizer_steps": trainer.global_step,
            }
            Path(workdir, f"rank{rank}.json").write_text(json.dumps(record))
            trainer.strategy.barrier()

    return Probe()


def overrides(args) -> dict:
    """The config values ``--layers`` and ``--vocab`` change (none: the model's, or ``--smoke``'s)."""
    values = {"num_hidden_layers": args.layers, "vocab_size": args.vocab}
    return {key: value for key, value in values.items() if value}


def folder(args) -> str:
    """The random-weight model's folder: Qwen3-1.7B's config (``--smoke``: its family's tiny shape) with ``--layers``
    and ``--vocab``, and a tokenizer."""
    return paper_shapes.base_folder(ARCH, args.workdir, args.smoke, **overrides(args))


def compose(args):
    """The preset with full agents on :func:`folder`'s model, composed as ``collab.fit`` composes it."""
    import yaml

    from collab.fit import build_cli

    opt = paper_shapes.Options(
        args.dtype, "full", None, 1, args.samples, args.max_new_tokens, False, args.workdir, "cpu"
    )
    config = paper_shapes.override(args.preset, opt)
    # each process's own device (Lightning's root device: cuda:RANK on GPUs)
    config["model"]["base"].update(name=folder(args), device="auto")
    if "critic_spec" in config["model"]:
        config["model"]["critic_spec"]["base"] = folder(args)
    path = Path(args.workdir, f"{args.preset}.fsdp_memory.yaml")
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    preset = paper_shapes.preset_file(args.preset)
    cli_args = ["--config", str(preset), "--config", str(path), "--trainer.accelerator", args.accelerator]
    cli_args += ["--trainer.logger", "false", "--trainer.default_root_dir", args.workdir]
    return build_cli(paper_shapes.PAPERS[args.preset].algo, cli_args)


def run(args) -> None:
    """One optimizer step on ``args.devices`` processes (this one and those Lightning starts)."""
    import lightning as L

    from collab.runtime.threads import choose_threads
    from collab.training.fsdp import FSDP2Strategy

    choose_threads(args.devices)
    RSS["start"] = rss()
    watch_backward()
    with paper_shapes.random_weights():
        cli = compose(args)
        module, data = cli.model, cli.datamodule
        paper_shapes.vary_rewards(data.env)
        trainer = L.Trainer(
            max_steps=1,
            max_epochs=-1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator=args.accelerator,
            devices=args.devices,
            strategy=FSDP2Strategy() if args.devices > 1 else "auto",
            callbacks=[probe_callback(args.workdir)],
            default_root_dir=args.workdir,
        )
        trainer.fit(module, data)


def projected(args) -> dict:
    """The projection of the shape: the parameters the start-of-run check counts (the agents' copies and a critic's
    base; its LoRA adapter not counted), and per process the state held and what a backward pass gathers whole
    (:func:`collab.runtime.projection.sharded_bytes`)."""
    from collab.policy.models import base_parameters
    from collab.runtime.projection import Model, sharded_bytes

    params = base_parameters(folder(args))
    width = paper_shapes.gpu_check.BYTES[args.dtype]
    models = [Model(params, width, trains=True)] * 2 + ([Model(params, width)] if critic(args) else [])
    held, gathered = sharded_bytes(models, args.devices, per_model=True)
    return {
        "parameters": len(models) * params,
        "whole_state": sum(m.whole for m in models),
        "held": held,
        "gathered": gathered,
    }


def critic(args) -> bool:
    """Whether the preset's critic has a base of its own (CoLLM's)."""
    return paper_shapes.PAPERS[args.preset].critic is not None


def report(args, ranks: list[dict], projection: dict) -> dict:
    """Each rank's figures with the checks: its trained state against whole / N (+10% allowed), against the
    projection, and its peak resident memory less that before the team was built against the projected state and
    gathered models."""
    n, peak, rows = args.devices, projection["held"] + projection["gathered"], []
    for r in ranks:
        state, whole = r["weights"] + r["grads"] + r["moments"], r["whole_state"]
        rows.append(
            {
                **r,
                "state": state,
                "state_over_whole_per_n": state / (whole / n),
                "state_within_10pct": state <= 1.1 * whole / n,
                "state_over_projected": state / projection["held"],
                "gathered_over_projected": r["gathered"] / projection["gathered"] if projection["gathered"] else None,
                # what the step added to the process (imports, Python and torch before it left out)
                "peak_less_start_over_projected": (r["peak_rss"] - r["rss_start"]) / peak,
                "peak_gpu_over_projected": r["peak_gpu"] / peak if r["peak_gpu"] else None,
            }
        )
    return {
        "shape": shape_line(args),
        "devices": n,
        "projection": projection,
        "ranks": rows,
        "measured_parameters_match": all(r["parameters"] == projection["parameters"] for r in ranks),
    }


def shape_line(args) -> str:
    c = paper_shapes.config_values(ARCH, args.smoke, **overrides(args))
    models = "2 full agents" + (" and a critic base" if critic(args) else "")
    where = "gloo CPU" if args.accelerator == "cpu" else "NCCL GPU"
    return (
        f"{args.preset}, {models}, {ARCH}-shaped (hidden {c['hidden_size']}, MLP {c['intermediate_size']}, "
        f"{c['num_attention_heads']}/{c['num_key_value_heads']} heads of {c['head_dim']}, {c['num_hidden_layers']} "
        f"layers, vocabulary {c['vocab_size']}, tied embeddings), random weights, {args.dtype}, 1 step, "
        f"{args.samples} task(s), {args.max_new_tokens or 256} new tokens, {args.devices} {where} process(es)"
    )


def markdown(result: dict) -> str:
    """The figures as a markdown list and table (GiB)."""

    def g(n) -> str:
        return "-" if n is None else f"{n / GIB:.3f}"

    p, ranks = result["projection"], result["ranks"]
    gpu = any(r["peak_gpu"] is not None for r in ranks)
    lines = [
        f"- shape: {result['shape']}",
        f"- whole trained state (every sharded weight, and a trained one's gradient and two AdamW moments): "
        f"{g(ranks[0]['whole_state'] if ranks else None)} GiB measured, {g(p['whole_state'])} GiB projected; per "
        f"process projected: held {g(p['held'])} GiB, a backward pass gathers {g(p['gathered'])} GiB whole",
        "",
        "| rank | weights | gradients | moments | state | state / (whole/N) | state / projected | gathered in a "
        "backward (over projected) | RSS at start | "
        "RSS after a backward, before its reduce-scatter | peak RSS (less the start, over held + gathered) |"
        + (" GPU after a backward | peak GPU (over held + gathered) |" if gpu else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if gpu else ""),
    ]
    for r in ranks:
        ratio = r["peak_gpu_over_projected"]
        extra = f" {g(r['gpu_backward'])} | {g(r['peak_gpu'])} ({ratio or 0:.2f}) |" if gpu else ""
        lines.append(
            f"| {r['rank']} | {g(r['weights'])} | {g(r['grads'])} | {g(r['moments'])} | {g(r['state'])} | "
            f"{r['state_over_whole_per_n']:.3f} | {r['state_over_projected']:.3f} | {g(r['gathered'])} "
            f"({r['gathered_over_projected'] or 0:.3f}) | {g(r['rss_start'])} | "
            f"{g(r['rss_backward'])} | {g(r['peak_rss'])} ({r['peak_less_start_over_projected']:.2f}) |{extra}"
        )
    return "\n".join(lines) + "\n\n(GiB)\n"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default=PRESETS[0], choices=PRESETS, help="(default: %(default)s)")
    ap.add_argument("--devices", type=int, default=2, help="processes, one a device (default: %(default)s)")
    ap.add_argument(
        "--accelerator", default="cpu", choices=["cpu", "gpu"], help="gloo CPU or NCCL GPU processes (default: cpu)"
    )
    ap.add_argument("--layers", type=int, help="decoder layers (default: Qwen3-1.7B's 28)")
    ap.add_argument("--vocab", type=int, help="vocabulary rows (default: Qwen3-1.7B's 151,936)")
    ap.add_argument("--smoke", action="store_true", help="Qwen3's tiny shape (hidden 64, 2 layers): checks the logic")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="(default: %(default)s)")
    ap.add_argument("--samples", type=int, help="tasks a step, over all processes (default: one a process)")
    ap.add_argument("--max-new-tokens", type=int, help="each response's length (default: the preset's 256)")
    ap.add_argument("--out", help="the figures as JSON (the markdown table goes to stdout)")
    ap.add_argument("--workdir", help="the models' folders (default: a temporary folder)")
    args = ap.parse_args(argv)
    args.samples = args.samples or args.devices
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    child = "LOCAL_RANK" in os.environ and os.environ.get(WORKDIR_ENV)  # a process Lightning started
    args.workdir = args.workdir or os.environ.get(WORKDIR_ENV) or tempfile.mkdtemp(prefix="collab-fsdp-memory-")
    os.environ[WORKDIR_ENV] = args.workdir
    for old in Path(args.workdir).glob("rank*.json") if not child else []:
        old.unlink()
    with contextlib.redirect_stdout(sys.stderr):  # collab's and Lightning's lines: stdout carries the table alone
        run(args)
    if child:
        return 0
    ranks, deadline = [], time.monotonic() + 600
    while len(ranks) < args.devices and time.monotonic() < deadline:
        files = sorted(Path(args.workdir).glob("rank*.json"))
        ranks = [json.loads(f.read_text()) for f in files] if len(files) == args.devices else []
        time.sleep(0 if ranks else 1)
    result = report(args, sorted(ranks, key=lambda r: r["rank"]), projected(args))
    print(markdown(result), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0 if ranks and all(r["state_within_10pct"] for r in result["ranks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
