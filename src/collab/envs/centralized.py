"""One agent doing every role of an environment: CoLLM's ``single`` baseline (§5.2) and CoMLRL's centralized
comparator (``--data.env_options '{centralized: tags}'``, trained by MAGRPO with a team of one).

The agent answers one prompt that holds every role's instructions and message; its one response is cut back into
the roles' actions, which the wrapped environment scores as usual. Two protocols say how:

- ``headers`` (CoLLM's single baseline, collab's default): :meth:`Env.single_agent_prompt` and
  :meth:`Env.split_single_response`, one ``### <role>`` header per role, which an environment may specialise; a
  response without any header is every role's action.
- ``tags`` (CoMLRL's centralized MAGRPO, ``comlrl/trainers/preference/centralized.py`` at 11d89a9, its tagged
  adapter): one section per role between ``<agent_i>`` and ``</agent_i>`` (i from 0). Role i's action is the
  first such section (tag names case-insensitive, spaces allowed inside the brackets, the section stripped); a
  role without one gets ""; a response without any section gives every role "" (the reference's parse error,
  which it scores as empty outputs). The reference asks for one turn; here later turns merge the roles' feedback
  under the same labels.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from collab.envs.base import AgentRole, Env, EnvState, Score, StepResult, role_headers
from collab.errors import require

PROTOCOLS = ("headers", "tags")
"""How one agent's prompt is built and its response split: :func:`tagged_prompt` / :func:`split_tagged` (tags), or
the environment's own :meth:`Env.single_agent_prompt` / :meth:`Env.split_single_response` (headers)."""


def tagged_prompt(roles: Sequence[AgentRole], messages: Sequence[str], turn: int) -> str:
    """One user message asking a single model for every role's part of ``turn``, each between ``<agent_i>`` tags:
    the roles' system prompts (turn 0) and messages, numbered from 0 as the tags are."""
    names = role_headers(roles)
    parts = [
        f"You write the outputs of {len(roles)} agents ({', '.join(names)}), each on its own: "
        + ("their instructions follow." if turn == 0 else "each one's feedback follows.")
    ]
    for i, (role, name, message) in enumerate(zip(roles, names, messages, strict=True)):
        body = [role.system_prompt] if turn == 0 and role.system_prompt else []
        parts.append(f"Agent {i} ({name}):\n" + "\n\n".join([*body, message]))
    sections = "\n".join(f"<agent_{i}>\n...\n</agent_{i}>" for i in range(len(roles)))
    parts.append(f"Answer with exactly one section per agent, in this form, and nothing outside them:\n{sections}")
    return "\n\n".join(parts)


def split_tagged(text: str, n_agents: int) -> list[str]:
    """Role i's action in a tagged response: the first ``<agent_i> ... </agent_i>`` section, stripped ("" without
    one); every role "" when the response holds no section at all."""
    found = [
        re.search(rf"<\s*agent_{i}\s*>(.*?)<\s*/\s*agent_{i}\s*>", text, flags=re.IGNORECASE | re.DOTALL)
        for i in range(n_agents)
    ]
    return [m.group(1).strip() if m else "" for m in found]


class EnvWrapper(Env):
    """An environment playing another one (``inner``): same name, tasks, horizon and reward scale."""

    def __init__(self, env: Env) -> None:
        self.inner = env
        self.name = env.name  # type: ignore[misc]  # rows of the comparison table are named by the task
        self.horizon = env.horizon
        self.joint_reward, self.reward_max = env.joint_reward, env.reward_max

    def tasks(self, split: str) -> Sequence[Mapping[str, Any]]:
        return self.inner.tasks(split)


def _last_user_messages(state: EnvState) -> list[str]:
    return [h[-1]["content"] for h in state.histories]


class SingleModelEnv(EnvWrapper):
    """One agent does every role of ``env`` under ``protocol`` (:data:`PROTOCOLS`): its state keeps the inner
    environment's state in ``memory["inner"]`` and the last split in ``memory["split"]``. Its one role's response
    length is the sum of the roles' (None when one has none), its closed vocabulary theirs when they share one."""

    def __init__(self, env: Env, protocol: str = "headers") -> None:
        require(
            protocol in PROTOCOLS,
            f"env option centralized must be {' | '.join(PROTOCOLS)} (one agent writes every role), got {protocol!r}",
        )
        super().__init__(env)
        self.protocol = protocol
        if callable(getattr(env, "voxels", None)):  # the evaluation's IoU reads the inner (built) world
            self.voxels = lambda state: env.voxels(state.memory["inner"])
        budgets = [role.max_new_tokens for role in env.roles]
        choices = {role.choices for role in env.roles}
        self.roles = (
            AgentRole(
                "single",
                None,
                sum(budgets) if None not in budgets else None,
                choices.pop() if len(choices) == 1 else None,
            ),
        )

    def _prompt(self, inner: EnvState) -> str:
        if self.protocol == "tags":
            return tagged_prompt(self.inner.roles, _last_user_messages(inner), inner.turn)
        return self.inner.single_agent_prompt(_last_user_messages(inner), inner.turn)

    def split(self, text: str) -> list[str]:
        """The roles' actions in one response."""
        if self.protocol == "tags":
            return split_tagged(text, self.inner.n_agents)
        return self.inner.split_single_response(text)

    def reset(self, task: Mapping[str, Any]) -> EnvState:
        inner = self.inner.reset(task)
        return EnvState(
            task=task, histories=(({"role": "user", "content": self._prompt(inner)},),), memory={"inner": inner}
        )

    def observe(self, task: Mapping[str, Any]) -> list[str]:
        return [self._prompt(self.inner.reset(task))]

    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        return self.inner.score(state.memory["inner"], self.split(actions[0]))

    def step_batch(self, states: Sequence[EnvState], actions: Sequence[Sequence[str]]) -> list[StepResult]:
        splits = [self.split(a[0]) for a in actions]
        results = self.inner.step_batch([s.memory["inner"] for s in states], splits)
        out = []
        for state, action, split, res in zip(states, actions, splits, results, strict=True):
            history = state.histories[0] + ({"role": "assistant", "content": action[0]},)
            if not res.done:
                history += ({"role": "user", "content": self._prompt(res.state)},)
            memory = {**state.memory, "inner": res.state, "split": tuple(split)}
            nxt = replace(state, histories=(history,), turn=state.turn + 1, done=res.done, memory=memory)
            # the inner rewards and the turns an early end skipped: the team's returns, to compare with
            out.append(StepResult(nxt, res.rewards, res.done, res.info, res.turns_left))
        return out
