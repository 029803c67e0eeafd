"""What a turn's tool calls do to its step: counted in the step's info, and charged when the env says so.

With tools configured (:attr:`collab.envs.Env.tools`), every step's info gains ``tool_calls`` (the calls of the
turn, all agents) and ``tool_errors`` (those whose result was an ``error: ...``: a malformed call, an unknown tool,
a refused argument, a failed program), so that a run logs them as ``env/tool_calls`` and ``env/tool_errors``; an env
that can tell a right call (a ``right_call(task, use)`` method: the math env's, a result equal to the problem's
answer) adds ``tool_right``, the calls it judged right (``tool_right / tool_calls``: the fraction of right calls).
``call_penalty`` (an env option, 0 by default) is subtracted from the rewards for each call: from every agent's
reward for each of the team's calls under a joint reward (the team pays together), from the caller's own under
per-agent rewards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace


def charge_calls(step, joint: Sequence, env, task):
    """``step`` (a :class:`~collab.envs.base.StepResult`) with the calls of ``joint`` (the turn's completions on
    ``task``) counted, and charged at ``env.call_penalty`` each."""
    calls = [len(getattr(c, "tool_calls", ())) for c in joint]
    uses = [u for c in joint for u in getattr(c, "tool_calls", ())]
    errors = sum(u.result.startswith("error:") for u in uses)
    info = {**step.info, "tool_calls": float(sum(calls)), "tool_errors": float(errors)}
    right_call = getattr(env, "right_call", None)
    if callable(right_call):
        info["tool_right"] = float(sum(bool(right_call(task, u)) for u in uses))
    penalty = getattr(env, "call_penalty", 0.0)
    rewards = step.rewards
    if penalty and any(calls):
        charged = [sum(calls)] * len(calls) if env.joint_reward else calls
        rewards = tuple(r - penalty * n for r, n in zip(rewards, charged))
    return replace(step, rewards=rewards, info=info)
