r"""The prompts of the collaborative debate (MAPoRL, Section 3.1; Du et al. 2024's debate format).

Turn 1: agent ``i`` reads ``[system prompt of agent i, question + instruction]``. Turn t+1: its
history is replaced by ``[system prompt of agent i, debate prompt]``, where the debate prompt is the
question followed by *every* agent's *whole* response of turns 1..t (MAPoRL's
s_(t+1)i = LLM_i(q ⊕_{j, t' <= t} s_t'j): the solutions are concatenated as they were written, not
reduced to their final answers), each headed ``[Round t', agentj]`` and the agent's own ones marked
``(you)``; then the request for an updated solution. Nothing else of the other agents (their
system prompts, the prompts they read) is shown. With one agent (self-correction, Madaan et al.)
the block holds the agent's own earlier solutions only.

Math questions ask for the final answer in ``\boxed{}`` (the ``math`` environment's instruction);
NLI questions ask for one label, boxed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from collab.envs.math.env import INSTRUCTION as MATH_INSTRUCTION

__all__ = ["MATH_INSTRUCTION", "agent_name", "debate_prompt", "first_prompt", "instruction", "system_prompt"]


def agent_name(agent: int) -> str:
    """``agent1``, ``agent2``... (0-based ``agent``)."""
    return f"agent{agent + 1}"


def system_prompt(agent: int, agents: int) -> str:
    """Agent ``agent``'s (0-based) system message in a debate of ``agents`` agents."""
    if agents == 1:
        return (
            "You are a careful problem solver. You answer questions, then re-read your own earlier "
            "solutions, find their mistakes and improve them."
        )
    return (
        f"You are {agent_name(agent)}, one of {agents} agents who solve each problem together in a debate. "
        "You read the other agents' solutions, point out their mistakes and yours, and give your best answer."
    )


def instruction(task: Mapping[str, Any]) -> str:
    """What the answer must look like: a boxed number for math, one boxed label for NLI."""
    labels = task.get("labels")
    if labels:
        options = ", ".join(labels[:-1]) + f" or {labels[-1]}"
        return (
            f"Does the premise entail the hypothesis? Reason briefly, then give exactly one label "
            f"({options}) within \\boxed{{}}."
        )
    return MATH_INSTRUCTION


def first_prompt(task: Mapping[str, Any]) -> str:
    """The turn-1 user message: the question and the answer instruction."""
    return f"{task['problem']}\n\n{instruction(task)}"


def debate_prompt(task: Mapping[str, Any], responses: Sequence[Sequence[str]], agent: int) -> str:
    """The user message of agent ``agent`` (0-based) at turn ``len(responses) + 1``.

    ``responses[t][j]`` is agent j's whole response at turn t+1.
    """
    agents = len(responses[0])
    blocks = []
    for t, joint in enumerate(responses):
        for j, text in enumerate(joint):
            if agents == 1:
                head = f"[Round {t + 1}, your solution]"
            else:
                head = f"[Round {t + 1}, {agent_name(j)}{' (you)' if j == agent else ''}]"
            blocks.append(f"{head}\n{text.strip() or '(empty response)'}")
    if agents == 1:
        intro = "These are your earlier solutions to this problem:"
        ask = "Check your solution step by step, correct any mistake and give an updated solution."
    else:
        intro = "These are the solutions to this problem from every agent so far, yours marked (you):"
        ask = (
            "Using the other agents' solutions as additional information, check their reasoning and "
            "yours, then give an updated solution."
        )
    body = "\n\n".join(blocks)
    return f"{task['problem']}\n\n{intro}\n\n{body}\n\n{ask} {instruction(task)}"
