"""The team's agents from an environment's roles: one spec per role, the user's fields kept, the empty ones
filled from the role (its name, system prompt, choices, response length).

Every algorithm builds its team from these specs (:meth:`collab.algos.base.CollabModule.team_specs`; MAPoRL
repeats them per turn), so the same config trains on any environment.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from collab.envs import Env
from collab.errors import UserError
from collab.policy.team import AgentSpec


def resolve_agents(env: Env, agents: list[AgentSpec] | None) -> list[AgentSpec]:
    """One spec per environment role: the user's spec with empty fields filled from the role."""
    if agents and len(agents) != env.n_agents:
        raise UserError(
            f"{len(agents)} agents configured but env {env.name!r} has {env.n_agents} roles "
            f"({', '.join(r.name for r in env.roles)}); give {env.n_agents} agents or none"
        )
    out = []
    for i, role in enumerate(env.roles):
        spec = copy.deepcopy(agents[i]) if agents else AgentSpec()
        spec.role = spec.role or role.name
        spec.system_prompt = spec.system_prompt if spec.system_prompt is not None else role.system_prompt
        if spec.choices is None and role.choices is not None:
            spec.choices = list(role.choices)
        if spec.sampling.max_new_tokens is None and role.max_new_tokens is not None:
            spec.sampling = replace(spec.sampling, max_new_tokens=role.max_new_tokens)
        out.append(spec)
    return out
