"""Which config files a run reads: the packaged ``conf/`` (the repository's top-level ``conf/``, shipped inside
the package and read with ``importlib.resources``), composed as ``conf/algo/ALGO.yaml`` + ``conf/env/ENV.yaml``
+ ``conf/algo/ALGO/ENV.yaml`` (where the algorithm has its own choice for that env), then the user's
``--config`` files. Used by ``collab.fit`` (the command line) and :func:`collab.algos.from_config` (Python)."""

from __future__ import annotations

from pathlib import Path

from collab.errors import UserError


def packaged_conf() -> Path:
    """The ``conf/`` shipped inside the package (the repository's top-level ``conf/``, mapped as package
    data through ``src/collab/conf``), read with ``importlib.resources``: the same from any working
    directory, from an editable install and from a wheel. A ``./conf`` is never looked at: a config of
    one's own is named with ``--config``."""
    from importlib.resources import as_file, files

    root = files("collab") / "conf"
    if isinstance(root, Path):
        return root
    global _extracted  # a zipped install: extract once, for the life of the process
    if _extracted is None:
        import atexit
        from contextlib import ExitStack

        stack = ExitStack()
        atexit.register(stack.close)
        _extracted = stack.enter_context(as_file(root))
    return _extracted


_extracted: Path | None = None


def _arg_values(argv: list[str], option: str) -> list[tuple[int, str]]:
    """``(position, value)`` of every ``--option VALUE`` and ``--option=VALUE`` in ``argv``."""
    out = []
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            out.append((i, argv[i + 1]))
        elif arg.startswith(option + "="):
            out.append((i, arg.split("=", 1)[1]))
    return out


def _yaml_of(path: str | Path) -> dict:
    """A config file's mapping, or ``{}`` when it is missing or malformed (the parser reports those)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def run_env(algo_config: Path | None, argv: list[str]) -> str:
    """The env the run trains on: the last ``--data.env`` or ``data.env`` of a ``--config`` in ``argv``
    (later arguments win, as the parser has it), else the algorithm's config's (``None``: an algorithm given
    as a class path, which has no packaged config)."""
    env = (_yaml_of(algo_config).get("data") or {}).get("env") if algo_config else None
    given = sorted(_arg_values(argv, "--data.env") + [(i, "--config " + v) for i, v in _arg_values(argv, "--config")])
    for _, value in given:
        if value.startswith("--config "):
            data = _yaml_of(value.removeprefix("--config ")).get("data")
            if isinstance(data, dict) and isinstance(data.get("env"), str):
                env = data["env"]
        else:
            env = value
    return env


WHOLE = ("model.agents",)
"""Options whose later value replaces the earlier one whole, as in :func:`collab.algos.configured.algo_config`
(Python). jsonargparse merges a list of dataclasses item by item into the previous list when the two have the
same length (and replaces it when they do not): a ``--config`` team of two debaters without ``lr`` kept the two
rates of conf/algo/marft_a.yaml's agents (the debate grid's MARFT runs, found 2026-11-27), where a team of one
or three agents took the defaults."""


def parser_args(files: list[Path], argv: list[str]) -> list[str]:
    """The parser's arguments: ``--config F`` for each packaged file, then ``argv``, with ``--OPTION null``
    (each option of :data:`WHOLE`) before every source that sets it: a config file whose mapping holds it
    (packaged, ``--config F``, ``--model F``) or the option itself (``--model.agents [...]``). A list given
    later thus replaces the earlier list whole; the fields its items leave out take the dataclass defaults."""

    def resets(source: list[str]) -> list[str]:
        return [a for option in WHOLE if _source_sets(source, option) for a in (f"--{option}", "null")]

    args: list[str] = []
    for f in files:
        args += resets(["--config", str(f)]) + ["--config", str(f)]
    i = 0
    while i < len(argv):
        arg = argv[i]
        source = [arg, argv[i + 1]] if arg in ("--config", "--model") and i + 1 < len(argv) else [arg]
        args += resets(source) + source
        i += len(source)
    return args


def _source_sets(source: list[str], option: str) -> bool:
    """Whether the argument(s) ``source`` set ``option`` (``section.key``) whole: the option itself, a
    ``--config`` file whose ``section`` holds ``key``, or a ``--section`` file holding ``key``."""
    name, _, inline = source[0].partition("=")
    value = source[1] if len(source) > 1 else inline
    section, key = option.split(".")
    if name == f"--{option}":
        return True
    if name == "--config" and value:
        values = _yaml_of(value).get(section)
    elif name == f"--{section}" and value:  # --model FILE: the section's own config file
        values = _yaml_of(value)
    else:
        return False
    return isinstance(values, dict) and key in values


def is_class_path(name: str) -> bool:
    """Whether an ``--algo`` or ``--data.env`` value is a class path ``module:Class`` (a researcher's own
    algorithm or env, imported from the working directory: ``docs/extending.md``) rather than a built-in name."""
    return ":" in name


def config_files(algo: str, argv: list[str]) -> list[Path]:
    """The packaged configs of a run, in order: ``conf/algo/ALGO.yaml`` (the algorithm), ``conf/env/ENV.yaml``
    (the env's data options) and ``conf/algo/ALGO/ENV.yaml`` (the algorithm's own choice for that env, if it
    has one: marft_a trains math on small_addition with the duo profile). ``argv`` comes after them.

    An algorithm given as a class path (``--algo reinforce:Reinforce``) has no packaged config: its options
    come from the user's ``--config``; an env given as a class path likewise (``conf/env/`` holds only the
    built-in envs)."""
    conf = packaged_conf()
    files, algo_config = [], None
    if not is_class_path(algo):
        algo_config = conf / "algo" / f"{algo}.yaml"
        if not algo_config.is_file():
            raise UserError(f"the packaged config of --algo {algo} is missing ({algo_config}); reinstall collab")
        files.append(algo_config)
    env = run_env(algo_config, argv)
    if isinstance(env, str) and not is_class_path(env) and (conf / "env" / f"{env}.yaml").is_file():
        files.append(conf / "env" / f"{env}.yaml")
        if algo_config and (conf / "algo" / algo / f"{env}.yaml").is_file():
            files.append(conf / "algo" / algo / f"{env}.yaml")
    return files


def describe_configs(files: list[Path], argv: list[str], algo: str | None = None) -> str:
    """The one line that says which config files a run reads (packaged ones relative to ``conf/``; an
    algorithm given as a class path first, by its path)."""
    conf = packaged_conf()
    names = [f"{conf}/{f.relative_to(conf)}" if f == files[0] else str(f.relative_to(conf)) for f in files]
    if algo and is_class_path(algo):
        names = [f"--algo {algo} (no packaged config)"] + names
    own = [v for _, v in _arg_values(argv, "--config")]
    return "config: " + " + ".join(names + [f"--config {c}" for c in own])
