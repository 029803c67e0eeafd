"""The algorithms' option vocabulary and the envs each trains on, checked for the command line
(``collab.fit``) and for Python (:func:`collab.algos.from_config`) alike.

- :data:`RENAMED`: the model options that had another name in one algorithm (``docs/options.md`` lists
  the vocabulary); an old name on the command line, in a ``--config`` file or given to
  :func:`collab.algos.from_config` ends in one line naming the new one (exit code 2), never silently
  accepted or ignored;
- :func:`check_env_pair`: ``--algo X --data.env Y`` for an env that X does not train on, refused in one
  line naming the envs X supports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from collab.errors import UserError

RENAMED: dict[str, str] = {
    "advantage_clip": "clip",  # MAGRPO, CoLLM, IPPO called the PPO clip range advantage_clip; MAPoRL, MARFT clip
    "value_loss_coef": "value_coef",  # MARFT; MAPoRL's value_coef
    "value_lr": "critic_lr",  # MAPoRL's value heads are its critics: CoLLM, IPPO, MARFT's critic_lr
    "value_hidden": "critic_hidden",  # MAPoRL; MARFT's critic_hidden
    "gae_gamma": "token_gamma",  # MAPoRL's discount between a response's tokens (gamma: between turns)
}
"""Old model option name -> its name now."""


def renamed(name: str, where: str) -> UserError:
    return UserError(
        f"model.{name} was renamed model.{RENAMED[name]} ({where}); write model.{RENAMED[name]} "
        "(docs/options.md lists the options)"
    )


def check_old_names(
    options: Iterable[str] = (), configs: Mapping[str, dict] | None = None, given: Mapping | None = None
) -> None:
    """An old option name among ``options`` (the dotted options given: ``--model.NAME``), in the ``model:`` section
    of a ``configs`` file (path -> its mapping) or in ``given`` (keyword overrides) is a one-line UserError naming
    the new one."""
    for name in given or {}:
        if name in RENAMED:
            raise renamed(name, "a keyword override")
    for option in options:
        name = option.removeprefix("--model.").split(".")[0]
        if option.startswith("--model.") and name in RENAMED:
            raise renamed(name, f"given as {option}")
    for path, document in (configs or {}).items():
        model = document.get("model")
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
