"""A grid of ``python -m collab.compare`` checked before any run starts: its names and numbers, each run built
(not run) as its subprocess will build it, the ``--score`` key on every env, and the shared settings that
``<output>/grid.json`` keeps from the first start. What is wrong is one UserError: one ``error:`` line, exit
code 2."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from collab.compare.grid import BASELINES, CONTROL, OWNED, OWNED_DEFAULTS, Cell, Settings, algo_of, fit_args, one_agent
from collab.errors import UserError, require, unknown


def check_names(algos: list[str], controls: list[str], envs: list[str], seeds: list[int], settings: Settings) -> None:
    """The grid's names and numbers, before anything is built: one UserError naming what is wrong."""
    from collab.algos.options import check_env_pair
    from collab.envs import env_names

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
    both = settings.rollouts is not None and settings.tokens is not None
    require(
        (settings.rollouts is None) != (settings.tokens is None),
        "give the budget: --rollouts N or --tokens N"
        + (f", not both (got --rollouts {settings.rollouts} and --tokens {settings.tokens})" if both else ""),
    )
    require(
        settings.rollouts is None or settings.rollouts >= 1,
        f"--rollouts must be >= 1 (rollouts per training run), got {settings.rollouts}",
    )
    require(
        settings.tokens is None or settings.tokens >= 1,
        f"--tokens must be >= 1 (generated tokens per training run), got {settings.tokens}",
    )
    require(settings.eval_samples >= 1, f"--eval_samples must be >= 1, got {settings.eval_samples}")
    require(
        settings.eval_tasks is None or settings.eval_tasks >= 1, f"--eval_tasks must be >= 1, got {settings.eval_tasks}"
    )
    require(settings.tasks_per_batch >= 1, f"--tasks_per_batch must be >= 1, got {settings.tasks_per_batch}")
    check_overrides(settings)


def check_defaults(algos: list[str], seeds: list[int], settings: Settings) -> None:
    """``--defaults``: the names and numbers of its grid (each algorithm's main job on seeds), before anything is
    built or planned."""
    require(bool(algos), "--defaults runs the main jobs of --algos: give at least one")
    check_algos(algos)
    check_seeds(seeds)
    check_overrides(settings)


def check_algos(algos: list[str]) -> None:
    """Each name an algorithm of the registry."""
    from collab.algos import algo_registry

    registry = algo_registry()
    for algo in algos:
        if algo not in registry:
            raise unknown("algo", algo, registry)


def check_seeds(seeds: list[int]) -> None:
    require(
        bool(seeds) and len(set(seeds)) == len(seeds) and min(seeds) >= 0,
        f"--seeds must be distinct non-negative integers, got {seeds}",
    )


def check_overrides(settings: Settings) -> None:
    for arg in settings.overrides:
        option = arg.split("=", 1)[0]
        if settings.defaults and option in OWNED_DEFAULTS:
            raise UserError(
                f"{option} is set by collab.compare --defaults for each run (or is the main job's own); "
                "use --algos, --seeds, --output instead"
            )
        if not settings.defaults and option in OWNED:
            raise UserError(
                f"{option} is set by collab.compare for each run; use --algos, --envs, --seeds, --rollouts "
                "or --tokens, --eval_samples, --eval_tasks, --output instead"
            )


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
            cli = built.get(cell.env) or build_cli(
                "magrpo", fit_args(Cell("magrpo", cell.env, cell.seed), settings, out, [])
            )
            built[cell.env] = cli
            try:
                prepare(cell.method, cli.datamodule.env)
            except UserError as e:
                raise UserError(f"{cell.method} cannot run on env {cell.env!r}: {e}") from None
            extra[key] = []
            continue
        if cell.kind == "control":
            cli = built.get(cell.env) or build_cli(
                "magrpo", fit_args(Cell("magrpo", cell.env, cell.seed), settings, out, [])
            )
            built[cell.env] = cli
            specs = cli.model.agent_specs  # filled from model.agent_defaults: the lengths the agents decode
            extra[key] = one_agent(None if specs is None else [dataclasses.asdict(s) for s in specs])
        cli = build_cli(algo_of(cell), fit_args(cell, settings, out, extra.get(key, [])))
        if cell.method == "magrpo" or cell.env not in built:
            built[cell.env] = cli
        extra.setdefault(key, [])
    if settings.score:
        for env_name, cli in built.items():
            keys = score_keys(cli.datamodule.env)
            if settings.score not in keys:
                raise UserError(
                    f"--score {settings.score!r} is not reported by env {env_name!r}; it reports: "
                    f"{', '.join(sorted(keys))}"
                )
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


def check_settings(out: Path, settings: Settings) -> None:
    """The grid's shared settings in ``<out>/grid.json``: written the first time, then they must not change
    (the records would mix budgets or evaluations); the cells may."""
    path = out / "grid.json"
    if settings.defaults:
        mine = {"budget": settings.budget(), "overrides": list(settings.overrides), "defaults": True}
    else:
        mine = {
            "budget": settings.budget(),
            "eval_samples": settings.eval_samples,
            "eval_tasks": settings.eval_tasks,
            "tasks_per_batch": settings.tasks_per_batch,
            "overrides": list(settings.overrides),
            "score": settings.score,
        }
    if path.is_file():
        try:
            theirs = json.loads(path.read_bytes().decode("utf-8"))
        except ValueError as e:  # not UTF-8, not JSON
            raise UserError(
                f"--output {out}: {path} is not a grid's settings ({e}); give another --output or remove {out}"
            ) from None
        changed = [k for k in mine if theirs.get(k) != mine[k]]
        option = {"budget": "--rollouts/--tokens", "overrides": "overrides", "defaults": "--defaults"}
        if changed:
            was = ", ".join(f"{option.get(k, f'--{k}')} {theirs.get(k)!r}" for k in changed)
            raise UserError(
                f"{out} holds a grid with other settings ({was}, now "
                f"{', '.join(repr(mine[k]) for k in changed)}); give another --output or remove {out}"
            )
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(mine, indent=1))
