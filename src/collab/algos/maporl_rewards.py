"""MAPoRL's reward of every answer of a debate, R(q, s_ta) (MAPoRL, Section 3.1, Definition 1, Tables 1-2).

The verifier's score of each answer, replaced by ``format_penalty`` where the answer is malformed (the
reference code's rule: :mod:`collab.envs.debate.penalties`), then Definition 1 on the penalised scores plus
the incentives of Tables 1 and 2 (:func:`collab.objectives.episode_rewards`), the expectation estimated by
the one sampled debate. Penalising before Definition 1 also lowers the earlier answers' influence terms, as
in the reference code.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from collab.envs.debate.penalties import penalise
from collab.objectives import episode_rewards
from collab.rollout.episodes import Episode


def answer_rewards(
    episodes: list[Episode],
    decode: Callable[[int, int, list[int]], str],
    gamma: float,
    incentives: dict[str, float],
    format_penalty: float | None,
    min_response_tokens: int,
    max_repeats: int | None,
) -> tuple[list[Tensor], float]:
    """Each episode's ``[T, A]`` rewards R(q, s_ta) (rows past an early stop: absorbing turns, not answers) and the
    share of malformed answers (0 without ``format_penalty``). ``decode(t, a, ids)``: the text of tokens of the
    agent acting as role a at turn t (the repetition check exempts runs that decode to digits)."""
    all_rewards, flagged = [], []
    for ep in episodes:
        memory = ep.state.memory
        scores = torch.tensor(memory["scores"], dtype=torch.float32)
        if format_penalty is not None:
            scores, flags = penalise(
                scores, memory["answers"], ep.completions, format_penalty, min_response_tokens, max_repeats, decode
            )
            flagged.append(flags.flatten())
        all_rewards.append(
            episode_rewards(scores, memory["answers"], memory["correct"], ep.steps[-1].turns_left, gamma, **incentives)
        )
    malformed = float(torch.cat(flagged).float().mean()) if flagged else 0.0
    return all_rewards, malformed
