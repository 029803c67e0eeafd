"""The format penalty of the MAPoRL reference code (MAPoRL's released training code).

MAPoRL's ``format_penalty`` (off by default: MAPoRL does not mention one). The reference code replaces
the verifier score of a malformed answer by ``penalty_reward_value`` (-10 in its configs) before its
Definition 1 (``ppov2_trainer_multi_different_model.py``, under ``non_eos_penalty``): an answer is
malformed when it is shorter than ``min_length`` tokens (its configs' ``min_output_length``: 50), holds a
run of 1-20 tokens repeated back to back more than 3 times (``check_repeated_sequences``; runs that decode
to digits are exempt), or, at every trained turn, has no ``\\boxed{}`` answer (after its own reformatting,
which boxes any answer it can parse, that is: the answer is unparsable). collab applies the same rule
(:func:`malformed`) with ``min_response_tokens`` (default 0) and ``max_repeats`` (default None: no
repetition check) to every answer (:mod:`collab.algos.maporl`), then Definition 1 on the penalised scores,
so the penalty also lowers earlier answers' influence terms, as in the reference.
"""

from __future__ import annotations


def repetitive(ids, max_repeats: int, max_len: int = 20, exempt=None) -> bool:
    """Whether a run of 1..``max_len`` tokens occurs more than ``max_repeats`` times back to back in ``ids`` (the
    reference code's ``check_repeated_sequences``: 20 and 3); ``exempt(run)`` true skips a run (it exempts runs
    that decode to digits: "1000000" is no repetition)."""
    ids = list(ids)
    n = len(ids)
    for length in range(1, min(max_len, n) + 1):
        for start in range(n - (max_repeats + 1) * length + 1):
            run, count, pos = ids[start : start + length], 1, start + length
            while pos + length <= n and ids[pos : pos + length] == run:
                count, pos = count + 1, pos + length
                if count > max_repeats:
                    if exempt is None or not exempt(run):
                        return True
                    break
    return False


def malformed(
    answer: str | None, completion_ids, min_tokens: int = 0, max_repeats: int | None = None, exempt=None
) -> bool:
    """Whether an answer earns the format penalty: unparsable (``answer`` None; an empty response is), shorter than
    ``min_tokens`` tokens, or (with ``max_repeats``) :func:`repetitive`."""
    if answer is None or len(completion_ids) < min_tokens:
        return True
    return max_repeats is not None and repetitive(completion_ids, max_repeats, exempt=exempt)


def own_ids(completion) -> list[int]:
    """The tokens the agent wrote (a tool's result inserted in its turn is not among them: collab.tools)."""
    own = getattr(completion, "own", None)
    ids = completion.completion_ids
    return list(ids) if own is None else [t for t, mine in zip(ids, own) if mine]


def penalise(
    scores, answers, completions, penalty: float, min_tokens: int = 0, max_repeats: int | None = None, decode=None
):
    """An episode's ``[t, A]`` verifier ``scores`` with every malformed answer's (:func:`malformed`) replaced by
    ``penalty``, and the ``[t, A]`` boolean flags. ``answers[t][a]``: the parsed answer (None: unparsable);
    ``completions[t][a]``: the response (its own tokens, :func:`own_ids`); ``decode(t, a, ids)``: the text of a
    token run of that agent's tokenizer (runs that decode to digits are exempt from the repetition check)."""
    import torch

    flags = torch.tensor(
        [
            [
                malformed(
                    answer,
                    own_ids(c),
                    min_tokens,
                    max_repeats,
                    exempt=None if decode is None else (lambda run, t=t, a=a: decode(t, a, run).strip().isdigit()),
                )
                for a, (answer, c) in enumerate(zip(answers[t], joint))
            ]
            for t, joint in enumerate(completions)
        ],
        dtype=torch.bool,
    )
    return torch.where(flags, torch.tensor(float(penalty)), scores), flags
