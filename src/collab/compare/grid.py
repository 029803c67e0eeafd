"""The cells of ``python -m collab.compare``: what each run is and the command it runs as (how a grid is
checked before anything runs: :mod:`collab.compare.checks`; how a cell runs and the record it leaves:
:mod:`collab.compare.running`).

A grid is methods x envs x seeds. A method is an algorithm (``python -m collab.fit --algo A``), ``grpo`` (the
single-agent control: MAGRPO with one agent doing every role, as the ``single`` baseline's model does; its env is
``collab.compare.grid:SingleAgent_<env>``), or a prompt baseline (``python -m collab.evaluate --baseline B``).
Seeds, the shared evaluation and the budget (:class:`StopAtBudget`): docs/evaluation.md, *python -m collab.compare*.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import lightning as L

from collab.errors import require

CONTROL = "grpo"
"""The single-agent control: the method every other is paired against."""
BASELINES = ("single", "parallel", "pipeline", "discussion")
OWNED = (
    "--algo",
    "--seed_everything",
    "--data.seed",
    "--data.env",
    "--trainer.default_root_dir",
    "--trainer.max_steps",
    "--trainer.callbacks",
    "--ckpt_path",
)
"""Options the grid sets itself: refused among the overrides."""
OWNED_DEFAULTS = tuple(o for o in OWNED if o not in ("--trainer.max_steps", "--trainer.callbacks"))
"""What ``--defaults`` sets itself, or keeps as each main job has it (its env); its budget and callbacks may be
overridden (``--trainer.max_steps 2``: every job shorter)."""


# -- the single-agent env and the budget, named by class path in the runs' configs ---------------------------
def single_agent_env(name: str) -> type:
    """An env class doing every role of env ``name`` with one agent (the ``grpo`` control). Its options are the
    inner env's; the wrapper keeps the inner env's name, so the eval metrics and score columns are the env's."""
    from collab.envs import env_class, make_env
    from collab.envs.centralized import SingleModelEnv

    env_class(name)  # unknown: one line naming the valid ones

    class SingleAgent(SingleModelEnv):
        def __init__(self, **options) -> None:
            super().__init__(make_env(name, **options))

    SingleAgent.__name__ = SingleAgent.__qualname__ = f"SingleAgent_{name}"
    return SingleAgent


def __getattr__(attr: str):  # collab.compare.grid:SingleAgent_<env>, the grpo control's --data.env
    if attr.startswith("SingleAgent_"):
        return single_agent_env(attr.removeprefix("SingleAgent_"))
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


class StopAtBudget(L.Callback):
    """Stop training after the rollout that reaches ``rollouts`` rollouts or ``tokens`` generated tokens (the
    completion tokens of every agent, ``rollout/tokens`` summed over rollouts and processes); the counts go to
    ``reward_summary.json`` under ``budget``. A token budget overshoots by less than one rollout."""

    def __init__(self, rollouts: int | None = None, tokens: int | None = None) -> None:
        name = f"{type(self).__module__}.{type(self).__name__}"  # as a config names it
        require(
            (rollouts is None) != (tokens is None),
            f"{name} takes init_args.rollouts or init_args.tokens, one of "
            f"them; got rollouts {rollouts}, tokens {tokens}",
        )
        for key, value, unit in (("rollouts", rollouts, "rollouts"), ("tokens", tokens, "generated tokens")):
            require(value is None or value >= 1, f"{name}: init_args.{key} must be >= 1 ({unit} per run), got {value}")
        self.limit_rollouts, self.limit_tokens = rollouts, tokens
        self.rollouts, self.tokens = 0, 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.rollouts += 1
        self.tokens += float(trainer.callback_metrics.get("rollout/tokens", 0.0)) * trainer.world_size
        if (self.limit_rollouts and self.rollouts >= self.limit_rollouts) or (
            self.limit_tokens and self.tokens >= self.limit_tokens
        ):
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        from collab.training.callbacks import update_summary

        update_summary(
            trainer, {"budget": {"rollouts": self.rollouts, "tokens": int(self.tokens), "steps": trainer.global_step}}
        )


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
        return f"{self.rollouts} rollouts" if self.rollouts is not None else f"{self.tokens} generated tokens"


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


def plan_defaults(algos: list[str], seeds: list[int], settings: Settings) -> list[Cell]:
    """``--defaults``: each algorithm's main job (``python -m collab.fit --algo A``, seed k, the user's overrides
    and nothing else) on seeds; a cell's env is the one that job trains on (its config's). Seed by seed, so that
    a grid stopped early holds every algorithm's first seeds. Its names are checked first
    (:func:`collab.compare.checks.check_defaults`)."""
    from collab.config import read_command_line

    envs = {a: read_command_line(["--algo", a, *settings.overrides]).env() for a in algos}
    return [Cell(a, envs[a], s) for s in seeds for a in dict.fromkeys(algos)]


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
    evaluation = {
        "at_start": True,
        "greedy": False,
        "num_samples": settings.eval_samples,
        "seed": cell.seed,
        "ks": [1],
        "max_tasks": settings.eval_tasks,
        "tasks_per_batch": settings.tasks_per_batch,
        "score": settings.score,
    }
    return {
        "trainer": {
            "max_steps": -1,
            "enable_checkpointing": False,
            "callbacks": [
                {"class_path": "collab.training.callbacks.AdapterCheckpoint"},
                {"class_path": "collab.training.callbacks.RewardSummary", "init_args": {"window": 3}},
                {"class_path": "collab.training.callbacks.EvaluationCallback", "init_args": evaluation},
                {
                    "class_path": "collab.compare.grid.StopAtBudget",
                    "init_args": {"rollouts": settings.rollouts, "tokens": settings.tokens},
                },
            ],
        }
    }


def fit_args(cell: Cell, settings: Settings, out: Path, extra: list[str]) -> list[str]:
    """``collab.fit``'s arguments of a trained cell (without ``--algo``): the user's overrides, the grid's
    config (written to the cell's folder), the cell's env and seed; with ``--defaults``, the overrides and the
    seed alone."""
    folder = cell_dir(out, cell)
    folder.mkdir(parents=True, exist_ok=True)
    seed = str(cell.seed)
    run = ["--seed_everything", seed, "--data.seed", seed, "--trainer.default_root_dir", str(folder)]
    if settings.defaults:  # the main job as a researcher runs it
        return [*settings.overrides, *run]
    config = folder / "grid.yaml"
    config.write_text(json.dumps(callbacks_config(cell, settings), indent=1))  # JSON is YAML
    env = f"collab.compare.grid:SingleAgent_{cell.env}" if cell.kind == "control" else cell.env
    return [*settings.overrides, "--config", str(config), *extra, "--data.env", env, *run]


def command(cell: Cell, settings: Settings, out: Path, extra: list[str]) -> list[str]:
    """The subprocess of a cell."""
    if cell.kind == "baseline":
        folder = cell_dir(out, cell)
        args = [
            "--algo",
            "magrpo",
            "--baseline",
            cell.method,
            "--num_samples",
            str(settings.eval_samples),
            "--k",
            "1",
            "--tasks_per_batch",
            str(settings.tasks_per_batch),
            "--output",
            str(folder / "metrics.json"),
            *settings.overrides,
            "--data.env",
            cell.env,
            "--seed_everything",
            str(cell.seed),
            "--data.seed",
            str(cell.seed),
        ]
        if settings.eval_tasks:
            args[2:2] = ["--max_tasks", str(settings.eval_tasks)]
        return [sys.executable, "-m", "collab.evaluate", *args]
    return [sys.executable, "-m", "collab.fit", "--algo", algo_of(cell), *fit_args(cell, settings, out, extra)]
