"""Environments and their registry: ``make_env("writing", horizon=2)``."""

from __future__ import annotations

from collab.envs.base import AgentRole, Env, EnvState, Score, StepResult
from collab.errors import UserError, unknown


def _registry() -> dict[str, type[Env]]:
    from collab.envs.matrix import MatrixEnv
    from collab.envs.writing import WritingEnv

    return {cls.name: cls for cls in (MatrixEnv, WritingEnv)}


def env_names() -> list[str]:
    return sorted(_registry())


def make_env(name: str, **kwargs) -> Env:
    """Build the environment ``name`` with its keyword options; bad names and options end in a UserError."""
    registry = _registry()
    if name not in registry:
        raise unknown("env", name, registry)
    try:
        return registry[name](**kwargs)
    except TypeError as e:
        import inspect

        params = [p for p in inspect.signature(registry[name]).parameters]
        raise UserError(f"bad option for env {name!r} ({e}); valid options: {', '.join(params)}") from None


__all__ = ["AgentRole", "Env", "EnvState", "Score", "StepResult", "env_names", "make_env"]
