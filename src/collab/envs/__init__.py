"""Environments and their registry: ``make_env("writing", horizon=2)``; ``make_env("guess_env:GuessEnv")``
builds an env of one's own from a class path (docs/extending.md)."""

from __future__ import annotations

import types

from collab.envs.base import AgentRole, Env, EnvState, Score, StepResult
from collab.envs.centralized import SingleModelEnv
from collab.errors import UserError, registered_class

# name -> "module:Class"; an environment's module is imported only when it is built.
_ENVS = {
    "classeval": "collab.envs.classeval.env:ClassEvalEnv",
    "matrix": "collab.envs.matrix:MatrixEnv",
    "writing": "collab.envs.writing:WritingEnv",
    "coding": "collab.envs.coding.env:CodingEnv",
    "math": "collab.envs.math.env:MathEnv",
    "competitive_coding": "collab.envs.competitive_coding.env:CompetitiveCodingEnv",
    "debate": "collab.envs.debate.env:DebateEnv",
    "minecraft": "collab.envs.minecraft.env:MinecraftEnv",
    "str_build": "collab.envs.minecraft.str_env:StrBuildEnv",
    "plan_path": "collab.envs.games.env:PlanPathEnv",
    "sokoban": "collab.envs.games.env:SokobanEnv",
    "sudoku": "collab.envs.games.env:SudokuEnv",
    "search_qa": "collab.envs.search_qa.env:SearchQAEnv",
}


def env_class(name: str) -> type[Env]:
    """The class of environment ``name``: a built-in name, or a class path ``module:Class`` naming an
    :class:`Env` subclass importable from the working directory (an env of one's own: docs/extending.md).
    An unknown name is a UserError listing the valid ones."""
    return registered_class(name, _ENVS, Env, "env", "--data.env")


def env_names() -> list[str]:
    return sorted(_ENVS)


def typed_options(cls: type[Env], options: dict) -> dict:
    """``options`` with each string read as YAML where the env's parameter does not take a string.

    Why: ``data.env_options`` keeps every string as written (``train_split: "[0:8]"`` stays the split, which
    YAML would read as a list), and ``--data.env_options.KEY VALUE`` on the command line gives the text
    ``VALUE``. The env's own annotation says what the text means: ``num_eval: int`` reads ``"8"`` as 8,
    ``train_split: str | None`` keeps ``[0:8]`` (which YAML reads as a list), reads ``'"[0:8]"'`` as the string
    in its quotes and ``null`` as None. A value that is not YAML stays the text, for the env's own check."""
    import typing

    import yaml
    from jsonargparse import get_loader

    try:
        hints = typing.get_type_hints(cls.__init__)
    except (NameError, TypeError):  # an env of one's own with annotations that do not resolve: as given
        return dict(options)
    typed = dict(options)
    for key, value in options.items():
        hint = hints.get(key)
        if not isinstance(value, str) or hint is None or hint is typing.Any:
            continue
        members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        try:
            read = get_loader("yaml")(value)  # the parser's reading of YAML: 1e-3 is a number
        except yaml.YAMLError:
            continue
        if str not in members or isinstance(read, str) or (read is None and type(None) in members):
            typed[key] = read  # a quoted YAML string ('"[0:8]"') is the string inside its quotes
    return typed


def make_env(name: str, **kwargs) -> Env:
    """Build the environment ``name`` with its keyword options; bad names and options end in a UserError. Every
    env takes ``reward_shift``, the tool options (:mod:`collab.tools.setup`) and ``centralized`` (``headers`` |
    ``tags``: one agent writes every role's part, :class:`collab.envs.centralized.SingleModelEnv`)."""
    import inspect

    cls = env_class(name)
    shift = kwargs.pop("reward_shift", 0.0)
    centralized = kwargs.pop("centralized", None)
    tool_options = {k: kwargs.pop(k) for k in ("tools", "tool_budget", "tool_choice", "call_penalty") if k in kwargs}
    penalty = tool_options.get("call_penalty", 0.0)
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or penalty < 0:
        raise UserError(f"env option call_penalty must be a number >= 0 (subtracted per tool call), got {penalty!r}")
    if isinstance(shift, bool) or not isinstance(shift, (int, float)):
        raise UserError(f"env option reward_shift must be a number (added to every turn's reward), got {shift!r}")
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as e:
        params = ", ".join(inspect.signature(cls).parameters)
        raise UserError(f"bad option for env {name!r} ({e}); valid options: {params}") from None
    env = cls(**typed_options(cls, kwargs))
    env.reward_shift = float(shift)
    if centralized is not None:  # one agent does every role (a bad protocol: one line); the tools are its own
        env = SingleModelEnv(env, centralized)
    if any(tool_options.get(k) is not None for k in ("tools", "tool_budget", "tool_choice")):  # the env's tools
        from collab.tools.options import tool_setup

        env.tools = tool_setup(tool_options, env.n_agents, env.offered_tools)
    return env


__all__ = ["AgentRole", "Env", "EnvState", "Score", "StepResult", "env_names", "make_env"]
