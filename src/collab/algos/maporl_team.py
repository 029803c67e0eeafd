"""MAPoRL's team: the debaters theta_ta, their value heads theta_vta, and which of them train (MAPoRL, Section 3).

One adapter per agent, shared by its turns (theta_a), or with ``per_turn`` one per (turn, agent), the paper's
theta_ta: role a at turn t is member t*A + a. Each member has a value head V(i^x_ta; theta_vta): an MLP
(:class:`~collab.policy.mlp_head.CriticHead`) on its frozen base's last hidden state (adapters off) at every
position that chooses a response token (in a team of several bases, on the member's own base, in its own
tokens: :func:`~collab.policy.mlp_head.team_features`). The heads read the frozen base rather than a
LoRA-shared trunk: cheaper, and the value loss never moves the policy. The per-turn members of the turns
before ``train_from_turn`` keep their initial adapters and heads.
"""

from __future__ import annotations

import copy

from torch import nn

from collab.algos.agents import resolve_agents
from collab.errors import UserError
from collab.policy.mlp_head import CriticHead
from collab.policy.team import AgentSpec


class MAPoRLTeam:
    """The construction hooks of :class:`~collab.algos.maporl.MAPoRL` (mixed in before
    :class:`~collab.algos.base.CollabModule`), which holds the options they read: ``per_turn``,
    ``train_from_turn``, ``critic_hidden`` and ``critic_lr``."""

    def team_specs(self, env) -> list[AgentSpec]:
        specs = resolve_agents(env, self.agent_specs, self.agent_defaults)
        return [copy.deepcopy(spec) for _ in range(env.horizon) for spec in specs] if self.per_turn else specs

    def build_extra(self, env) -> None:
        if not hasattr(env, "grade_answers"):
            raise UserError(f"MAPoRL trains a debate; env {env.name!r} is not one (use --data.env debate)")
        if self.per_turn:
            self.team.turn_agents = [[t * env.n_agents + a for a in range(env.n_agents)] for t in range(env.horizon)]
        heads = [
            CriticHead(self.team.model_of(m).config.hidden_size, self.critic_hidden) for m in range(len(self.team))
        ]
        self.value_heads = nn.ModuleList(heads).to(self.team.device)
        frozen = self.untrained_members(env)  # no gradient to synchronise under DDP, nothing in the optimizer
        self.team.freeze(frozen)
        for m in frozen:
            self.value_heads[m].requires_grad_(False)

    def untrained_members(self, env) -> list[int]:
        """The per-turn members of the turns before ``train_from_turn`` (theta_ta of the untrained turns: Experiment 1's
        turn-1 debaters), acting with their initial adapter (LoRA B = 0: the base policy), frozen at build. Shared
        adapters (``per_turn`` false) are trained at the later turns: none is frozen."""
        if not self.per_turn:
            return []
        return [
            t * env.n_agents + a for t in range(min(self.train_from_turn - 1, env.horizon)) for a in range(env.n_agents)
        ]

    def param_groups(self):
        heads = [p for p in self.value_heads.parameters() if p.requires_grad]  # the frozen members' heads left out
        return super().param_groups() + [{"params": heads, "lr": self.critic_lr, "name": "value_heads"}]
