"""Teams of N agents: one step's seconds and peak memory as the team, K or the reply length grows, collab against
CoMLRL, each side alone, ratios from one run.

A writing task for N agents: each step, 2 posts of collab's packaged writing corpus; agent i is asked for a
summary of about ``TARGET * (i + 1)`` words and the team's reward is the mean over agents of
``-|words_i - target_i| / target_i`` (0 when every agent hits its length): a joint reward that differs between
samples, so that every update runs. Sampling at temperature 0.7, top-p 0.9, one turn, aligned joint actions,
mean baseline, no KL, one pass, one optimizer step per agent per 2 posts (peers.py's MAGRPO comparison, N agents).

Sides (``--sides``):

- ``collab``: ``from_config(ALGO)``, the algorithm's config (LoRA r 8, alpha 16, all linear layers, lr 1e-3): the
  N agents are N adapters on one shared base, their rows decoded and trained in shared batches;
- ``collab-full``: the same with every agent ``finetune: full`` (a trainable copy of the base each, AdamW at 5e-6);
- ``comlrl``: CoMLRL 1.4.3's ``MAGRPOTrainer`` (the MAGRPO paper's reference) with N full models, its default;
- ``comlrl-lora``: CoMLRL's trainer given N peft LoRA models (collab's LoRA, lr 1e-3).

``--algo collm_cc`` runs collab's CoLLM-CC (its centralized critic, a LoRA adapter with a value head on the
shared base) on the same task, collab's two sides only.

Axes (``--axis``): ``agents`` (N = 2, 4, 8 at K 4 and 64 new tokens), ``k`` (K = 2, 4, 8, 16 at N = 2) and
``length`` (64, 128, 256, 512 new tokens at N = 2, K 4); ``--values`` runs some of an axis's points. Every point
runs each side in a subprocess of its own, ``--steps`` optimizer steps (3: the first is warm-up, the figure the
median of the rest), and its peak is that of its whole process tree (sampled every 50 ms, and the kernel's
``ru_maxrss``). A side that fails (a kernel OOM kill of CoMLRL's 8 full models, say) is reported with its exit
status. One PNG a run (s/step and peak GiB against the axis, one line a side) beside the markdown table
(``--out``), both written again after every point with the raw results (``.json``): a long run stopped part-way
keeps what it measured.

The peers are benchmark-only dependencies in a virtualenv of their own (``benchmarks/peers.py --setup VENV``):

    PYTHONPATH=src /tmp/peers-venv/bin/python benchmarks/team_scaling.py --axis agents --out /tmp/scaling_agents.md
    PYTHONPATH=src /tmp/peers-venv/bin/python benchmarks/team_scaling.py --axis agents --algo collm_cc
    PYTHONPATH=src /tmp/peers-venv/bin/python benchmarks/team_scaling.py --axis k --sides collab comlrl-lora
    OMP_NUM_THREADS=1 PYTHONPATH=src /tmp/peers-venv/bin/python benchmarks/team_scaling.py --model tiny --steps 2

Time it on an otherwise idle machine (peers.py says why); ``--model tiny`` is a smoke run, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (the posts, both sides' runs, the venv set-up)

TARGET = 10
"""Agent i's target length in words: ``TARGET * (i + 1)``."""
AXES = {"agents": [2, 4, 8], "k": [2, 4, 8, 16], "length": [64, 128, 256, 512]}
DEFAULT = {"agents": 2, "k": 4, "length": 64}
SIDES = ["collab", "collab-full", "comlrl", "comlrl-lora"]
NAMES = {"collab": "collab LoRA", "collab-full": "collab full", "comlrl": "CoMLRL full", "comlrl-lora": "CoMLRL LoRA"}
PROMPTS = 2
LR, FULL_LR = 1e-3, 5e-6
SAMPLING = dict(temperature=0.7, top_p=0.9, top_k=0)
REWARDS: list[float] = []


def target(agent: int) -> int:
    return TARGET * (agent + 1)


def prompt(agent: int, post: str) -> str:
    return f"Summarise this post in about {target(agent)} words.\nPost: {post}"


def team_reward(texts: list[str]) -> float:
    """The team's reward: the mean over agents of ``-|words - target| / target`` (0 at every target)."""
    REWARDS.append(statistics.fmean(-abs(len(t.split()) - target(i)) / target(i) for i, t in enumerate(texts)))
    return REWARDS[-1]


def point(axis: str, value: int) -> dict:
    """The settings of one point of an axis: agents, K and new tokens."""
    return {**DEFAULT, axis: value}


# -- the sides, each in its own process -------------------------------------------------------------------
def run_collab(algo: str, p: dict, args, full: bool) -> list[float]:
    from collab.policy.team import AgentSpec, LoraSpec, SamplingSpec

    n = p["agents"]
    lora = LoraSpec(r=8, alpha=16, dropout=0.0, target_modules=list(peers.LORA["target_modules"]))
    sampling = SamplingSpec(**SAMPLING, max_new_tokens=p["length"])
    specs = [AgentSpec(finetune="full" if full else "lora", lora=lora, sampling=sampling) for _ in range(n)]
    options = dict(num_generations=p["k"], agent_lr=FULL_LR if full else LR, kl_coef=0.0, log_kl_every=0)
    if algo != "magrpo":  # CoLLM-CC: one sample per agent and task, its critic
        options = dict(agent_lr=FULL_LR if full else LR)
    options["ppo"] = {"num_epochs": 1}
    tasks = [[prompt(i, post) for i in range(n)] for post in peers.posts(PROMPTS)]
    names = [f"writer{i + 1}" for i in range(n)]
    return peers.collab_times(
        algo, tasks, names, lambda a: team_reward(list(a)), specs, options, args.model, args.steps
    )


def run_comlrl(p: dict, args, lora: bool) -> list[float]:
    tasks = [[prompt(i, post) for i in range(p["agents"])] for post in peers.posts(PROMPTS)]
    return peers.comlrl_times(
        args.folder,
        tasks,
        k=p["k"],
        tokens=p["length"],
        lr=LR if lora else FULL_LR,
        sampling=SAMPLING,
        reward=team_reward,
        lora=lora,
        steps=args.steps,
    )


def run_side(algo: str, side: str, p: dict, args) -> list[float]:
    if side.startswith("collab"):
        return run_collab(algo, p, args, full=side == "collab-full")
    return run_comlrl(p, args, lora=side == "comlrl-lora")


# -- the parent -------------------------------------------------------------------------------------------
def launch(algo: str, side: str, p: dict, args) -> dict:
    """One side at one point in a subprocess of its own: its step times and the peak of its process tree."""
    from collab.compare.running import TreePeak

    python = (args.python_comlrl if side.startswith("comlrl") else args.python_collab) or sys.executable
    spec = json.dumps({"algo": algo, "side": side, "point": p})
    cmd = [python, __file__, "--child", spec, "--folder", args.folder, "--model", args.model]
    cmd += ["--steps", str(args.steps)]
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "WANDB_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(peers.REPO / "src"), os.environ.get("PYTHONPATH")])),
    }
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, text=True)
        with TreePeak(proc) as peak:
            proc.wait()
        out.seek(0), err.seek(0)
        lines = [x for x in out.read().splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            return {"status": f"failed (exit {proc.returncode})", "error": err.read()[-3000:]}
    result = json.loads(lines[-1][7:])
    result["rss_gb"] = max(result.pop("own_rss_gb"), peak.bytes / 2**30)
    result["s_per_step"] = statistics.median(result["times"][1:] or result["times"])
    result["status"] = "ran"
    return result


def table(axis: str, results: dict, sides: list[str]) -> list[str]:
    """One row a point, each side's s/step and peak GiB, and collab LoRA's ratios to each other side."""
    head = [axis] + [f"{NAMES[s]} {what}" for s in sides for what in ("s/step", "GiB")]
    others = [s for s in sides if s != "collab"]
    if "collab" in sides:
        head += [f"collab / {NAMES[s]} {what}" for s in others for what in ("time", "memory")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for value in [v for v in AXES[axis] if any((v, s) in results for s in sides)]:
        row, got = [str(value)], {s: results.get((value, s)) for s in sides}
        ran = {s: r for s, r in got.items() if r and r["status"] == "ran"}
        for s in sides:
            r = got[s]
            row += [f"{r['s_per_step']:.2f}", f"{r['rss_gb']:.2f}"] if s in ran else [r["status"] if r else "-", ""]
        if "collab" in sides:
            for s in others:
                mine, r = ran.get("collab"), ran.get(s)
                ratios = [mine["s_per_step"] / r["s_per_step"], mine["rss_gb"] / r["rss_gb"]] if mine and r else []
                row += [f"{x:.2f}" for x in ratios] or ["", ""]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def plot(axis: str, results: dict, sides: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (time_ax, mem_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for s in sides:
        ran = [(v, results[v, s]) for v in AXES[axis] if (v, s) in results and results[v, s]["status"] == "ran"]
        if ran:
            time_ax.plot([v for v, _ in ran], [r["s_per_step"] for _, r in ran], marker="o", label=NAMES[s])
            mem_ax.plot([v for v, _ in ran], [r["rss_gb"] for _, r in ran], marker="o", label=NAMES[s])
    for ax, label in ((time_ax, "seconds per step"), (mem_ax, "peak memory (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(AXES[axis], [str(v) for v in AXES[axis]])
        ax.set_xlabel({"agents": "agents N", "k": "samples K", "length": "new tokens"}[axis])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    time_ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--axis", choices=list(AXES), default="agents", help="what grows (default: %(default)s)")
    ap.add_argument("--algo", choices=["magrpo", "collm_cc"], default="magrpo", help="(default: %(default)s)")
    ap.add_argument("--sides", nargs="+", choices=SIDES, help="(default: all four for magrpo, collab's for collm_cc)")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="(default: %(default)s; tiny for a smoke run)")
    ap.add_argument("--values", nargs="+", type=int, help="the axis's points to run (default: all of them)")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps a side, the first warm-up (default: 3)")
    ap.add_argument("--python-collab", metavar="PYTHON", help="interpreter of collab's sides (default: this one)")
    ap.add_argument("--python-comlrl", metavar="PYTHON", help="interpreter of CoMLRL's sides (default: this one)")
    ap.add_argument("--out", metavar="FILE.md", help="the table here, the plot beside it (FILE.png)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        times = run_side(spec["algo"], spec["side"], spec["point"], args)
        own = peers.peak_rss_gb()
        print("RESULT " + json.dumps({"times": times, "own_rss_gb": own, "mean_reward": statistics.fmean(REWARDS)}))
        return
    sides = args.sides or (SIDES if args.algo == "magrpo" else ["collab", "collab-full"])
    if args.algo != "magrpo" and any(s.startswith("comlrl") for s in sides):
        ap.error("CoMLRL's sides run MAGRPO only (--algo magrpo)")
    values = args.values or AXES[args.axis]
    if not set(values) <= set(AXES[args.axis]):
        ap.error(f"--values for axis {args.axis}: a subset of {AXES[args.axis]}, got {values}")
    args.folder = peers.peer_folder(args.model)
    results = {}
    for value in values:
        p = point(args.axis, value)
        for side in sides:
            print(f"{args.axis} {value}: {NAMES[side]} ...", end=" ", flush=True)
            r = results[value, side] = launch(args.algo, side, p, args)
            ran = r["status"] == "ran"
            steps = " ".join(f"{t:.2f}" for t in r.get("times", []))
            print(f"s/step {steps}, peak {r['rss_gb']:.2f} GiB" if ran else f"{r['status']}\n{r['error']}", flush=True)
            if args.out:  # after every point: a long run stopped part-way keeps what it measured
                write(Path(args.out), args, results, sides)
    print("\n" + "\n".join(report(args, results, sides)))


def title(args) -> str:
    return f"{args.algo}, {args.model}, {args.steps} steps (median after the first); axis {args.axis}"


def report(args, results: dict, sides: list[str]) -> list[str]:
    d = DEFAULT
    settings = f"N {d['agents']}, K {d['k']}, {d['length']} new tokens unless varied, {PROMPTS} posts a step"
    return [f"{title(args)}; {settings}", "", *table(args.axis, results, sides)]


def write(out: Path, args, results: dict, sides: list[str]) -> None:
    """The table (``out``), the plot (``.png``) and every side's raw result (``.json``) beside it."""
    out.write_text("\n".join(report(args, results, sides)) + "\n")
    plot(args.axis, results, sides, out.with_suffix(".png"), title(args))
    raw = [{"value": v, "side": s, **r} for (v, s), r in results.items()]
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
