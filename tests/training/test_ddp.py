"""Multi-process training: 2 CPU processes on gloo through Lightning's DDP (CoLLM-CC through collab's fsdp: FSDP2,
every model of the team sharded), every algorithm and env.

Each run checks that the ranks played disjoint shares of every step's tasks, that after every
optimizer step both ranks hold bitwise the same trainable weights (one gradient synchronisation per
step, the same number of steps and backward passes on each rank: ``collab.runtime.collectives``), that the
run ends cleanly with one checkpoint, and that the checkpoint resumes on one process.

Rank 0 gets a reward that varies with the action and rank 1 gets 0 for everything (no learning signal
for MAGRPO's group advantages): the run must neither hang nor let the ranks drift apart, and rank 0's
signal must move both ranks' weights. Every run evaluates the team on held-out tasks before training (an eval
split smaller than the world size for matrix, ones not divisible by it elsewhere): both ranks and a 1-process
run must give the same
figures, each task scored once. The first update is then compared with a 1-process update on the
union of both ranks' first rollouts (the same rollouts fed again, from the same weights): the
synchronised gradient must equal the 1-process one, which holds only if every loss normaliser and
advantage statistic is global (``tests/support/ddp_probe.py``). Two of the runs start their processes as a
cluster would (torchrun, and SLURM's srun emulated), one through Lightning's launcher as a user's command does, the
others forked warm as that launcher starts its children (tests/support/warm.py).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support import warm
from tests.support.algos import algos, settings

ROOT = Path(__file__).resolve().parents[2]

# each algorithm's run: its env and options (tests/support/algos.py's ``ddp``; together they cover every env of
# src/collab/envs), the eval tasks of its held-out evaluation (``eval_tasks``: matrix's eval split holds 1 task, fewer
# than the 2 processes: rank 1 scores none; 3 and 5 do not divide into 2 processes x batches of 2 tasks, minecraft's 4
# do), how its processes start (``launcher``) and its strategy
RUNS = {algo: settings(algo).ddp for algo in algos()}


def env_of(algo: str) -> str:
    return RUNS[algo][RUNS[algo].index("--data.env") + 1]


# the envs whose train split holds fewer tasks than a global batch (matrix: one): the ranks' shares repeat them
FEW_TRAIN_TASKS: set[str] = {"matrix"}

# the envs whose responses all have one length (matrix's one-letter choices) or nearly (coding's first agent):
# the probe's signal reward is a digest of the responses there, so that rank 0's group advantages are not 0
TEXT_SIGNAL = {"matrix", "coding"}


def callbacks(algo: str, evaluate: bool = True) -> str:
    """Checkpoints, the probe and a held-out evaluation before training (sampled, seeded: the same draws
    at any world size; 2 samples per task in batches of 2 tasks). Only the start is evaluated: the
    weights of a 2-process and a 1-process run agree only there (``evaluate=False``: a resumed run's start,
    which nothing compares)."""
    evaluation = {
        "class_path": "collab.training.callbacks.EvaluationCallback",
        "init_args": {
            "at_start": True,
            "at_end": False,
            "num_samples": 2,
            "ks": [1, 2],
            "seed": 7,
            "max_tasks": settings(algo).eval_tasks,
            "tasks_per_batch": 2,
        },
    }
    return json.dumps(
        [
            {"class_path": "collab.training.callbacks.ModelCheckpoint", "init_args": {"save_last": True}},
            {"class_path": "tests.support.ddp_probe.Probe"},
            *([evaluation] if evaluate else []),
        ]
    )


# agents per run (solo: 1), each capped at 6 new tokens (model.max_new_tokens alone would not cap them: the
# math and debate roles suggest 256-300 tokens, which the tiny random model always uses up), sampling from the
# policy itself (temperature 1, no top-p): a step of 4 tasks must hold a signal
SIX_TOKENS = {"sampling": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 6}}
AGENTS = {algo: json.dumps([SIX_TOKENS] * (1 if "solo" in " ".join(run) else 2)) for algo, run in RUNS.items()}


def args(algo: str, tmp: Path, extra: list[str], evaluate: bool = True) -> list[str]:
    return [
        "--algo",
        algo,
        *RUNS[algo],
        "--model.base.name",
        "tiny",
        "--model.agents",
        AGENTS[algo],
        "--data.batch_size",
        "4",
        "--trainer.logger.init_args.save_dir",
        str(tmp / "runs"),
        "--trainer.accelerator",
        "cpu",
        "--trainer.callbacks",
        callbacks(algo, evaluate),
        *extra,
    ]


# how each algorithm's 2 processes start (``launcher``): Lightning's own launcher, which starts rank 1 itself, or the
# launches docs/distributed.md gives for clusters, torchrun and SLURM's srun (emulated: two processes with the
# SLURM_* variables srun sets, which Lightning's SLURMEnvironment reads; there is no srun here). The cases of the test
# below: every algorithm under its ``strategy``, ddp but for CoLLM-CC, which runs under collab's fsdp (FSDP2 through
# Lightning: collab.training.fsdp), an actor-critic whose critic reads through the shared, sharded base and whose
# value head stays whole on every process; its gradients must equal one process's as under ddp
CASES = [algo if settings(algo).strategy == "ddp" else f"{algo}+{settings(algo).strategy}" for algo in algos()]


LAUNCHED = {"marft_a"}
"""The algorithms whose ``lightning`` run starts as a user's does (``python -m collab.fit`` in a fresh interpreter
whose Lightning launcher starts rank 1); the other ``lightning`` runs fork both ranks warm with the variables that
launcher gives its children (tests/support/warm.py)."""


def fit(
    algo: str, tmp: Path, extra: list[str], launcher: str | None = None, **probe: str
) -> subprocess.CompletedProcess:
    """A 2-process run of ``python -m collab.fit``, started as ``launcher`` (default: the algorithm's); stdout is
    rank 0's."""
    env = warm.child_env(COLLAB_DDP_PROBE=str(tmp), OMP_NUM_THREADS="1", **probe)
    fit_args = args(algo, tmp, extra)
    launcher = launcher or settings(algo).launcher
    if launcher == "torchrun":
        return subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
            + ["-m", "collab.fit", *fit_args],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    if launcher == "lightning" and algo in LAUNCHED:
        return subprocess.run(
            [sys.executable, "-m", "collab.fit", *fit_args],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    if launcher == "lightning":
        return warm.ranks(fit_args, tmp, env)
    if launcher == "nodes":  # two machines of one process each, on this one: Lightning reads NODE_RANK
        cluster = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(warm.free_port())}
        return both_ranks(fit_args, tmp, [{**env, **cluster, "NODE_RANK": str(r)} for r in (0, 1)])
    slurm = {
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "localhost",
        "SLURM_JOB_ID": "31",
        "SLURM_JOB_NAME": "collab",
        "MASTER_PORT": str(warm.free_port()),
    }
    return both_ranks(
        fit_args, tmp, [{**env, **slurm, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)} for r in (0, 1)]
    )


def both_ranks(fit_args: list[str], tmp: Path, envs: list[dict]) -> subprocess.CompletedProcess:
    """One process per environment in ``envs`` (forked warm), started together as a cluster's launcher would;
    stdout is the first's, stderr both."""
    return warm.finish([warm.server().start(fit_args, tmp, env) for env in envs])


def fit_here(algo: str, tmp: Path, extra: list[str], monkeypatch, evaluate: bool = True, **probe: str) -> int:
    """A 1-process run in this process (no interpreter start-up)."""
    from collab.fit import main

    for key, value in {"COLLAB_DDP_PROBE": str(tmp), **probe}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp)
    return main(args(algo, tmp, extra, evaluate))


HALF = (len(CASES) + 1) // 2
"""The first HALF cases run here, the others in tests/training/test_ddp_more.py: pytest-xdist's ``--dist loadfile``
gives a file to one worker, and the runs are minutes each."""


@pytest.mark.parametrize("case", CASES[:HALF])
def test_two_processes_train_in_lockstep_and_resume_on_one(case, tmp_path, monkeypatch, one_thread):
    lockstep(case, tmp_path, monkeypatch)


def lockstep(case: str, tmp_path: Path, monkeypatch) -> None:
    """The module docstring's checks of one case (``algo`` or ``algo+strategy``)."""
    algo, _, strategy = case.partition("+")
    signal = {"COLLAB_DDP_SIGNAL": "text"} if env_of(algo) in TEXT_SIGNAL else {}
    run = fit(
        algo,
        tmp_path,
        ["--trainer.strategy", strategy or "ddp", "--trainer.devices", "2", "--trainer.max_steps", "2"],
        COLLAB_DDP_SIGNAL_RANKS="0",
        COLLAB_DDP_CAPTURE="1",
        **signal,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr.count("config: ") == 1  # the run says once (rank 0), whatever started its processes
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    if strategy == "fsdp":  # FSDP2: every rank keeps its half of each sharded weight; both took part in every round
        shards = [r["sharded"] for r in ranks]
        print(run.stderr[run.stderr.index("fsdp: ") :].splitlines()[0], shards)
        assert "models sharded across 2 processes (FSDP2" in run.stderr
        assert shards[0]["whole"] == shards[1]["whole"] > 0 and shards[0]["rounds"] == shards[1]["rounds"] > 0
        assert shards[0]["shards"] == shards[1]["shards"] > 0 and shards[0]["uneven"] == shards[1]["uneven"] == []
        # the critic's value head, outside every model, stays whole on both ranks (the digests cover it)
        assert shards[0]["whole_trainable"] == shards[1]["whole_trainable"] != []
        assert shards[0]["local"] + shards[1]["local"] - shards[0]["whole"] <= 0.01 * shards[0]["whole"]
        for s in shards:
            assert abs(s["local"] - s["whole"] / 2) <= 0.01 * s["whole"], s
            assert s["live"] < 0.75 * s["whole"], s  # no whole copy of the weights is alive (the shards' storages)
    else:
        assert ranks[0]["sharded"] is None
    assert ranks[0]["step"] == ranks[1]["step"] == 2
    # bitwise the same weights on both ranks after every optimizer step; rank 0's signal moved them
    assert ranks[0]["digests"] == ranks[1]["digests"] and len(ranks[0]["digests"]) >= 1
    assert ranks[0]["start"] == ranks[1]["start"] != ranks[0]["digests"][0]
    # disjoint shares of every step's tasks (2 of the global 4 each)
    for a, b in zip(ranks[0]["tasks"], ranks[1]["tasks"]):
        assert len(a) == len(b) == 2 and (env_of(algo) in FEW_TRAIN_TASKS or not set(a) & set(b))
    # and each rank samples from a random stream of its own
    assert ranks[0]["sampling"] != ranks[1]["sampling"] and ranks[0]["sampling"]
    ckpts = list((tmp_path / "runs").rglob("*.ckpt"))
    assert [c.name for c in ckpts] == ["last.ckpt"], ckpts
    resume = ["--trainer.max_steps", "3", "--ckpt_path", str(ckpts[0])]
    assert fit_here(algo, tmp_path, resume, monkeypatch, evaluate=False) == 0
    # the first update against one process fed the union of both ranks' first rollouts
    replay = tmp_path / "replay"
    replay.mkdir()
    assert (
        fit_here(
            algo,
            replay,
            ["--trainer.max_steps", "1"],
            monkeypatch,
            COLLAB_DDP_REPLAY=str(tmp_path),
            COLLAB_DDP_CAPTURE="1",
        )
        == 0
    )
    synced, union = torch.load(tmp_path / "grads0.pt"), torch.load(replay / "grads0.pt")
    assert sorted(synced) == sorted(union) and synced
    # float32 sums in another order and over other paddings (2 rows per forward against 4) differ by up to
    # ~2e-4 of a tensor's largest entry (IPPO, measured); a normaliser off by one rank's share is ~0.5 of it.
    # A tensor whose gradient nearly cancels (IPPO's lora_B of layer 0, 1.7e-8 at most against the model's
    # largest entries) keeps the rounding of its terms: the floor is relative to the largest gradient entry.
    floor = 1e-5 * max(float(g.abs().max()) for g in union.values())
    for name in union:
        scale = float(union[name].abs().max())
        assert float((synced[name] - union[name]).abs().max()) <= 2e-3 * scale + floor, (name, scale, floor)
    assert sum(float(g.abs().sum()) for g in union.values()) > 0
    # the held-out evaluation before training: every eval task scored once, the same figures on both ranks
    # and on one process (the replay run starts from the same weights), to a relative 1e-6
    evaluations = [
        ranks[0]["evaluation"],
        ranks[1]["evaluation"],
        json.loads((replay / "rank0.json").read_text())["evaluation"],
    ]
    for e in evaluations:
        e["history"].pop("seconds")  # wall time: each rank's own
    assert evaluations[0] == evaluations[1]
    (two, one) = evaluations[1:]
    assert len(two["scores"]) == len(one["scores"]) == settings(algo).eval_tasks == two["history"]["eval/problems"]
    assert two["scores"] == pytest.approx(one["scores"], rel=1e-6, abs=1e-12)
    figures = {k: v for k, v in one["history"].items() if k.startswith("eval/")}
    assert sorted(figures) == sorted(k for k in two["history"] if k.startswith("eval/"))
    assert {k: two["history"][k] for k in figures} == pytest.approx(figures, rel=1e-6, abs=1e-12, nan_ok=True)
    assert f"({settings(algo).eval_tasks} eval tasks x 2 samples)" in run.stdout
    assert "nan" not in "\n".join(run.stdout.split("evaluation at step 0")[1].splitlines()[:6])


NO_DDP_RUN = {"math", "str_build", "classeval"}
"""The envs without a run here: one run per algorithm, and the envs outnumber the algorithms; math's 2-process runs
are tests/training/test_ddp_resume.py's, test_fsdp_resume.py's and test_fsdp.py's MARFT-T with a calculator;
str_build is a text env of the minecraft package (its world and command code), whose 2-process run is collm_dc's;
classeval scores as coding does (one joint reward from sandboxed tests, which coding's run covers)."""


def test_the_matrix_covers_every_env_and_algorithm():
    from collab.envs import env_names

    covered = {env_of(algo) for algo in RUNS}
    assert covered | NO_DDP_RUN == set(env_names()) and not covered & NO_DDP_RUN
    eval_tasks = [settings(algo).eval_tasks for algo in RUNS]
    assert min(eval_tasks) < 2 and any(n % 2 for n in eval_tasks)
