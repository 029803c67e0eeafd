"""The cells of ``python -m collab.compare``: what each run is, how it is checked before anything runs, how
it runs (one subprocess) and the record it leaves.

A grid is methods x envs x seeds. A method is

- an algorithm (``magrpo``, ``ippo``...): ``python -m collab.fit --algo A`` trained on the env;
- ``grpo``, the single-agent control: MAGRPO with one agent (n = 1 is GRPO: :mod:`collab.algos.magrpo`)
  that does every role of the env at once, as the ``single`` baseline's model does
  (:class:`~collab.evaluation.baselines.SingleModelEnv`: its prompt, its reply cut back into the roles'
  actions, the env's own score). Its env is ``collab.evaluation.grid:SingleAgent_<env>`` (a class path, as
  for an env of one's own) and its one agent takes agent 0's LoRA and sampling with the sum of the agents'
  response lengths, the single baseline's length budget;
- a prompt baseline (``single``, ``parallel``, ``pipeline``, ``discussion``): ``python -m collab.evaluate
  --baseline B`` with MAGRPO's untrained team, no training.

Seed k is ``--seed_everything k --data.seed k``. Every trained run has the same evaluation: the
:class:`~collab.training.callbacks.EvaluationCallback` before and after training on the env's eval split
(``eval_tasks`` tasks x ``eval_samples`` sampled episodes, drawn from seed k: a method and its control are
scored on the same draws' seeds), and the same budget, enforced by :class:`Budget` (``--trainer.max_steps
-1``): rollouts, or generated tokens. The baselines play the same tasks and samples with ``--seed_everything
k``. The run's own callbacks list is replaced by the grid's (adapters, reward summary, evaluation, budget;
no Lightning checkpoint: a killed cell restarts from scratch).

A cell is done when its record ``<out>/records/<cell>.json`` exists: written (atomically) after its
subprocess ended, successfully or not; a cell without one is run again from an empty folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lightning as L

from collab.errors import UserError, require, unknown

CONTROL = "grpo"
"""The single-agent control: the method every other is paired against."""
BASELINES = ("single", "parallel", "pipeline", "discussion")
OWNED = ("--algo", "--seed_everything", "--data.seed", "--data.env", "--trainer.default_root_dir", "--trainer.max_steps",
         "--trainer.callbacks", "--ckpt_path")
"""Options the grid sets itself: refused among the overrides."""
OWNED_DEFAULTS = tuple(o for o in OWNED if o not in ("--trainer.max_steps", "--trainer.callbacks"))
"""What ``--defaults`` sets itself, or keeps as each main job has it (its env); its budget and callbacks may be
overridden (``--trainer.max_steps 2``: every job shorter)."""


# -- the single-agent env and the budget, named by class path in the runs' configs ---------------------------
def single_agent_env(name: str) -> type:
    """An env class doing every role of env ``name`` with one agent (the ``grpo`` control). Its options are the
    inner env's; the wrapper keeps the inner env's name, so the eval metrics and score columns are the env's."""
    from collab.envs import env_class, make_env
    from collab.evaluation.baselines import SingleModelEnv

    env_class(name)  # unknown: one line naming the valid ones

    class SingleAgent(SingleModelEnv):
        def __init__(self, **options) -> None:
            super().__init__(make_env(name, **options))

    SingleAgent.__name__ = SingleAgent.__qualname__ = f"SingleAgent_{name}"
    return SingleAgent


def __getattr__(attr: str):  # collab.evaluation.grid:SingleAgent_<env>, the grpo control's --data.env
    if attr.startswith("SingleAgent_"):
        return single_agent_env(attr.removeprefix("SingleAgent_"))
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


class Budget(L.Callback):
    """Stop training after the rollout that reaches ``rollouts`` rollouts or ``tokens`` generated tokens (the
    completion tokens of every agent, ``rollout/tokens`` summed over rollouts and processes); the counts go to
    ``reward_summary.json`` under ``budget``. A token budget overshoots by less than one rollout."""

    def __init__(self, rollouts: int | None = None, tokens: int | None = None) -> None:
        require((rollouts is None) != (tokens is None), "Budget takes rollouts or tokens, one of them")
        self.limit_rollouts, self.limit_tokens = rollouts, tokens
        self.rollouts, self.tokens = 0, 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.rollouts += 1
        self.tokens += float(trainer.callback_metrics.get("rollout/tokens", 0.0)) * trainer.world_size
        if (self.limit_rollouts and self.rollouts >= self.limit_rollouts) or \
                (self.limit_tokens and self.tokens >= self.limit_tokens):
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        from collab.training.callbacks import update_summary

        update_summary(trainer, {"budget": {"rollouts": self.rollouts, "tokens": int(self.tokens),
                                            "steps": trainer.global_step}})


# -- the grid -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """What every cell shares: the budget, the evaluation and the user's overrides."""

    rollouts: int | None
    tokens: int | None
    eval_samples: int = 2
    eval_tasks: int | None = None
    tasks_per_batch: int = 4
    overrides: tuple[str, ...] = ()
    score: str | None = None  # an info key of the env's last step (``majority@2``); None: solved, else the return
    defaults: bool = False
    """Each algorithm's main job as it is (``collab.compare --defaults``): its own env, budget and held-out
    evaluation; the budget and evaluation fields above are unused."""

    def budget(self) -> str:
        if self.defaults:
            return "each main job's own (--defaults: python -m collab.fit --algo A with seed k and nothing else)"
        return f"{self.rollouts} rollouts" if self.rollouts else f"{self.tokens} generated tokens"


@dataclass(frozen=True)
class Cell:
    method: str
    env: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.method}-{self.env}-{self.seed}"

    @property
    def kind(self) -> str:
        return "baseline" if self.method in BASELINES else ("control" if self.method == CONTROL else "algorithm")


def plan(algos: list[str], controls: list[str], envs: list[str], seeds: list[int]) -> list[Cell]:
    """The cells, env by env and seed by seed: the control first, then the algorithms, then the baselines (a name
    given twice counts once)."""
    methods = ([CONTROL] if CONTROL in controls else []) + list(algos) + [c for c in controls if c != CONTROL]
    return [Cell(m, e, s) for e in dict.fromkeys(envs) for s in seeds for m in dict.fromkeys(methods)]


def check_names(algos: list[str], controls: list[str], envs: list[str], seeds: list[int], settings: Settings) -> None:
    """The grid's names and numbers, before anything is built: one UserError naming what is wrong."""
    from collab.envs import env_names
    from collab.training.checks_options import check_env_pair

    require(bool(algos) or bool(controls), "the grid is empty: give --algos (and/or --controls)")
    for algo in algos:
        if algo in (CONTROL, *BASELINES):
            raise UserError(f"{algo} is a control, not an algorithm: give it in --controls")
    check_algos(algos)
    for control in controls:
        if control not in (CONTROL, *BASELINES):
            raise unknown("control", control, (CONTROL, *BASELINES))
    require(bool(envs), "give at least one env (--envs)")
    for env in envs:
        if env not in env_names():
            raise unknown("env", env, env_names())
        for algo in algos:
            check_env_pair(algo, env)
    check_seeds(seeds)
    require((settings.rollouts is None) != (settings.tokens is None), "give the budget: --rollouts N or --tokens N")
    require((settings.rollouts or settings.tokens or 0) >= 1, f"the budget must be >= 1, got {settings.budget()}")
    require(settings.eval_samples >= 1, f"--eval_samples must be >= 1, got {settings.eval_samples}")
    require(settings.eval_tasks is None or settings.eval_tasks >= 1, f"--eval_tasks must be >= 1, got {settings.eval_tasks}")
    require(settings.tasks_per_batch >= 1, f"--tasks_per_batch must be >= 1, got {settings.tasks_per_batch}")
    check_overrides(settings)


def check_algos(algos: list[str]) -> None:
    """Each name an algorithm of the registry."""
    from collab.algos import algo_registry

    registry = algo_registry()
    for algo in algos:
        if algo not in registry:
            raise unknown("algo", algo, registry)


def check_seeds(seeds: list[int]) -> None:
    require(bool(seeds) and len(set(seeds)) == len(seeds) and min(seeds) >= 0,
            f"--seeds must be distinct non-negative integers, got {seeds}")


def check_overrides(settings: Settings) -> None:
    for arg in settings.overrides:
        option = arg.split("=", 1)[0]
        if settings.defaults and option in OWNED_DEFAULTS:
            raise UserError(f"{option} is set by collab.compare --defaults for each run (or is the main job's own); "
                            "use --algos, --seeds, --output instead")
        if not settings.defaults and option in OWNED:
            raise UserError(f"{option} is set by collab.compare for each run; use --algos, --envs, --seeds, --rollouts "
                            "or --tokens, --eval_samples, --eval_tasks, --output instead")


def plan_defaults(algos: list[str], seeds: list[int], settings: Settings) -> list[Cell]:
    """``--defaults``: each algorithm's main job (``python -m collab.fit --algo A``, seed k, the user's overrides
    and nothing else) on seeds; a cell's env is the one that job trains on (its config's). Seed by seed, so that
    a grid stopped early holds every algorithm's first seeds. The names are checked here, before anything is
    built."""
    from collab.training.configs import config_files, run_env

    require(bool(algos), "--defaults runs the main jobs of --algos: give at least one")
    check_algos(algos)
    check_seeds(seeds)
    check_overrides(settings)
    envs = {a: run_env(config_files(a, list(settings.overrides))[0], list(settings.overrides)) for a in algos}
    return [Cell(a, envs[a], s) for s in seeds for a in dict.fromkeys(algos)]


def check_cells(cells: list[Cell], settings: Settings, out: Path) -> dict[tuple[str, str], list[str]]:
    """Build (without running) each method's run on each env as its subprocess will (:func:`collab.fit.build_cli`:
    configs, overrides, env options, the algorithm's options) and each baseline's protocol on its env: a bad
    override or a pair that cannot run ends in fit's or evaluate's one line before any cell starts. Returns
    ``{(method, env): extra arguments}`` (the control's one agent)."""
    from collab.evaluation.baselines import prepare
    from collab.fit import build_cli

    extra: dict[tuple[str, str], list[str]] = {}
    built: dict[str, object] = {}
    for cell in cells:
        key = (cell.method, cell.env)
        if key in extra:
            continue
        if cell.kind == "baseline":
            cli = built.get(cell.env) or build_cli("magrpo", fit_args(Cell("magrpo", cell.env, cell.seed), settings, out, []))
            built[cell.env] = cli
            try:
                prepare(cell.method, cli.datamodule.env)
            except UserError as e:
                raise UserError(f"{cell.method} cannot run on env {cell.env!r}: {e}") from None
            extra[key] = []
            continue
        if cell.kind == "control":
            cli = built.get(cell.env) or build_cli("magrpo", fit_args(Cell("magrpo", cell.env, cell.seed), settings, out, []))
            built[cell.env] = cli
            extra[key] = one_agent(cli.config["model"]["agents"])
        cli = build_cli(algo_of(cell), fit_args(cell, settings, out, extra.get(key, [])))
        if cell.method == "magrpo" or cell.env not in built:
            built[cell.env] = cli
        extra.setdefault(key, [])
    if settings.score:
        for env_name, cli in built.items():
            keys = score_keys(cli.datamodule.env)
            if settings.score not in keys:
                raise UserError(f"--score {settings.score!r} is not reported by env {env_name!r}; it reports: "
                                f"{', '.join(sorted(keys))}")
    return extra


def score_keys(env) -> set[str]:
    """What ``--score`` may name on ``env``: ``return`` and the info keys of an episode's last step, found by one
    episode on the first eval task (the first training task where the env has no eval split) in which every
    agent answers with an empty response."""
    tasks = env.tasks("eval") or env.tasks("train")
    state = env.reset(tasks[0])
    for _ in range(env.horizon):
        step = env.step_batch([state], [[""] * env.n_agents])[0]
        if step.done:
            break
        state = step.state
    return {"return", *step.info}


def one_agent(agents) -> list[str]:
    """``--model.agents`` of the control: agent 0's options, its response length the sum of every agent's (the
    single baseline's budget; ``None`` when one has none: the env's roles' sum); none given: the role's defaults."""
    if not agents:
        return []
    specs = [a.as_dict() if hasattr(a, "as_dict") else dict(a) for a in agents]
    lengths = [(s.get("sampling") or {}).get("max_new_tokens") for s in specs]
    spec = {k: v for k, v in specs[0].items() if k not in ("role", "system_prompt", "choices")}
    spec["sampling"] = {**(spec.get("sampling") or {}), "max_new_tokens": None if None in lengths else sum(lengths)}
    return ["--model.agents", json.dumps([spec])]


def algo_of(cell: Cell) -> str:
    return "magrpo" if cell.kind == "control" else cell.method


def cell_dir(out: Path, cell: Cell) -> Path:
    return out / "cells" / cell.name


def record_path(out: Path, cell: Cell) -> Path:
    return out / "records" / f"{cell.name}.json"


def callbacks_config(cell: Cell, settings: Settings) -> dict:
    """The trainer options of a trained cell (its ``--config``): the grid's callbacks, no step limit."""
    evaluation = {"at_start": True, "greedy": False, "num_samples": settings.eval_samples, "seed": cell.seed,
                  "ks": [1], "max_tasks": settings.eval_tasks, "tasks_per_batch": settings.tasks_per_batch,
                  "score": settings.score}
    return {"trainer": {"max_steps": -1, "enable_checkpointing": False, "callbacks": [
        {"class_path": "collab.training.callbacks.AdapterCheckpoint"},
        {"class_path": "collab.training.callbacks.RewardSummary", "init_args": {"window": 3}},
        {"class_path": "collab.training.callbacks.EvaluationCallback", "init_args": evaluation},
        {"class_path": "collab.evaluation.grid.Budget",
         "init_args": {"rollouts": settings.rollouts, "tokens": settings.tokens}}]}}


def fit_args(cell: Cell, settings: Settings, out: Path, extra: list[str]) -> list[str]:
    """``collab.fit``'s arguments of a trained cell (without ``--algo``): the user's overrides, the grid's
    config (written to the cell's folder), the cell's env and seed; with ``--defaults``, the overrides and the
    seed alone."""
    folder = cell_dir(out, cell)
    if settings.defaults:  # the main job as a researcher runs it
        folder.mkdir(parents=True, exist_ok=True)
        return [*settings.overrides, "--seed_everything", str(cell.seed), "--data.seed", str(cell.seed),
                "--trainer.default_root_dir", str(folder)]
    config = folder / "grid.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(callbacks_config(cell, settings), indent=1))  # JSON is YAML
    env = f"collab.evaluation.grid:SingleAgent_{cell.env}" if cell.kind == "control" else cell.env
    return [*settings.overrides, "--config", str(config), *extra, "--data.env", env,
            "--seed_everything", str(cell.seed), "--data.seed", str(cell.seed), "--trainer.default_root_dir", str(folder)]


def command(cell: Cell, settings: Settings, out: Path, extra: list[str]) -> list[str]:
    """The subprocess of a cell."""
    if cell.kind == "baseline":
        folder = cell_dir(out, cell)
        args = ["--algo", "magrpo", "--baseline", cell.method, "--num_samples", str(settings.eval_samples), "--k", "1",
                "--tasks_per_batch", str(settings.tasks_per_batch), "--output", str(folder / "metrics.json"),
                *settings.overrides, "--data.env", cell.env, "--seed_everything", str(cell.seed), "--data.seed", str(cell.seed)]
        if settings.eval_tasks:
            args[2:2] = ["--max_tasks", str(settings.eval_tasks)]
        return [sys.executable, "-m", "collab.evaluate", *args]
    return [sys.executable, "-m", "collab.fit", "--algo", algo_of(cell), *fit_args(cell, settings, out, extra)]


# -- running a cell -----------------------------------------------------------------------------------------
def _children(pid: int) -> list[int] | None:
    """The child processes of ``pid`` from ``/proc/<pid>/task/<tid>/children`` (a read per thread of ``pid``);
    ``None`` where the kernel has no such files."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # ended
    out: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended
            return None
        except OSError:
            continue
    return out


def _process_tree(root: int) -> set[int]:
    """``root`` and every process below it: the children files where the kernel has them, else one scan of
    every process's parent in ``/proc``."""
    tree, frontier = {root}, [root]
    while frontier:
        below = [_children(pid) for pid in frontier]
        if any(b is None for b in below):
            break
        frontier = [c for b in below for c in b if c not in tree]
        tree.update(frontier)
    else:
        return tree
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    tree, frontier = {root}, [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier and pid not in tree]
        tree.update(frontier)
    return tree


def tree_rss(root: int) -> int:
    """Resident bytes of process ``root`` and every process below it (Linux ``/proc``; 0 elsewhere)."""
    if not os.path.isdir("/proc"):
        return 0
    page, total = os.sysconf("SC_PAGE_SIZE"), 0
    for pid in _process_tree(root):
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
    return total


class TreePeak:
    """``with TreePeak(proc) as peak:`` samples the resident bytes of ``proc`` (a ``Popen``) and its children every
    ``every`` seconds in a thread while the process runs; ``peak.bytes`` is the largest sum seen. The block should end
    with the process (``wait``/``communicate``): leaving it joins the sampler."""

    def __init__(self, proc, every: float = 0.05) -> None:
        self.proc, self.every, self.bytes = proc, every, 0
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while self.proc.poll() is None:
            self.bytes = max(self.bytes, tree_rss(self.proc.pid))
            time.sleep(self.every)

    def __enter__(self) -> "TreePeak":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._thread.join()


@dataclass
class Record:
    """What a cell left: how it ended, its cost and its held-out figures (``score`` after training)."""

    method: str
    kind: str
    env: str
    seed: int
    returncode: int
    wall_s: float
    peak_rss_bytes: int
    command: list[str]
    run_dir: str = ""
    score: float | None = None
    score_se: float | None = None
    before: float | None = None
    gain: float | None = None
    gain_se: float | None = None
    score_key: str = ""
    eval_problems: int | None = None
    eval_samples: int | None = None
    rollouts: int | None = None
    steps: int | None = None
    tokens: int | None = None
    jobs: int = 1
    metrics: dict = field(default_factory=dict)
    before_se: float | None = None


class Running:
    """The cells' subprocesses running now (several with ``--jobs``). ``stop()`` (the grid's Ctrl-C or SIGTERM)
    ends them all; a cell ended so, or not started yet, raises KeyboardInterrupt in :func:`run_cell` and leaves no
    record. ``jobs``: how many run at once (in each record: their wall times shared the machine)."""

    def __init__(self, jobs: int = 1) -> None:
        self.jobs = jobs
        self.procs: set = set()
        self.stopped = False
        self._lock = threading.Lock()

    def start(self, proc) -> None:
        with self._lock:
            self.procs.add(proc)
            if self.stopped:
                proc.terminate()

    def end(self, proc) -> None:
        with self._lock:
            self.procs.discard(proc)

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            procs = list(self.procs)
        for proc in procs:
            proc.terminate()


def run_cell(cell: Cell, settings: Settings, out: Path, extra: list[str], running: Running | None = None,
             threads: int | None = None) -> Record:
    """Run ``cell`` from an empty folder (its output to ``<cell>/log.txt``; ``threads``: its ``OMP_NUM_THREADS``),
    sampling the process tree's resident memory every 50 ms; write and return its record."""
    import shutil

    running = running or Running()
    if running.stopped:
        raise KeyboardInterrupt
    folder = cell_dir(out, cell)
    shutil.rmtree(folder, ignore_errors=True)  # a cell killed before its record: from scratch
    folder.mkdir(parents=True)
    cmd = command(cell, settings, out, extra)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    start = time.perf_counter()
    with open(folder / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
        running.start(proc)
        with TreePeak(proc) as peak:
            try:
                proc.wait()
            except BaseException:  # Ctrl-C or SIGTERM of the grid: stop the cell too, leave no record
                proc.terminate()
                proc.wait()
                raise
            finally:
                running.end(proc)
    if running.stopped:  # ended by the grid's stop: no record, the cell runs again next time
        raise KeyboardInterrupt
    record = Record(cell.method, cell.kind, cell.env, cell.seed, proc.returncode, time.perf_counter() - start,
                    peak.bytes, cmd, jobs=running.jobs)
    fill(record, folder, settings.score)
    write_record(out, cell, asdict(record))
    return record


def fill(record: Record, folder: Path, score: str | None = None) -> None:
    """The held-out figures and counts of a finished cell: a trained run's ``reward_summary.json``, a
    baseline's metrics (the score: when the grid names one, the mean of that info key at the episodes' last step,
    ``eval/env/<score>`` (else ``eval/<score>``), as the trained runs' evaluation scores it; else ``eval/pass@1``
    where the env reports solved, else ``eval/return``: what the evaluation callback's ``eval/score`` is for
    equal samples per task)."""
    if record.returncode != 0:
        return
    if record.kind == "baseline":
        path = folder / "metrics.json"
        if path.is_file():
            metrics = json.loads(path.read_text())
            if score:  # the mean of the env's last-step info KEY (eval/env/KEY), as the trained runs' evaluation
                key = f"eval/env/{score}" if f"eval/env/{score}" in metrics else f"eval/{score}"
            else:
                key = "eval/pass@1" if "eval/pass@1" in metrics else "eval/return"
            record.metrics, record.score = metrics, metrics.get(key)
            record.score_key = key.removeprefix("eval/").removeprefix("env/")
            record.eval_problems, record.eval_samples = metrics.get("eval/problems"), metrics.get("eval/samples")
        return
    summaries = sorted(folder.glob("*/version_*/reward_summary.json"))
    if not summaries:
        return
    summary = json.loads(summaries[-1].read_text())
    record.run_dir = str(summaries[-1].parent)
    held = summary.get("held_out") or {}
    budget = summary.get("budget") or {}
    record.score, record.score_se, record.before = held.get("after"), held.get("after_se"), held.get("before")
    record.before_se = held.get("before_se")
    record.gain, record.gain_se, record.score_key = held.get("gain"), held.get("gain_se"), held.get("score") or ""
    record.eval_problems, record.eval_samples = held.get("problems"), held.get("samples")
    record.rollouts, record.steps, record.tokens = budget.get("rollouts"), budget.get("steps"), budget.get("tokens")


def write_record(out: Path, cell: Cell, record: dict) -> None:
    """The cell's record, written atomically (its presence means done)."""
    from collab.training.resume import atomic_write_text

    atomic_write_text(record_path(out, cell), json.dumps(record, indent=1))


def read_record(out: Path, cell: Cell) -> dict | None:
    path = record_path(out, cell)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):  # not ours (the write is atomic): run the cell again
        return None
