"""Flex-MG's dependency function D (MARFT, Section 3.1): which agents' actions an agent sees.

``D(a^i, a^j) = 1`` means agent j acts after, and conditioned on, agent i's action at the same step.
Agent j's observation is then its own history with the actions of every such agent i fused in by
concatenation: the last user message gets ``"{role of i}: {action of i}"`` appended for each i, in
agent order.

Agents act in index order (MARFT's MARFT is sequential; footnote 1 leaves general DAG rollouts to
future work), so an agent may depend only on agents before it. Agents whose parents have all acted
form one *level* and are sampled together in one batched ``generate`` call: the sequential chain
has n levels, the decentralized case (D = 0) one.

A dependency is ``"chain"`` (agent i sees agents 0..i-1: the default, MARFT's sequential decision-making),
``"none"`` (D = 0), ``"previous"`` (agent i-1 only), a list of parent lists (``[[], [0], [0, 1]]``), a list of
such lists, one per step (the last one repeats), or in Python any callable ``step -> parent lists``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Union

from collab.envs.base import Message
from collab.errors import UserError

Parents = list[list[int]]
DependencySpec = Union[str, Parents, list[Parents], Callable[[int], Parents]]
NAMED = ("chain", "none", "previous")


def named_parents(name: str, n: int) -> Parents:
    if name == "chain":
        return [list(range(i)) for i in range(n)]
    if name == "none":
        return [[] for _ in range(n)]
    if name == "previous":
        return [[i - 1] if i else [] for i in range(n)]
    raise UserError(
        f"unknown model.dependency {name!r}; valid: {', '.join(NAMED)}, or a list of parent lists per agent"
    )


def check_parents(parents: Parents, n: int, where: str = "") -> Parents:
    """Validate one step's parent lists: one list per agent, each parent an earlier agent."""
    if not isinstance(parents, list) or len(parents) != n or not all(isinstance(p, list) for p in parents):
        raise UserError(
            f"model.dependency{where}: expected {n} parent lists (one per agent, e.g. "
            f"{named_parents('chain', n)}), or one of {', '.join(NAMED)}; got {parents!r}"
        )
    for i, ps in enumerate(parents):
        for p in ps:
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < i:
                allowed = (
                    "no agent (agent 0 acts first: its list must be [])"
                    if i == 0
                    else ("agent 0 only" if i == 1 else f"agents 0..{i - 1} only")
                )
                raise UserError(
                    f"model.dependency{where}: agent {i} cannot depend on {p!r}; agents act in index order, "
                    f"so agent {i} may see {allowed}"
                )
    return [sorted(set(ps)) for ps in parents]


class Dependency:
    """D for a team of ``n`` agents, static or per step."""

    def __init__(self, spec: DependencySpec = "chain", n: int = 2) -> None:
        self.n = n
        if callable(spec):
            self._fn: Callable[[int], Parents] | None = spec
            self._steps: list[Parents] = []
        elif isinstance(spec, str):
            self._fn, self._steps = None, [named_parents(spec, n)]
        elif (
            isinstance(spec, list)
            and spec
            and all(isinstance(s, list) and s and all(isinstance(p, list) for p in s) for s in spec)
        ):
            # a list of per-step parent lists: its elements' elements are lists
            self._fn, self._steps = None, [check_parents(s, n, f" at step {t}") for t, s in enumerate(spec)]
        else:
            self._fn, self._steps = None, [check_parents(spec, n)]

    def parents(self, step: int) -> Parents:
        """Each agent's parents at ``step``: the agents whose actions it sees."""
        if self._fn is not None:
            return check_parents(self._fn(step), self.n, f" at step {step}")
        return self._steps[min(step, len(self._steps) - 1)]

    def matrix(self, step: int) -> list[list[int]]:
        """MARFT's D as a 0/1 matrix: ``D[i][j] = 1`` when agent j depends on agent i."""
        d = [[0] * self.n for _ in range(self.n)]
        for j, ps in enumerate(self.parents(step)):
            for i in ps:
                d[i][j] = 1
        return d

    def levels(self, step: int) -> list[list[int]]:
        """Agents grouped by when they can act: each group's parents all belong to earlier groups."""
        level: list[int] = []
        for ps in self.parents(step):
            level.append(1 + max((level[p] for p in ps), default=-1))
        return [[i for i in range(self.n) if level[i] == k] for k in range(max(level) + 1)]


def fuse(history: Sequence[Message], seen: Sequence[tuple[str, str]]) -> tuple[Message, ...]:
    """Agent's history with the ``(role, action)`` pairs it depends on appended to its last message."""
    if not seen:
        return tuple(history)
    last = history[-1]
    extra = "\n\n".join(f"{role}: {action.strip()}" for role, action in seen)
    return tuple(history[:-1]) + ({**last, "content": f"{last['content']}\n\n{extra}"},)
