"""Modules and datamodules built in Python from the packaged configs, the way ``python -m collab.fit`` builds them.

The algorithm classes take every option as a keyword without a default: the packaged configs hold each value
once, for the command line and for a notebook or a test alike::

    from collab.algos import data_from_config, from_config

    module = from_config("magrpo", base={"name": "tiny"}, ppo={"clip": 0.1})  # the composed config's model
    data = data_from_config("magrpo", env="matrix", batch_size=4)          # its data, composed for matrix

The config is composed as for the command line (:func:`collab.config.packaged_config`); an override replaces the
config's value (``agents=None``: one agent per role, each ``model.agent_defaults``), except a mapping given for a
group, merged key by key into the composed one as a ``--config`` file's is (``ppo={"clip": 0.1}`` keeps the
config's discount and epochs, ``base={"name": "tiny"}`` its dtype; ``agent_defaults={"sampling": {"temperature":
1.0}}`` keeps its top-p: a part of the block is all one ever means); a dataclass instance replaces it whole.
Agents given as :class:`~collab.policy.specs.AgentSpec` take the block's values for the fields they leave out, as on
the command line. The options are parsed and instantiated by the parser
``collab.fit`` uses for its ``model`` and ``data`` groups (Lightning's), so a value means the same from both.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Any

from collab.errors import UserError


def plain(value: Any) -> Any:
    """``value`` with dataclass instances as mappings (the parser reads plain YAML values)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def init_names(cls: type) -> list[str]:
    """The keyword options of ``cls`` and its bases (the ``**kwargs`` chain to ``CollabModule``)."""
    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None and klass.__module__.startswith("collab."):
            names += [
                p.name
                for p in inspect.signature(init).parameters.values()
                if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            ]
    return sorted(set(names))


def instantiate(group: str, cls: type, options: dict[str, Any]):
    """``cls(**options)`` as ``collab.fit``'s parser builds its ``group`` (``model`` or ``data``): the values
    checked against the class's type hints and turned into its dataclasses."""
    from argparse import ArgumentError

    from lightning.pytorch.cli import LightningArgumentParser

    from collab.config import nullable_options_not_required

    parser = LightningArgumentParser(exit_on_error=False)
    parser.add_lightning_class_args(cls, group, subclass_mode=False)
    nullable_options_not_required(parser)
    try:
        config = parser.parse_object({group: plain(options)})
    except ArgumentError as e:
        raise UserError(f"{group}: {' '.join(str(e).split())}") from None
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # renamed in jsonargparse 4.49
    return instantiate(config)[group]


def from_config(algo: str, **overrides: Any):
    """The LightningModule of ``--algo algo`` with its composed config's model options, ``overrides`` replacing
    some of them (``base={"name": "tiny"}``, ``agents=None``, ``agent_lr=1e-2``...)."""
    from collab.algos import algo_registry
    from collab.config import packaged_config
    from collab.errors import unknown

    registry = algo_registry()
    if algo not in registry:
        raise unknown("algo", algo, registry)
    cls = registry[algo]
    names = init_names(cls)
    bad = sorted(set(overrides) - set(names))
    if bad:
        raise UserError(f"model.{bad[0]} is not an option of --algo {algo}; valid: {', '.join(names)}")
    model = packaged_config(algo)["model"]
    if "agent_defaults" in overrides:
        block = merged_block(model.get("agent_defaults"), overrides["agent_defaults"])
        overrides = {**overrides, "agent_defaults": block}
    from collab.config import merge

    for name, value in overrides.items():  # a part of a group (ppo={"clip": 0.1}): the rest from the config
        if name != "agent_defaults" and isinstance(value, dict) and isinstance(model.get(name), dict):
            overrides = {**overrides, name: merge(copy.deepcopy(model[name]), value, "from_config", {})}
    return instantiate("model", cls, {**model, **overrides})


def merged_block(block: dict | None, override: Any) -> Any:
    """``override`` (a mapping or an :class:`~collab.policy.specs.AgentDefaults`) merged key by key into the
    composed ``model.agent_defaults``: its None values left out (unset), as the parser merges a ``--config`` file's
    block. Anything else is returned as it is, for the parser to refuse in one line."""
    from collab.config import merge

    value = plain(override)
    if not isinstance(value, dict) or not isinstance(block, dict):
        return value
    return merge(copy.deepcopy(block), drop_none(value), "from_config", {})


def drop_none(value: Any) -> Any:
    """``value`` without the None values of its mappings, at any depth."""
    if isinstance(value, dict):
        return {k: drop_none(v) for k, v in value.items() if v is not None}
    return value


def data_from_config(algo: str, **overrides: Any):
    """The RolloutDataModule of ``--algo algo`` with its composed data options (``env`` in ``overrides`` composes
    for that env, as ``--data.env`` does), ``overrides`` replacing some."""
    from collab.algos.options import check_env_pair
    from collab.config import packaged_config
    from collab.rollout.datamodule import RolloutDataModule

    check_env_pair(algo, overrides.get("env"))
    return instantiate("data", RolloutDataModule, {**packaged_config(algo, overrides.get("env"))["data"], **overrides})
