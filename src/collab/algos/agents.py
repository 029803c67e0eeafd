"""The team's agents from an environment's roles: one spec per role, the user's fields kept, the empty ones
filled from the run's ``model.agent_defaults`` (fine-tuning, LoRA, sampling) and from the role (its name, system
prompt, choices, and the response length when neither the agent nor the block sets one).

Every algorithm builds its team from these specs (:meth:`collab.algos.base.CollabModule.team_specs`; MAPoRL
repeats them per turn), so the same config trains on any environment, and on any team size the environment
sets: a config of two agents on debate's ``agents: 4`` or math's trio profile trains 4 or 3, the roles past
the last configured agent repeating its settings (:func:`resolve_agents`).
"""

from __future__ import annotations

from dataclasses import replace

from collab.envs import Env
from collab.errors import UserError
from collab.policy.team import AgentDefaults, AgentSpec, with_defaults


def resolve_agents(env: Env, agents: list[AgentSpec] | None, defaults: AgentDefaults | None = None) -> list[AgentSpec]:
    """One spec per environment role: the user's spec with empty fields filled from ``defaults`` (the run's
    ``model.agent_defaults``; None: ``conf/base.yaml``'s), then from the role; no spec at all: the block itself.

    With fewer specs than roles, each role past the last spec takes a copy of that spec's settings (base,
    fine-tuning, LoRA, learning rate, sampling) and its own role's name, system prompt and choices, so that a
    team's size follows the environment without the agents restated (a choice: the papers say nothing of it;
    debate's N debaters are copies of one role, and the trio's verifier grows from a duo's config). More specs
    than roles is an error: which of them would play is not clear."""
    names = ", ".join(r.name for r in env.roles)
    if agents and len(agents) > env.n_agents:
        roles = f"{env.n_agents} role{'s' if env.n_agents != 1 else ''}"
        raise UserError(
            f"{len(agents)} agents configured but env {env.name!r} has {roles} ({names}); give at most "
            f"{env.n_agents} (the roles past the last one given repeat its settings) or none"
        )
    if defaults is None:
        from collab.policy.specs import packaged_defaults

        defaults = packaged_defaults()
    out = []
    for i, role in enumerate(env.roles):
        if not agents:
            spec = with_defaults(AgentSpec(), defaults)
        elif i < len(agents):
            spec = with_defaults(agents[i], defaults)
        else:
            spec = replace(with_defaults(agents[-1], defaults), role="", system_prompt=None, choices=None)
        spec.role = spec.role or role.name
        spec.system_prompt = spec.system_prompt if spec.system_prompt is not None else role.system_prompt
        if spec.choices is None and role.choices is not None:
            spec.choices = list(role.choices)
        if spec.sampling.max_new_tokens is None and role.max_new_tokens is not None:
            spec.sampling = replace(spec.sampling, max_new_tokens=role.max_new_tokens)
        out.append(spec)
    return out
