r"""MAGRPO's arXiv abstract expansion task: two agents expand one abstract into introduction content.

Agent 1 (``background``) writes the background and motivation of the work, agent 2 (``methods``) its
methodology and implications; each is told the other covers the rest. The joint reward (stated maximum
3.0) keeps the TLDR reward's four stages (structure, length, uniqueness, style) with the reference's bands
(docs/environments.md, *writing*); the reachable maximum is 2.98.

The MAGRPO paper (collab's copy: /work/shared/papers/001, a summary) names the task, "writing tasks
(summarization, expansion)", but states none of its prompts or numbers: every number here comes from the
reference implementation (OpenMLRL/LLM_Collab_Writing, ``rewards/arxiv_rewards.py``; prompts
``train_magrpo.py``; data ``data/create_arxiv_abstract.py``), whose config applies scale 1.0 and shift 0.0.
``reward_mode`` picks between the reference's stated rule and its code where the two disagree:

- ``paper`` (default): the rule as the reference states it (its docstring, its evaluation logger
  ``loggers/arxiv_logger.py``, and its code as first released with the paper), measured the way the TLDR
  paper mode measures (:mod:`collab.envs.writing.env`).
- ``reference``: exactly what ``arxiv_combined_reward`` computes today, quirks included.

Where the two modes differ, and why collab's default does: docs/fidelity.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from collab.envs.base import AgentRole
from collab.envs.writing.reward import (
    REFERENCE_STOPWORDS,
    check_mode,
    jaccard,
    length_ratio,
    reference_jaccard,
    reference_transition_categories,
    reference_transition_score,
    reference_words,
    staged,
    transition_categories,
    unique_word_ratio,
    vocabulary,
)

MIN_TOKENS, MAX_TOKENS = 128, 256
MAX_REWARD = 3.0
JACCARD_CAP = 0.23
TEXT_FIELD = "abstract_text"
"""The abstract's field in the hub's OpenMLRL/arXiv_abstract (beside ``article_id`` and ``token_count``)."""

ROLES = (AgentRole("background", max_new_tokens=256), AgentRole("methods", max_new_tokens=256))
"""256 new tokens each: the reference config's max_new_tokens, room for the 128-256 tokens of stage 1."""

_ASK = "Write part of the introduction section of the paper with the abstract below.\nAbstract:\n{abstract}\n"
BACKGROUND_PROMPT = _ASK + (
    "Your part: the background of this work and its motivation. A second writer covers the methodology "
    "and its implications; leave those to them."
)
METHODS_PROMPT = _ASK + (
    "Your part: the methodology of this work and its implications. A second writer covers the background "
    "and the motivation; leave those to them."
)


@dataclass(frozen=True)
class Band:
    """A ratio's reward: ``full`` in [lo, hi], rising linearly from 0 at ``low`` to ``full`` at ``lo`` and
    falling from ``full`` at ``hi`` to 0 at ``high``; out of band (``None``: stop) outside [low, high]."""

    low: float
    lo: float
    hi: float
    high: float
    full: float

    def __call__(self, ratio: float) -> float | None:
        # the reference's expressions, term for term: its values to the last bit
        if self.lo <= ratio <= self.hi:
            return self.full
        if self.low <= ratio < self.lo:
            return self.full * (ratio - self.low) / (self.lo - self.low)
        if self.hi < ratio <= self.high:
            return self.full * (1.0 - (ratio - self.hi) / (self.high - self.hi))
        return None


LENGTH_BANDS = {"paper": Band(0.8, 1.0, 1.3, 1.5, 1.0), "reference": Band(0.8, 1.3, 1.6, 2.0, 1.0)}
UNIQUENESS_BAND = Band(0.5, 0.7, 1.3, 1.7, 0.5)


def tokens(text: str) -> int:
    """Whitespace-separated tokens of ``text`` (the reference's count, and the dataset's)."""
    return len(text.split())


def measure(background: str, methods: str, mode: str = "paper") -> dict[str, float]:
    """Every quantity the reward and the feedback look at, as ``mode`` measures it."""
    if check_mode(mode) == "reference":
        n_chars = len(background)
        unique = [set(reference_words(t)) for t in (background, methods)]
        content = [u - REFERENCE_STOPWORDS for u in unique]
        ratio = len(methods) / n_chars if n_chars else 0.0
        unique_ratio = len(unique[1]) / len(unique[0]) if unique[0] else 0.0
        categories = reference_transition_categories(background + methods)
        similarity = reference_jaccard(content[0], content[1])
    else:
        ratio = length_ratio(background, methods)
        unique_ratio = unique_word_ratio(background, methods)
        categories = transition_categories(background + "\n" + methods)
        similarity = jaccard(vocabulary(background), vocabulary(methods))
    return {
        "background_tokens": tokens(background),
        "methods_tokens": tokens(methods),
        "length_ratio": ratio,
        "unique_ratio": unique_ratio,
        "categories": len(categories),
        "jaccard": similarity,
    }


def structure_reward(n_background: int, n_methods: int) -> float | None:
    """Both completions 128-256 tokens -> 0.5, else stop (None)."""
    return 0.5 if all(MIN_TOKENS <= n <= MAX_TOKENS for n in (n_background, n_methods)) else None


def jaccard_score(similarity: float) -> float:
    """J = min(Jaccard, 0.23) / 0.23."""
    return min(similarity, JACCARD_CAP) / JACCARD_CAP


def style_reward(n_categories: int, similarity: float) -> float:
    """0.4 T + 0.6 J, T = 0 without transitions, else 0.4 + 0.05 per category past the first (<= 0.95)."""
    return 0.4 * reference_transition_score(n_categories) + 0.6 * jaccard_score(similarity)


def arxiv_reward(background: str, methods: str, mode: str = "paper") -> tuple[float, bool, dict[str, float]]:
    """Total reward (stated maximum 3.0), whether it terminated early, and the per-stage components."""
    m = measure(background, methods, mode)
    stages = [
        ("structure", lambda: structure_reward(int(m["background_tokens"]), int(m["methods_tokens"]))),
        ("length", lambda: LENGTH_BANDS[mode](m["length_ratio"])),
        ("uniqueness", lambda: UNIQUENESS_BAND(m["unique_ratio"])),
        ("style", lambda: style_reward(int(m["categories"]), m["jaccard"])),
    ]
    # the total sums 0.5 + length + uniqueness + style, in the reference's order
    return staged(stages, {"structure": 0.0, "length": 0.0, "uniqueness": 0.0, "style": 0.0})


def feedback(background: str, methods: str, mode: str, total: float) -> list[str]:
    """Per agent: the measured bands, which one failed or was met, and what that agent should change."""
    m = measure(background, methods, mode)
    head = (
        f"Reward {total:.2f} of {MAX_REWARD:.1f}. The background part is {m['background_tokens']} words; "
        f"the methods part is {m['methods_tokens']} words (each must be {MIN_TOKENS}-{MAX_TOKENS})."
    )
    notes: tuple[list[str], list[str]] = ([head], [head])
    for n, own in zip((m["background_tokens"], m["methods_tokens"]), notes):
        if not MIN_TOKENS <= n <= MAX_TOKENS:
            own.append("Yours is out of range: " + ("write more." if n < MIN_TOKENS else "cut it down."))
    if structure_reward(int(m["background_tokens"]), int(m["methods_tokens"])) is not None:
        band = LENGTH_BANDS[mode]
        _compare(notes, f"Length ratio methods/background {m['length_ratio']:.2f}", m["length_ratio"], band, "longer")
        if band(m["length_ratio"]) is not None:
            u = m["unique_ratio"]
            _compare(notes, f"Unique-word ratio methods/background {u:.2f}", u, UNIQUENESS_BAND, "more varied")
            if UNIQUENESS_BAND(u) is not None:
                k, j = int(m["categories"]), m["jaccard"]
                line = f"Transition categories used: {k} of 12; shared vocabulary {j:.3f} (target {JACCARD_CAP})."
                for own in notes:
                    own.append(
                        line
                        + (" Use more kinds of transition words." if k < 12 else "")
                        + (" Reuse the abstract's key terms." if j < JACCARD_CAP else "")
                    )
    return [" ".join(own) + " Revise your part." for own in notes]


def _compare(notes: tuple[list[str], list[str]], line: str, ratio: float, band: Band, more: str) -> None:
    """A ratio methods/background against ``band``: below it the methods part should be ``more``, above it the
    background part."""
    line += f" (target {band.lo}-{band.hi})"
    if ratio < band.lo:
        notes[0].append(line + ".")
        notes[1].append(line + f": make yours {more}.")
    elif ratio > band.hi:
        notes[0].append(line + f": make yours {more}.")
        notes[1].append(line + ".")
    else:
        for own in notes:
            own.append(line + ": met.")
