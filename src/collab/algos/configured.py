"""Modules and datamodules built in Python from the packaged configs, the one place their defaults live.

The algorithm classes take every option as a keyword without a default: ``conf/algo/NAME.yaml`` holds each
value once, for ``python -m collab.fit`` and for a notebook or a test alike::

    from collab.algos import data_from_config, from_config

    module = from_config("magrpo", base={"name": "tiny"}, agent_lr=1e-2)     # conf/algo/magrpo.yaml's model
    data = data_from_config("magrpo", env="matrix", batch_size=4)           # its data, with conf/env/matrix.yaml

An override replaces the config's value whole (``agents=None``: the roles' defaults); a plain mapping or
list is turned into the option's dataclasses (``base``, ``agents``, ``critic_spec``) as the command line
would. An old option name ends in a UserError naming the new one (``docs/options.md``).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from collab.errors import UserError


def typed(hint: Any, value: Any) -> Any:
    """``value`` (plain YAML: mappings, lists, scalars) as the type ``hint`` says: dataclasses built from
    mappings, recursively through ``X | None`` and ``list[X]``; anything else as it is."""
    if value is None or hint is Any:
        return value
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if isinstance(value, hint) or not isinstance(value, dict):
            return value
        hints = typing.get_type_hints(hint)
        names = {f.name for f in dataclasses.fields(hint)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise UserError(f"{hint.__name__} has no option {unknown[0]!r}; valid: {', '.join(sorted(names))}")
        return hint(**{k: typed(hints[k], v) for k, v in value.items()})
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        for arg in args:
            if dataclasses.is_dataclass(arg) or typing.get_origin(arg) is list:
                return typed(arg, value)
        return value
    if origin is list and args and isinstance(value, list):
        return [typed(args[0], v) for v in value]
    return value


def init_hints(cls: type) -> dict[str, Any]:
    """The annotated keyword options of ``cls`` and its bases (the ``**kwargs`` chain to ``CollabModule``)."""
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        init = klass.__dict__.get("__init__")
        if init is not None and klass.__module__.startswith("collab."):
            hints.update({k: v for k, v in typing.get_type_hints(init).items() if k != "return"})
    return hints


def algo_config(algo: str, env: str | None = None) -> dict[str, Any]:
    """The merged packaged config of ``--algo algo`` (``--data.env env`` if given), as ``collab.fit`` reads it."""
    import yaml

    from collab.training.configs import config_files
    from collab.training.checks_options import check_env_pair

    files = config_files(algo, ["--data.env", env] if env else [])
    merged: dict[str, Any] = {}
    for path in files:
        for section, values in (yaml.safe_load(path.read_text()) or {}).items():
            if isinstance(values, dict) and isinstance(merged.get(section), dict):
                merged[section] = {**merged[section], **values}
            else:
                merged[section] = values
    check_env_pair(algo, merged.get("data", {}).get("env"))
    return merged


def from_config(algo: str, **overrides: Any):
    """The LightningModule of ``--algo algo`` with ``conf/algo/ALGO.yaml``'s model options, ``overrides``
    replacing some of them (``base={"name": "tiny"}``, ``agents=None``, ``agent_lr=1e-2``...)."""
    from collab.algos import algo_registry
    from collab.errors import unknown
    from collab.training.checks_options import check_old_names

    registry = algo_registry()
    if algo not in registry:
        raise unknown("algo", algo, registry)
    check_old_names([], overrides)
    cls = registry[algo]
    hints = init_hints(cls)
    options = {**algo_config(algo)["model"], **overrides}
    bad = sorted(set(options) - set(hints))
    if bad:
        raise UserError(f"model.{bad[0]} is not an option of --algo {algo}; valid: {', '.join(sorted(hints))}")
    return cls(**{name: typed(hints[name], value) for name, value in options.items()})


def data_from_config(algo: str, **overrides: Any):
    """The RolloutDataModule of ``--algo algo`` with its packaged data options (``env`` in ``overrides``
    composes that env's ``conf/env/ENV.yaml`` as ``--data.env`` does), ``overrides`` replacing some."""
    from collab.rollout.datamodule import RolloutDataModule

    options = {**algo_config(algo, overrides.get("env"))["data"], **overrides}
    return RolloutDataModule(**options)
