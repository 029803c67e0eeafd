"""Options checked before a run starts: one vocabulary, algorithm x env pairs, Lightning's own options.

- :data:`RENAMED`: the model options that had another name in one algorithm (``docs/options.md`` lists
  the vocabulary); an old name on the command line, in a ``--config`` file or given to
  :func:`collab.algos.from_config` ends in one line naming the new one (exit code 2), never silently
  accepted or ignored;
- :func:`check_env_pair`: ``--algo X --data.env Y`` for an env that X does not train on, refused in one
  line naming the envs X supports;
- :func:`collab.errors.class_from_path`: ``--algo module:Class`` and ``--data.env module:Class`` (an algorithm or env of
  one's own, docs/extending.md) imported and checked, or refused in one line;
- :func:`place_runs`: ``--trainer.default_root_dir DIR`` takes effect: the packaged configs' logger writes
  under the root (its ``save_dir`` follows the root unless given), so logs, checkpoints and adapters
  all land there;
- :func:`option_names`: the valid option names per group (for the parser's near misses).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from collab.errors import UserError

RENAMED: dict[str, str] = {
    "advantage_clip": "clip",  # MAGRPO, CoLLM, IPPO called the PPO clip range advantage_clip; MAPoRL, MARFT clip
    "value_loss_coef": "value_coef",  # MARFT; MAPoRL's value_coef
    "value_lr": "critic_lr",  # MAPoRL's value heads are its critics: CoLLM, IPPO, MARFT's critic_lr
    "value_hidden": "critic_hidden",  # MAPoRL; MARFT's critic_hidden
    "gae_gamma": "token_gamma",  # MAPoRL's discount between a response's tokens (gamma: between turns)
}
"""Old model option name -> its name now."""

RUNS = "runs"
"""Where runs go when neither ``trainer.default_root_dir`` nor the logger's ``save_dir`` is given."""


def renamed(name: str, where: str) -> UserError:
    return UserError(f"model.{name} was renamed model.{RENAMED[name]} ({where}); write model.{RENAMED[name]} "
                     "(docs/options.md lists the options)")


def check_old_names(argv: list[str], given: Mapping | None = None) -> None:
    """An old option name in ``argv`` (``--model.NAME``, or a ``model:`` key of a ``--config`` file) or in
    ``given`` (keyword overrides) is a one-line UserError naming the new one."""
    import yaml

    for name in given or {}:
        if name in RENAMED:
            raise renamed(name, "a keyword override")
    for i, arg in enumerate(argv):
        option = arg.split("=", 1)[0]
        if option.startswith("--model.") and option.removeprefix("--model.").split(".")[0] in RENAMED:
            raise renamed(option.removeprefix("--model.").split(".")[0], f"given as {option}")
        if option == "--config":
            path = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            try:
                data = yaml.safe_load(Path(path).read_text())
            except Exception:  # missing or malformed: the parser reports it
                continue
            model = data.get("model") if isinstance(data, dict) else None
            for name in model if isinstance(model, dict) else ():
                if name in RENAMED:
                    raise renamed(name, f"in --config {path}")


ALGO_ENVS: dict[str, tuple[str, ...]] = {"maporl": ("debate",)}
"""Algorithms that train on some envs only (the others train on every env)."""


def algo_envs(algo: str) -> tuple[str, ...]:
    """The envs ``--algo algo`` trains on (``--data.env`` refuses the others)."""
    from collab.envs import env_names

    return ALGO_ENVS.get(algo, tuple(env_names()))


def check_env_pair(algo: str, env: str | None) -> None:
    """``--algo algo --data.env env`` for an env the algorithm does not train on: one line naming its envs."""
    from collab.envs import env_names

    if not isinstance(env, str) or (env not in env_names() and ":" not in env):
        return  # an unknown env: make_env names the valid ones
    if ":" in env and algo not in ALGO_ENVS:
        return  # an env of one's own (module:Class): for the algorithms that train on every env
    supported = algo_envs(algo)
    if env not in supported:
        raise UserError(f"--algo {algo} does not train on env {env!r}; it supports: {', '.join(supported)}")


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


def given_options(argv: Iterable[str], names: Iterable[str], placeholders: Mapping[str, object] | None = None) -> dict[str, bool]:
    """Whether each dotted option (``trainer.default_root_dir``) is given in ``argv`` or a ``--config`` file;
    a ``--config`` value equal to the option's entry in ``placeholders`` does not count (a copy of a packaged
    config keeps the logger's ``save_dir: runs``, which follows the root as the packaged one does)."""
    import yaml

    argv = list(argv)
    out = {}
    configs = []
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            configs.append(argv[i + 1])
        elif arg.startswith("--config="):
            configs.append(arg.split("=", 1)[1])
    documents = []
    for path in configs:
        try:
            documents.append(yaml.safe_load(Path(path).read_text()) or {})
        except Exception:
            continue
    for name in names:
        flag = "--" + name
        found = any(a == flag or a.startswith(flag + "=") for a in argv)
        for doc in documents:
            node = doc
            for part in name.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            found = found or (node is not None and node != (placeholders or {}).get(name, object()))
        out[name] = found
    return out


def option_names(*groups: tuple[str, type]) -> dict[str, list[str]]:
    """``{"model": [...], ...}``: the init arguments of each group's class and its bases (for
    :func:`parser_error`'s near misses)."""
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
