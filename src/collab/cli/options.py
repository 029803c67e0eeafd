"""Options checked before a run starts: where a run's files go, which options were given, the valid names.

- :func:`collab.errors.class_from_path`: ``--algo module:Class`` and ``--data.env module:Class`` (an algorithm or env of
  one's own, docs/extending.md) imported and checked, or refused in one line;
- :func:`place_runs`: ``--trainer.default_root_dir DIR`` takes effect: the packaged configs' logger writes
  under the root (its ``save_dir`` follows the root unless given), so logs, checkpoints and adapters
  all land there;
- :func:`given_options`: whether an option is given on the command line or in a ``--config`` file;
- :func:`option_names`: the valid option names per group (for the parser's near misses).

The algorithms' own vocabulary (old option names, the envs each trains on) is :mod:`collab.algos.options`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from collab.config import CommandLine

RUNS = "runs"
"""Where runs go when neither ``trainer.default_root_dir`` nor the logger's ``save_dir`` is given."""


def place_runs(trainer: dict, root_given: bool, save_dir_given: bool) -> None:
    """``trainer.default_root_dir`` is where a run's logs, checkpoints and adapters go: the logger's
    ``save_dir`` follows it unless the logger's own was given (on the command line or in ``--config``);
    with neither, both are ``runs``."""
    root = trainer.get("default_root_dir") or RUNS
    trainer["default_root_dir"] = root
    loggers = trainer.get("logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        args = getattr(logger, "init_args", None) if not isinstance(logger, dict) else logger.get("init_args")
        if args is None or save_dir_given:
            continue
        if root_given or args.get("save_dir") in (None, RUNS):
            args["save_dir"] = str(root)


def given_options(
    line: CommandLine, names: Iterable[str], placeholders: Mapping[str, object] | None = None
) -> dict[str, bool]:
    """Whether each dotted option (``trainer.default_root_dir``) is given on the command line or in a ``--config``
    file; a ``--config`` value equal to the option's entry in ``placeholders`` does not count (a copy of a packaged
    config keeps the logger's ``save_dir: runs``, which follows the root as the packaged one does)."""
    documents = [line.document(path) for path in line.configs]
    out = {}
    for name in names:
        found = line.given("--" + name)
        for doc in documents:
            node = doc
            for part in name.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            found = found or (node is not None and node != (placeholders or {}).get(name, object()))
        out[name] = found
    return out


def option_names(*groups: tuple[str, type]) -> dict[str, list[str]]:
    """``{"model": [...], ...}``: the init arguments of each group's class and its bases (for
    :func:`collab.cli.parser_errors.parser_error`'s near misses)."""
    import inspect

    out: dict[str, list[str]] = {}
    for group, cls in groups:
        names: list[str] = []
        for klass in getattr(cls, "__mro__", (cls,)):
            init = klass.__dict__.get("__init__")
            if init is None:
                continue
            try:
                params = inspect.signature(init).parameters.values()
            except (TypeError, ValueError):
                continue
            names += [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        out[group] = list(dict.fromkeys(names))
    return out
