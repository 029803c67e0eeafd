"""The format penalty of the MAPoRL reference code (paper 003's released training code): an answer is
malformed when it cannot be parsed, is too short, or repeats a run of tokens (its
``check_repeated_sequences``); MAPoRL (:mod:`collab.algos.maporl`) then gives it a fixed penalty instead of
its verifier reward."""

from __future__ import annotations


def repetitive(ids, max_repeats: int, max_len: int = 20, exempt=None) -> bool:
    """Whether a run of 1..``max_len`` tokens occurs more than ``max_repeats`` times back to back in ``ids`` (the
    reference code's ``check_repeated_sequences``: 20 and 3); ``exempt(run)`` true skips a run (it exempts runs
    that decode to digits: "1000000" is no repetition)."""
    ids = list(ids)
    n = len(ids)
    for length in range(1, min(max_len, n) + 1):
        for start in range(n - (max_repeats + 1) * length + 1):
            run, count, pos = ids[start:start + length], 1, start + length
            while pos + length <= n and ids[pos:pos + length] == run:
                count, pos = count + 1, pos + length
                if count > max_repeats:
                    if exempt is None or not exempt(run):
                        return True
                    break
    return False


def malformed(answer: str | None, completion_ids, min_tokens: int = 0, max_repeats: int | None = None,
              exempt=None) -> bool:
    """Whether an answer earns the format penalty: unparsable (``answer`` None; an empty response is), shorter than
    ``min_tokens`` tokens, or (with ``max_repeats``) :func:`repetitive`."""
    if answer is None or len(completion_ids) < min_tokens:
        return True
    return max_repeats is not None and repetitive(completion_ids, max_repeats, exempt=exempt)
