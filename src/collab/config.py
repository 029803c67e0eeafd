"""The packaged configs and how a run composes them: one path for ``python -m collab.fit`` and for Python.

A run of ``--algo ALGO`` on env ``ENV`` reads, in order, later values winning::

    conf/base.yaml               what every algorithm shares: trainer, logger, callbacks, base model, agent defaults
    conf/env/ENV.yaml            the env's data options (and, for math, the team its duo profile is tuned with)
    conf/algo/ALGO.yaml          what is the algorithm's own: its options, its run length, its team if it has one
    conf/env/ENV.yaml, algos:    the algorithm's own choices for that env (the ``algos: ALGO:`` section)
    --config FILE ...            the user's files, then ``--section.key value`` options (the command line's order)

The packaged layers are merged here (:func:`compose`): mappings merge key by key, a list replaces the earlier
list whole, and ``trainer.callbacks`` merge by ``class_path`` (a layer names a callback to change its
``init_args``). The result goes to the parser as one config, followed by the command line, which jsonargparse
merges as it always does. The env file comes before the algorithm's so that an algorithm's own choice (MARFT-A's
team) wins over the env's default (the math team), and the env's ``algos:`` section after it so that a choice
made for one pair wins over both. ``trainer.logger``'s ``name`` is the algorithm's (``runs/ALGO/version_N``) and
``data.env`` the run's env. A ``./conf`` in the working directory is never read.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collab.errors import UserError

DEFAULT_ALGO = "magrpo"


def packaged_conf() -> Path:
    """The ``conf/`` shipped inside the package (the repository's top-level ``conf/``, mapped as package data
    through ``src/collab/conf``), read with ``importlib.resources``: the same from any working directory, from an
    editable install and from a wheel."""
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


def is_class_path(name: str) -> bool:
    """Whether an ``--algo`` or ``--data.env`` value is a class path ``module:Class`` (a researcher's own
    algorithm or env, imported from the working directory: ``docs/extending.md``) rather than a built-in name."""
    return ":" in name


def load_yaml(path: str | Path, option: str = "--config") -> dict:
    """A config file's mapping; a file that is missing, not UTF-8, not YAML or not a mapping is one UserError
    naming ``option`` and the file."""
    import yaml

    try:
        text = Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{option} {path}: the file does not exist: '{Path(path).absolute()}'") from None
    except IsADirectoryError:
        raise UserError(f"{option} {path}: a folder, not a YAML file") from None
    except OSError as e:
        raise UserError(f"{option} {path}: cannot be read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{option} {path}: not UTF-8 text (byte {e.start}); a config is a YAML file in UTF-8") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or " ".join(str(e).split())
        raise UserError(f"{option} {path}: not valid YAML: {problem}{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(
            f"{option} {path}: holds a {type(data).__name__}, not a mapping of sections (trainer:, model:, data:)"
        )
    return data


# -- the command line, read once -------------------------------------------------------------------------
@dataclass
class CommandLine:
    """What ``python -m collab.fit`` was given, read once from ``argv``: the algorithm, the rest of the arguments
    in order (for the parser), the ``--config`` files and ``--data.env`` values in order, and the flags that
    only ``collab.fit`` reads (``--print_config``, ``--explain``)."""

    algo: str
    args: list[str]
    configs: list[str] = field(default_factory=list)
    print_config: bool = False
    explain: bool = False
    _documents: dict[str, dict] = field(default_factory=dict, repr=False)

    def document(self, path: str) -> dict:
        """The mapping of the ``--config`` file ``path``, read once for the whole run (the env, the old-name and
        the given-option checks, the team's reset and ``--explain`` all look at it)."""
        if path not in self._documents:
            self._documents[path] = load_yaml(path)
        return self._documents[path]

    def values(self, option: str) -> list[str]:
        """Every value given to ``--option`` (``--option V`` or ``--option=V``), in order."""
        return [value for name, value in self.pairs() if name == option]

    def given(self, option: str) -> bool:
        """Whether ``--option`` is on the command line."""
        return any(name == option for name, _ in self.pairs())

    def pairs(self) -> Iterable[tuple[str, str | None]]:
        """``(--name, value)`` of each option of :attr:`args` (value None for a flag at the end)."""
        i = 0
        while i < len(self.args):
            arg = self.args[i]
            if arg.startswith("--") and "=" in arg:
                name, value = arg.split("=", 1)
                yield name, value
                i += 1
            elif arg.startswith("--"):
                value = self.args[i + 1] if i + 1 < len(self.args) else None
                yield arg, value
                i += 2 if value is not None and not value.startswith("--") else 1
            else:
                i += 1

    def env(self) -> str | None:
        """The env the run trains on: the last ``--data.env`` or ``data.env`` of a ``--config`` (later arguments
        win, as the parser has it), else the algorithm's file's (None: an algorithm given as a class path and no
        env given)."""
        env = None
        if not is_class_path(self.algo):
            env = (algo_file(self.algo).get("data") or {}).get("env")
        for name, value in self.pairs():
            if name == "--data.env" and value is not None:
                env = value
            elif name == "--config" and value is not None:
                data = self.document(value).get("data")
                if isinstance(data, dict) and isinstance(data.get("env"), str):
                    env = data["env"]
        return env


def read_command_line(argv: list[str]) -> CommandLine:
    """``argv`` read once: ``--algo NAME`` (default :data:`DEFAULT_ALGO`) taken out, ``--print_config`` and
    ``--explain`` noted (``--print_config`` stays for the parser, which prints), the ``--config`` files listed."""
    algo, rest = None, []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--algo":
            if i + 1 >= len(argv):
                raise UserError("--algo needs a name")
            algo, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--algo="):
            algo = arg.split("=", 1)[1]
        elif arg != "--explain":
            rest.append(arg)
        i += 1
    line = CommandLine(
        algo or DEFAULT_ALGO,
        rest,
        explain="--explain" in argv,
        print_config=any(a == "--print_config" or a.startswith("--print_config=") for a in rest),
    )
    line.configs = line.values("--config")
    return line


# -- composition -----------------------------------------------------------------------------------------
def algo_file(algo: str) -> dict:
    """``conf/algo/ALGO.yaml``'s mapping."""
    path = packaged_conf() / "algo" / f"{algo}.yaml"
    if not path.is_file():
        raise UserError(f"the packaged config of --algo {algo} is missing ({path}); reinstall collab")
    return load_yaml(path, "the packaged config")


@dataclass
class Layer:
    """One source of a run's config: its name (a path relative to ``conf/``, or what set it) and its values."""

    name: str
    values: dict


def packaged_layers(algo: str, env: str | None) -> list[Layer]:
    """The packaged layers of a run, in order (the module docstring). An algorithm given as a class path has
    no file of its own, an env given as a class path none either: their options come from ``--config``."""
    conf = packaged_conf()
    layers = [Layer("base.yaml", load_yaml(conf / "base.yaml", "the packaged config"))]
    name = algo.split(":")[0].rsplit(".", 1)[-1] if is_class_path(algo) else algo
    layers.append(Layer("the run's name", {"trainer": {"logger": {"init_args": {"name": name}}}}))
    env_file = conf / "env" / f"{env}.yaml" if isinstance(env, str) and not is_class_path(env) else None
    env_values = load_yaml(env_file, "the packaged config") if env_file and env_file.is_file() else {}
    own = env_values.pop("algos", None) or {}
    if env_values:
        layers.append(Layer(f"env/{env}.yaml", env_values))
    if not is_class_path(algo):
        layers.append(Layer(f"algo/{algo}.yaml", algo_file(algo)))
    if own.get(algo):
        layers.append(Layer(f"env/{env}.yaml algos.{algo}", own[algo]))
    if isinstance(env, str):
        layers.append(Layer("the run's env", {"data": {"env": env}}))
    return layers


def merge(into: dict, values: dict, source: str, origin: dict[str, str], prefix: str = "") -> dict:
    """Merge ``values`` into ``into`` (in place) as the packaged layers merge: mappings key by key, lists whole,
    ``trainer.callbacks`` by ``class_path``; ``origin`` maps each dotted key set to ``source``."""
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value, source, origin, path + ".")
        elif path == "trainer.callbacks" and isinstance(value, list) and isinstance(into.get(key), list):
            merge_callbacks(into[key], value, source, origin, path)
        else:
            for old in [k for k in origin if k == path or k.startswith(path + ".") or k.startswith(path + "[")]:
                del origin[old]
            into[key] = copy.deepcopy(value)
            for leaf in leaves(value, path):
                origin[leaf] = source
    return into


def merge_callbacks(into: list, values: list, source: str, origin: dict[str, str], path: str) -> None:
    """A layer's callbacks: one whose ``class_path`` is already there updates that callback's ``init_args``; a new
    one is appended."""
    for callback in values:
        names = [c.get("class_path") if isinstance(c, dict) else None for c in into]
        class_path = callback.get("class_path") if isinstance(callback, dict) else None
        if class_path is not None and class_path in names:
            index = names.index(class_path)
            merge(into[index], callback, source, origin, f"{path}[{index}].")
        else:
            into.append(copy.deepcopy(callback))
            for leaf in leaves(callback, f"{path}[{len(into) - 1}]"):
                origin[leaf] = source


def leaves(value: Any, path: str) -> list[str]:
    """The dotted keys of ``value``'s leaves under ``path`` (list items as ``path[i]``)."""
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in leaves(v, f"{path}.{k}")]
    if isinstance(value, list) and value and all(isinstance(v, (dict, list)) for v in value):
        return [leaf for i, v in enumerate(value) for leaf in leaves(v, f"{path}[{i}]")]
    return [path]


def compose(layers: list[Layer]) -> tuple[dict, dict[str, str]]:
    """The merged values of ``layers`` and which layer set each leaf (dotted key -> layer name)."""
    merged: dict = {}
    origin: dict[str, str] = {}
    for layer in layers:
        merge(merged, layer.values, layer.name, origin)
    return merged, origin


def packaged_config(algo: str, env: str | None = None) -> dict:
    """The merged packaged config of ``--algo algo`` on ``env`` (its own default env when None)."""
    if env is None and not is_class_path(algo):
        env = (algo_file(algo).get("data") or {}).get("env")
    return compose(packaged_layers(algo, env))[0]


def describe(layers: list[Layer], line: CommandLine) -> str:
    """The one line that says which config files a run reads (``conf/`` named once, the rest relative to it)."""
    files = [layer.name for layer in layers if layer.name.endswith(".yaml") or " algos." in layer.name]
    names = [f"{packaged_conf()}/{files[0]}"] + files[1:]
    if is_class_path(line.algo):
        names = [f"--algo {line.algo} (no packaged config)"] + names
    return "config: " + " + ".join(names + [f"--config {c}" for c in line.configs])


WHOLE = ("model.agents",)
"""Options whose later value replaces the earlier one whole, as the packaged layers merge lists and as
``from_config(agents=...)`` does. jsonargparse merges a list of dataclasses item by item into a previous list of
the same length (and replaces one of another length): without the reset a ``--config`` team of two agents without
``lr`` would keep the rates of the packaged team's agents."""


def parser_args(config: dict, line: CommandLine) -> list[str]:
    """The parser's arguments: the composed packaged ``config`` as one ``--config``, then the command line, with
    ``--OPTION null`` (each option of :data:`WHOLE`) before every source that sets it: a ``--config`` file whose
    mapping holds it, a ``--section`` file holding it, or the option itself. A list given later thus replaces
    the earlier list whole; the fields its items leave out take ``model.agent_defaults`` (which merges key by
    key, as any mapping: :mod:`collab.policy.specs`)."""
    import yaml

    def resets(source: list[str]) -> list[str]:
        return [a for option in WHOLE if _source_sets(source, option, line) for a in (f"--{option}", "null")]

    args = ["--config", yaml.safe_dump(config, sort_keys=False)]
    argv, i = line.args, 0
    while i < len(argv):
        arg = argv[i]
        source = [arg, argv[i + 1]] if arg in ("--config", "--model") and i + 1 < len(argv) else [arg]
        args += resets(source) + source
        i += len(source)
    return args


def _source_sets(source: list[str], option: str, line: CommandLine) -> bool:
    """Whether the argument(s) ``source`` set ``option`` (``section.key``) whole: the option itself, a
    ``--config`` file whose ``section`` holds ``key``, or a ``--section`` file holding ``key``."""
    name, _, inline = source[0].partition("=")
    value = source[1] if len(source) > 1 else inline
    section, key = option.split(".")
    if name == f"--{option}":
        return True
    if name == "--config" and value:
        values = line.document(value).get(section)
    elif name == f"--{section}" and value and Path(value).is_file():  # --model FILE: the section's own file
        values = load_yaml(value, f"--{section}")
    else:
        return False
    return isinstance(values, dict) and key in values


def origins(layers: list[Layer], line: CommandLine) -> dict[str, str]:
    """Which source set each dotted key, the packaged layers' and then the command line's (``--config`` files
    and dotted options), merged as :func:`merge` does: what ``--explain`` prints beside each value."""
    merged, origin = compose(layers)
    for name, value in line.pairs():
        if name == "--config" and value is not None:
            merge(merged, line.document(value), f"--config {value}", origin)
        elif name.count(".") >= 1 and value is not None:
            key = name.removeprefix("--")
            for old in [k for k in origin if k == key or k.startswith(key + ".") or k.startswith(key + "[")]:
                del origin[old]
            origin[key] = f"--{key}"
    return origin


def nullable_options_not_required(parser) -> None:
    """Every option whose type admits ``None`` made optional in ``parser`` (a jsonargparse parser), so that ``null``
    is a value it accepts. jsonargparse (4.53) already treats ``X | None`` so, but requires an option typed with
    several types and ``None`` (``micro_batch_tokens: int | Literal["auto"] | None``) and then reads an explicit
    ``null`` as missing: "the following arguments are required". Every value still comes from ``conf/``."""
    import typing

    for action in parser._actions:
        hint = getattr(action, "_typehint", None)
        if action.required and hint is not None and type(None) in typing.get_args(hint):
            action.required = False
