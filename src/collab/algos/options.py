"""The envs each algorithm trains on, checked for the command line (``collab.fit``) and for Python
(:func:`collab.algos.from_config`) alike: ``--algo X --data.env Y`` for an env that X does not train on is refused
in one line naming the envs X supports (:func:`check_env_pair`).
"""

from __future__ import annotations

from collab.errors import UserError

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
