"""``python -m collab.fit --algo NAME [--config FILE] [--section.key value ...]``.

Reads the packaged configs (``conf/base.yaml``, the run's ``conf/env/ENV.yaml``, ``conf/algo/NAME.yaml`` and the
env file's choices for the algorithm, composed by :mod:`collab.config`), then ``--config`` files and the dotted
overrides, later ones winning; the command line is read once (:func:`collab.config.read_command_line`).
``--print_config`` prints the merged config, ``--explain`` each value with its source; ``--ckpt_path`` resumes a run
bitwise (:mod:`collab.training.resume`); SIGTERM stops within 30 s (:mod:`collab.preemption`). What a run writes,
its progress lines and its bad input (one line, exit code 2): docs/usage.md.
"""

from __future__ import annotations

import sys
from argparse import ArgumentError

from collab.config import (
    CommandLine,
    compose,
    describe,
    is_class_path,
    packaged_layers,
    parser_args,
    read_command_line,
)
from collab.errors import UserError, class_from_path, unknown


def build_cli(algo: str, argv: list[str], line: CommandLine | None = None):
    """The LightningCLI of a run of ``--algo algo`` (a built-in name or a class path ``module:Class``) with the
    remaining arguments ``argv``, its module, datamodule and trainer built (``run=False``): what
    :func:`fit` trains, and what a notebook or :mod:`collab.evaluate` builds a team from. ``line``: the command
    line already read (:func:`collab.config.read_command_line`), else read from ``algo`` and ``argv``."""
    from lightning.pytorch import Trainer

    from collab.algos import algo_registry
    from collab.cli.options import RUNS, given_options, option_names
    from collab.cli.output import hold_logs
    from collab.cli.parser_errors import parser_error
    from collab.cli.trainer import CollabCLI
    from collab.rollout.datamodule import RolloutDataModule

    hold_logs()  # under report_errors; after Lightning's import, which gives its loggers their handlers
    registry = algo_registry()
    module_class = algo_class(algo, registry)
    line = line or read_command_line(["--algo", algo, *argv])
    args = composed_args(algo, line)
    given = given_options(
        line,
        ("trainer.default_root_dir", "trainer.logger.init_args.save_dir"),
        placeholders={"trainer.logger.init_args.save_dir": str(RUNS)},
    )
    try:
        return CollabCLI(
            module_class,
            RolloutDataModule,
            subclass_mode_model=False,
            run=False,
            args=args,
            save_config_kwargs={"overwrite": True},
            trainer_defaults={"default_root_dir": RUNS, "enable_model_summary": False},
            parser_kwargs={
                "exit_on_error": False,
                "prog": "python -m collab.fit",
                "usage": USAGE,
                "description": usage(algo, registry),
            },
            root_given=given["trainer.default_root_dir"],
            save_dir_given=given["trainer.logger.init_args.save_dir"],
        )
    except ArgumentError as e:  # jsonargparse's multi-line report, as one line that keeps the reason
        options = option_names(("model", module_class), ("data", RolloutDataModule), ("trainer", Trainer))
        raise UserError(parser_error(str(e), args, options)) from None
    except SystemExit:  # a help printed (or the config): the files read are said for a run, not with a help
        if any(wants_help(arg) for arg in line.args):
            from collab.cli.output import release_logs

            release_logs(show=False)
        raise


def algo_class(algo: str, registry: dict[str, type]) -> type:
    """The class of ``--algo algo``: a built-in name, or a class path ``module:Class`` to a researcher's own
    algorithm (docs/extending.md), its options from ``--config``."""
    from collab.algos.base import CollabModule

    if is_class_path(algo):
        return class_from_path(algo, CollabModule, "--algo", registry)
    if algo not in registry:
        raise unknown("algo", algo, registry)
    return registry[algo]


def composed_args(algo: str, line: CommandLine) -> list[str]:
    """The parser's arguments: the packaged configs of ``algo`` on the run's env composed, then the command line;
    the env pair, old option names and the strategy checked first, and the files read said once."""
    from collab.algos.options import check_env_pair
    from collab.cli.output import note
    from collab.training.fsdp import alias

    env = line.env()
    if not is_class_path(algo):
        check_env_pair(algo, env)
    layers = packaged_layers(algo, env)
    line.args = alias(line.args)  # --trainer.strategy fsdp: FSDP2 through Lightning (collab.training.fsdp)
    check_strategy((line.values("--trainer.strategy") or [""])[-1])  # before Lightning's "fsdp requires a GPU"
    note(describe(layers, line))
    return parser_args(compose(layers)[0], line)  # a later model.agents replaces the earlier list whole


def wants_help(arg: str) -> bool:
    """Whether ``arg`` asks jsonargparse for a help: ``-h``, ``--help`` or a subclass's ``--trainer.callbacks.help``."""
    return arg in ("-h", "--help") or arg.split("=", 1)[0].endswith(".help")


USAGE = "python -m collab.fit [--algo NAME] [--explain | --print_config] [--config FILE ...] [--section.key value ...]"


def usage(algo: str, algos) -> str:
    """What ``--help`` says below :data:`USAGE`: the options collab reads before the parser, the order in which the
    configs are read."""
    from collab.config import DEFAULT_ALGO

    return (
        f"Train a team of agents. --algo NAME: the algorithm ({', '.join(sorted(algos))}, or module:Class "
        f"for one's own), default {DEFAULT_ALGO}; the --model options below are --algo {algo}'s. --explain: print "
        "every value of the merged config with the file or option that set it, and exit. The packaged configs "
        "(conf/base.yaml, the env's, the algorithm's) are read first, then the --config files and options in the "
        "order given, later ones winning."
    )


def report_errors(job) -> int:
    """Run ``job()``; a user error (ours or jsonargparse's) becomes one ``error:`` line and exit code 2.

    Lightning's start-up messages are held (from :func:`build_cli` on) until the run starts, and left out
    when stdout is not a terminal (:func:`collab.cli.output.command_output`): a bad input found before
    then prints its line alone."""
    from collab.cli.output import command_output, release_logs
    from collab.cli.parser_errors import parser_error

    with command_output():  # on exit: the held messages shown (a bug) or dropped, the libraries' settings back
        try:
            job()
        except UserError as e:
            release_logs(show=False)
            print(f"error: {_single_line(e)}", file=sys.stderr)
            return 2
        except Exception as e:  # jsonargparse reports bad arguments as ArgumentError
            if type(e).__name__ == "ArgumentError" or type(e).__module__.startswith("jsonargparse"):
                release_logs(show=False)
                print(f"error: {parser_error(str(e)) if str(e).strip() else type(e).__name__}", file=sys.stderr)
                return 2
            cause = e.__cause__ or e.__context__
            while cause is not None:
                if isinstance(cause, UserError):
                    release_logs(show=False)
                    print(f"error: {_single_line(cause)}", file=sys.stderr)
                    return 2
                cause = cause.__cause__ or cause.__context__
            release_logs()  # a bug: what Lightning said before it helps
            raise
    return 0


def _single_line(e: BaseException) -> str:
    return " ".join(str(e).split("\n")).strip()


def check_strategy(strategy) -> None:
    """Refuse Lightning's own sharding strategies (its FSDP, ModelParallel, DeepSpeed) as named: one line, exit 2,
    pointing to collab's (``--trainer.strategy fsdp``: :mod:`collab.training.fsdp`, Lightning's ModelParallel with
    collab's models sharded and their forwards in lockstep). ``strategy`` is a Strategy or what
    ``--trainer.strategy`` says."""
    from collab.training.fsdp import NAME, FSDP2Strategy

    if isinstance(strategy, FSDP2Strategy) or strategy == NAME:
        return
    name = strategy if isinstance(strategy, str) else type(strategy).__name__
    low = name.lower()
    if not any(k in low for k in ("deepspeed", "fsdp", "modelparallel", "model_parallel")):
        return
    raise UserError(
        f"--trainer.strategy {name} is not supported: Lightning's gathers each layer of the base inside the "
        "layer's forward, which needs every process to run the same forwards, and collab's processes decode "
        "and score their own data; use --trainer.strategy fsdp (collab's: FSDP2 with every process's forwards "
        "in lockstep, docs/distributed.md) or ddp (a whole base per process; --model.base.quantization 4bit "
        "keeps it small)"
    )


def print_config(algo: str, argv: list[str], line: CommandLine | None = None) -> None:
    """``--print_config``: jsonargparse's YAML with a comment on each batch size saying whether it is global or
    per process (:mod:`collab.training.batch_scope`)."""
    import io
    from contextlib import redirect_stdout

    from collab.training.batch_scope import annotate

    printed = io.StringIO()
    code = 0
    try:
        with redirect_stdout(printed):
            build_cli(algo, argv, line)
    except SystemExit as e:  # jsonargparse exits after printing
        code = e.code
    finally:
        sys.stdout.write(annotate(printed.getvalue()))
        sys.stdout.flush()
    raise SystemExit(code)


def explain(line: CommandLine) -> None:
    """``--explain``: every value of the run's merged config, one line each, with the source that set it (a
    packaged file, a ``--config`` file, an option) or ``default`` (the class's own default). Each agent's values
    are the ones it trains with (:func:`agent_values`): a field its entry leaves out shows the value and the
    source of ``model.agent_defaults`` (or ``model.agent_lr``)."""
    import yaml

    from collab.config import leaves, origins

    cli = build_cli(line.algo, line.args, line)
    config = cli.config.as_dict()
    config.pop("config", None)
    origin = origins(packaged_layers(line.algo, line.env()), line)
    agents = agent_values(config.get("model") or {}, getattr(cli.model, "agent_specs", None), origin)
    for key in leaves(config, "")[:]:
        key = key.removeprefix(".")
        if key in agents:
            value, source = agents[key]
        else:
            value = _at(config, key)
            source = _source(origin, key)
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
        print(f"{key}: {text}  # {source}")
    sys.stdout.flush()


def agent_values(model: dict, specs, origin: dict[str, str]) -> dict[str, tuple]:
    """``model.agents[i].KEY`` -> (the value agent i trains with, its source), for every leaf of the entries:
    the entry's own value where it sets one; else ``model.agent_defaults``' (its source named with the block), and
    for ``lr`` ``model.agent_lr``'s. ``specs``: the module's agents, already filled (None: no list)."""
    from dataclasses import asdict

    from collab.config import leaves

    out: dict[str, tuple] = {}
    entries = model.get("agents") or []
    for i, (entry, spec) in enumerate(zip(entries, specs or [])):
        filled = asdict(spec)
        for key in leaves(filled, f"model.agents[{i}]"):
            field = key.split("]", 1)[1].removeprefix(".")
            if _at(entry, field) is not None:
                out[key] = (_at(filled, field), _source(origin, key))
            elif field == "lr":
                out[key] = (model.get("agent_lr"), f"{_source(origin, 'model.agent_lr')} (model.agent_lr)")
            elif field.split(".")[0] in ("finetune", "lora", "sampling"):
                block = f"model.agent_defaults.{field}"
                out[key] = (_at(filled, field), f"{_source(origin, block)} (model.agent_defaults)")
    return out


def _at(values, key: str):
    """The value at the dotted ``key`` (``a.b[0].c``) of ``values``; None where a part is missing."""
    for part in key.replace("[", ".[").split("."):
        if isinstance(values, list) and part.startswith("["):
            values = values[int(part[1:-1])]
        elif isinstance(values, dict):
            values = values.get(part)
        else:
            return None
    return values


def _source(origin: dict[str, str], key: str) -> str:
    """The source that set ``key`` or the nearest key above it; ``default`` (the class's own) where none did."""
    return next((origin[k] for k in _ancestors(key) if k in origin), "default")


def _ancestors(key: str) -> list[str]:
    """``key`` and the keys above it, nearest first (``a.b[0].c``, ``a.b[0]``, ``a.b``, ``a``)."""
    out = [key]
    while True:
        cut = max(key.rfind("."), key.rfind("["))
        if cut <= 0:
            return out
        key = key[:cut]
        out.append(key)


def fit(argv: list[str]) -> None:
    line = read_command_line(argv)
    algo, rest = line.algo, line.args
    if line.explain:
        explain(line)
        return
    if line.print_config:
        print_config(algo, rest, line)
    cli = build_cli(algo, rest, line)
    check_strategy(cli.trainer.strategy)
    from collab.training import fsdp

    world = cli.trainer.num_devices * cli.trainer.num_nodes  # before the processes exist (fsdp: layers per process)
    fsdp.check(cli.trainer.strategy, cli.model, world, getattr(cli.datamodule, "env", None))
    from collab.cli.output import note, restore_on_exit
    from collab.cli.resources import prepare_processes
    from collab.runtime.threads import choose_threads

    threads, restore = choose_threads(cli.trainer.num_devices)  # before Lightning starts the other processes
    restore_on_exit(restore)
    note(threads)
    env = getattr(cli.datamodule, "env", None)
    tasks = getattr(cli.datamodule, "batch_size", None)  # the team fits? processes, memory, timeout
    prepare_processes(cli.trainer, cli.model, cli.config.get("distributed_timeout"), env, tasks)
    ckpt = cli.config.get("ckpt_path")
    if ckpt:  # the file now, its tensors against the team when Lightning restores it (collab.cli.checkpoint)
        from collab.cli.checkpoint import guard_resume

        guard_resume(cli.model, ckpt)
    from collab import preemption
    from collab.preemption import SIGTERM_EXIT_CODE

    try:
        cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=ckpt)
    except BaseException as e:  # SIGTERM: after the step (saved) or inside it (collab.preemption)
        if not preemption.stopped_by(e):
            raise
        preemption.stop(cli.trainer, e)  # the one line on rank 0; the other ranks ended
        raise SystemExit(SIGTERM_EXIT_CODE) from None


def main(argv: list[str] | None = None) -> int:
    from collab.runtime.threads import choose_wait

    choose_wait()  # before torch's import (collab.runtime.threads)
    try:
        return report_errors(lambda: fit(list(sys.argv[1:] if argv is None else argv)))
    except SystemExit as e:
        if e.code == 143:  # stopped by SIGTERM (collab.preemption)
            from collab import preemption

            if argv is None:  # the command itself: skip seconds of interpreter teardown
                preemption.exit_now()
            preemption.disarm()  # called in a process that goes on: no watchdog, no stop pending
        raise


if __name__ == "__main__":
    sys.exit(main())
