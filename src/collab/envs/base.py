"""The environment protocol shared by every task.

An episode is a Dec-POMDP dialog (CoLLM, Section 2.2): at turn ``t`` every agent ``i`` holds its
local history ``h_{i,t}`` (chat messages: its system prompt, the observations it was shown and the
actions it took), acts with a response ``a_{i,t}``, and the environment returns rewards and the next
observations. States are immutable values, so a rollout tree (MAGRPO) can branch one state into K
children without copying an environment object.

An environment supplies four things; :meth:`Env.reset` and :meth:`Env.step` do the bookkeeping:

- :meth:`Env.tasks` — the task records of a split;
- :meth:`Env.observe` — each agent's first user message for a task;
- :meth:`Env.score` — the rewards of a joint action, whether the episode terminates, and the named
  reward components (logged);
- :meth:`Env.feedback` — each agent's next user message in multi-turn episodes.

For the single-model baseline (:mod:`collab.evaluation.baselines`, CoLLM §5.2) an environment may also
specialize how one model is asked to do every role's part (:meth:`Env.single_agent_prompt`) and how
its one response is cut back into the roles' actions (:meth:`Env.split_single_response`); the
defaults use one ``### <role>`` header per role.

Dec-POMDP environments give every agent the same joint reward (``joint_reward = True``); POSG
environments (MAGRPO appendix, Appendix A.2) give each agent its own.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from collab.tools.setup import ToolSetup

Message = Mapping[str, str]
"""A chat message: ``{"role": "system" | "user" | "assistant", "content": str}``."""
FEEDBACK_TOKENS = 64
"""Tokens a turn's feedback is counted as when an env does not say (:meth:`Env.prompt_tokens`): the default
feedback is a reward line of about 20."""


@dataclass(frozen=True)
class AgentRole:
    """What an environment says about one of its agents (an :class:`~collab.policy.team.AgentSpec` may override it)."""

    name: str
    """Short role name, used in logs (``concise``, ``detailed``, ``aux``, ``main``)."""
    system_prompt: str | None = None
    """System message; ``None`` keeps the model's own default."""
    max_new_tokens: int | None = None
    """The environment's suggested response length."""
    choices: tuple[str, ...] | None = None
    """A closed action vocabulary: when set, each option is one token and the agent's policy is
    restricted to those tokens (a one-token response). ``None``: free text."""


def role_headers(roles: Sequence[AgentRole]) -> list[str]:
    """The header naming each role in a single model's response (:meth:`Env.single_agent_prompt`):
    the role names, numbered when two roles share a name."""
    names = [role.name for role in roles]
    return [f"{n} {i + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]


@dataclass(frozen=True)
class EnvState:
    """The state of one episode, as the agents and the reward see it."""

    task: Mapping[str, Any]
    histories: tuple[tuple[Message, ...], ...]
    """Per agent: its chat messages so far; the last one is the user message it must answer."""
    turn: int = 0
    done: bool = False
    memory: Mapping[str, Any] = field(default_factory=dict)
    """Environment-specific carry-over between turns (e.g. the last turn's reward, the world state)."""


@dataclass(frozen=True)
class Score:
    """What :meth:`Env.score` returns for one joint action."""

    rewards: tuple[float, ...]
    """One reward per agent (identical under a joint reward)."""
    terminated: bool = False
    """The environment ends the episode (e.g. an out-of-band writing pair, all tests passing)."""
    info: Mapping[str, float] = field(default_factory=dict)
    """Named reward components and diagnostics, logged as ``env/<name>``."""
    memory: Mapping[str, Any] = field(default_factory=dict)
    """Carry-over merged into the next state's memory."""


@dataclass(frozen=True)
class StepResult:
    state: EnvState
    rewards: tuple[float, ...]
    """The turn's rewards, :attr:`Env.reward_shift` included."""
    done: bool
    info: Mapping[str, float]
    turns_left: int = 0
    """Turns of the horizon an early termination skipped (0 when the episode goes on or ends at the
    horizon): the algorithms value the end as an absorbing state repeating ``rewards`` that many more
    turns (:func:`collab.objectives.absorbing_reward`)."""


class Env(ABC):
    """Base class of collab's environments. Subclasses set :attr:`name` and :attr:`roles`."""

    name: ClassVar[str]
    roles: tuple[AgentRole, ...]
    joint_reward: bool = True
    reward_max: float | None = None
    """The largest reward of one turn (shown to critics in the global information m_t); None: unknown."""
    reward_shift: float = 0.0
    """Added to every turn's reward (``--data.env_options '{reward_shift: -4.0}'``), as the reference
    configs' ``reward_shift`` (e.g. the team's reward minus its maximum: every extra turn costs)."""
    tools: ToolSetup = ToolSetup()
    """The agents' tools within a turn, their budget, forced calls and price (``--data.env_options '{tools:
    [calculator]}'``, ``tool_budget``, ``tool_choice``, ``call_penalty``: :mod:`collab.tools.setup`); none by
    default."""
    offered_tools: Mapping[str, str] = {}
    """Tools of the env's own, by name (``module:Class``), that the ``tools`` option may name besides
    :mod:`collab.tools`' (the coding env's ``run_tests``)."""
    history_window: int | None = None
    """C of CoLLM, Section 4.1 ("maintain only the most recent C pairs"), counted in turns: a history
    keeps its opening messages (system prompt and first observation) and the last C (response, feedback)
    pairs; ``None`` keeps the whole dialog (:func:`window`)."""

    def __init__(self, horizon: int = 1) -> None:
        from collab.errors import require

        require(horizon >= 1, f"data.num_turns (the env horizon) must be >= 1, got {horizon}")
        self.horizon = horizon

    @property
    def n_agents(self) -> int:
        return len(self.roles)

    # -- what an environment supplies -------------------------------------------------------------
    @abstractmethod
    def tasks(self, split: str) -> Sequence[Mapping[str, Any]]:
        """The task records of ``split`` (``"train"`` or ``"eval"``)."""

    @abstractmethod
    def observe(self, task: Mapping[str, Any]) -> list[str]:
        """Each agent's first user message for ``task``."""

    @abstractmethod
    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        """Rewards of the joint action ``actions`` taken in ``state``."""

    def played(self, state: EnvState, actions: Sequence[str]) -> tuple[bool, ...]:
        """Which agents' actions the joint action ``actions`` in ``state`` plays: all, unless the env routes a turn to
        some of them (search_qa's orchestra). Whole-episode rollouts train only the played ones
        (:mod:`collab.rollout.episode_batch`)."""
        return (True,) * self.n_agents

    def valid(self, agent: int, action: str) -> bool:
        """Whether agent ``agent``'s ``action`` has the form its role asks for (a boxed answer, a verdict): the
        rollouts of whole episodes can take a penalty off an invalid one (MAGRPO's ``invalid_penalty``, Dr. MAS's
        invalid-action penalty). Default: every action is valid."""
        return True

    def feedback(self, state: EnvState, actions: Sequence[str], score: Score) -> list[str]:
        """Each agent's next user message after a turn. Default: the turn's reward and its components."""
        parts = ", ".join(f"{k} {v:.2f}" for k, v in score.info.items())
        text = f"Turn {state.turn + 1} reward: {score.rewards[0]:.2f}" + (f" ({parts})" if parts else "")
        return [text + ". Revise your response." for _ in range(self.n_agents)]

    # -- the single-model baseline (collab.evaluation.baselines) ---------------------------------------------
    def single_agent_prompt(self, messages: Sequence[str], turn: int) -> str:
        """One user message asking a single model to do every role's part of a turn.

        ``messages[i]`` is role i's user message at ``turn`` (its observation at turn 0, the
        environment's feedback or next state later). Default: each role's system prompt (turn 0 only)
        and message under a ``### <header>`` line; a message every role shares is shown once, above
        the headers. The model is asked to answer with the same headers, which
        :meth:`split_single_response` reads back.
        """
        headers = role_headers(self.roles)
        shared = len(messages) > 1 and len(set(messages)) == 1
        parts = [
            f"You are one assistant doing the work of a team of {self.n_agents} agents "
            f"({', '.join(headers)})."
            + (" Their instructions follow." if turn == 0 else " Each part's feedback follows.")
        ]
        if shared:
            parts.append(messages[0])
        for role, header, message in zip(self.roles, headers, messages):
            body = [role.system_prompt] if turn == 0 and role.system_prompt else []
            body += [] if shared else [message]
            if body:
                parts.append(f"### {header}\n" + "\n\n".join(body))
        listing = ", ".join(f"### {h}" for h in headers)
        parts.append(f"Write every agent's part yourself, each after its own header line ({listing}), in that order.")
        return "\n\n".join(parts)

    def split_single_response(self, text: str) -> list[str]:
        """Role i's action from a single model's response: the text under role i's header.

        A header is a line holding only the role's header name, optionally with leading ``#``s,
        ``**`` bold markers and a trailing colon (``### concise``, ``**Concise:**``, ``concise:``;
        case-insensitive); its section runs to the next header (repeated headers are joined).
        Fallbacks: with no header at all, every role gets the whole response; with some headers
        found, a role whose header is missing gets the text before the first header (often empty).
        """
        headers = role_headers(self.roles)
        pattern = re.compile(
            r"^[ \t]*(?:#+[ \t]*)?(?:\*\*)?[ \t]*("
            + "|".join(re.escape(h) for h in headers)
            + r")[ \t]*(?:\*\*)?[ \t]*:?[ \t]*(?:\*\*)?[ \t]*$",
            re.I | re.M,
        )
        found = list(pattern.finditer(text))
        if not found:
            return [text] * self.n_agents
        lower = [h.lower() for h in headers]
        sections: dict[int, list[str]] = {}
        for m, nxt in zip(found, found[1:] + [None]):
            body = text[m.end() : nxt.start() if nxt else len(text)].strip("\n")
            sections.setdefault(lower.index(m.group(1).lower()), []).append(body.strip())
        preamble = text[: found[0].start()].strip()
        return ["\n\n".join(sections[i]) if i in sections else preamble for i in range(self.n_agents)]

    # -- sizes, before anything runs ----------------------------------------------------------------
    def prompt_tokens(self, first: int, turn: int, responses: Sequence[int]) -> int:
        """About how many tokens the longest agent's prompt holds at ``turn`` (0-based), its first prompt being
        ``first`` tokens and ``responses[i]`` agent i's longest response: what the start-of-run check counts a
        step's KV caches, token lists and time from (:mod:`collab.runtime.projection`), before any model is loaded.
        Default: the history keeps the agent's own responses and a feedback message of :data:`FEEDBACK_TOKENS`
        each turn (within :attr:`history_window`). An env whose feedback shows other agents' responses says so
        here (the debate: every agent's, so its prompts grow with the team)."""
        kept = turn if self.history_window is None else min(turn, self.history_window)
        return first + kept * (max(responses, default=0) + FEEDBACK_TOKENS)

    # -- bookkeeping ------------------------------------------------------------------------------
    def reset(self, task: Mapping[str, Any]) -> EnvState:
        observations = self.observe(task)
        histories = []
        for role, obs in zip(self.roles, observations, strict=True):
            messages: list[Message] = []
            if role.system_prompt:
                messages.append({"role": "system", "content": role.system_prompt})
            messages.append({"role": "user", "content": obs})
            histories.append(tuple(messages))
        return EnvState(task=task, histories=tuple(histories))

    def score_batch(self, states: Sequence[EnvState], actions: Sequence[Sequence[str]]) -> list[Score]:
        """:meth:`score` of many joint actions. Environments whose scoring runs programs override it to
        run them all at once (the coding env sends every test of a rollout depth to one sandbox pool)."""
        return [self.score(s, a) for s, a in zip(states, actions, strict=True)]

    def step(self, state: EnvState, actions: Sequence[str]) -> StepResult:
        """Score the joint action, append it (and, unless done, the feedback) to every history."""
        return self.step_batch([state], [actions])[0]

    def step_batch(self, states: Sequence[EnvState], actions: Sequence[Sequence[str]]) -> list[StepResult]:
        """:meth:`step` for many (state, joint action) pairs, scored by one :meth:`score_batch` call."""
        for state, joint in zip(states, actions, strict=True):
            assert not state.done, "step() on a finished episode"
            assert len(joint) == self.n_agents, f"expected {self.n_agents} actions, got {len(joint)}"
        scores = self.score_batch(states, actions)
        return [self._advance(s, a, sc) for s, a, sc in zip(states, actions, scores, strict=True)]

    def _advance(self, state: EnvState, actions: Sequence[str], score: Score) -> StepResult:
        done = score.terminated or state.turn + 1 >= self.horizon
        histories = self.next_histories(state, actions, score, done)
        rewards = tuple(float(r) + self.reward_shift for r in score.rewards)
        memory = {**state.memory, **score.memory, "last_reward": score.rewards[0], "last_rewards": tuple(score.rewards)}
        next_state = replace(state, histories=tuple(histories), turn=state.turn + 1, done=done, memory=memory)
        return StepResult(next_state, rewards, done, score.info, max(self.horizon - state.turn - 1, 0) if done else 0)

    def next_histories(
        self, state: EnvState, actions: Sequence[str], score: Score, done: bool
    ) -> list[tuple[Message, ...]]:
        """Each agent's history after a turn: its action appended, then (unless done) its feedback, cut to
        the last :attr:`history_window` turns."""
        histories = [h + ({"role": "assistant", "content": a},) for h, a in zip(state.histories, actions)]
        if not done:
            replies = self.feedback(state, actions, score)
            histories = [h + ({"role": "user", "content": r},) for h, r in zip(histories, replies)]
        return [window(h, self.history_window) for h in histories]


def window(history: tuple[Message, ...], turns: int | None) -> tuple[Message, ...]:
    """``history`` with its opening messages (everything before the first response) and only the last
    ``turns`` turns after them, a turn being a response and the feedback that follows it (a final
    response without feedback counts as a turn of its own). ``None`` keeps everything."""
    starts = [j for j, m in enumerate(history) if m["role"] == "assistant"]
    if turns is None or turns >= len(starts):
        return history
    return history[: starts[0]] + history[starts[-turns] :]
