"""The TLDR writing reward (CoLLM Appendix F.1) in its two modes, ``paper`` and ``reference``.

:mod:`collab.envs.writing` documents every difference between the modes. This module holds the
measurements, the reward bands and the staged sum; a band function returns ``None`` for a pair out of
band, which stops the stages and terminates the episode.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from collab.errors import unknown

REWARD_MODES = ("paper", "reference")
WORD_RE = re.compile(r"[a-z']+")
MIN_WORDS, MAX_WORDS = 8, 256
MAX_REWARD = 3.0

STOPWORDS = frozenset(
    """
a about above after again against all am an and any are as at be been before being below between
both but by can could did do does doing down during each few for from further had has have having he
her here hers him his how i i'm i've if in into is it it's its itself just me more most my myself no
nor not now of off on once only or other our ours out over own same she should so some such than that
the their them then there these they this those through to too under until up very was we were what
when where which while who whom why will with would you your yours don't didn't can't won't
""".split()
)

TRANSITIONS: dict[str, tuple[str, ...]] = {
    "addition": ("also", "furthermore", "moreover", "additionally", "in addition", "besides", "as well as"),
    "contrast": ("however", "on the other hand", "in contrast", "nevertheless", "nonetheless", "whereas", "instead"),
    "cause": ("because", "since", "due to", "owing to", "given that", "as a result of"),
    "effect": ("therefore", "consequently", "as a result", "thus", "hence", "so", "accordingly"),
    "example": ("for example", "for instance", "such as", "namely", "to illustrate", "in particular"),
    "emphasis": ("indeed", "in fact", "certainly", "especially", "above all", "notably", "clearly"),
    "sequence": ("first", "firstly", "secondly", "then", "next", "finally", "afterwards", "meanwhile", "eventually"),
    "comparison": ("similarly", "likewise", "in the same way", "equally", "just as", "compared to"),
    "conclusion": ("in conclusion", "in summary", "to sum up", "overall", "in short", "ultimately", "all in all"),
    "condition": ("if", "unless", "provided that", "as long as", "in case", "otherwise"),
    "concession": ("although", "though", "even though", "admittedly", "despite", "in spite of", "even so"),
    "clarification": ("in other words", "that is", "to clarify", "to put it simply", "specifically", "put differently"),
}
_TRANSITION_RES = {
    cat: re.compile(r"\b(?:" + "|".join(r"\s+".join(map(re.escape, p.split())) for p in phrases) + r")\b", re.I)
    for cat, phrases in TRANSITIONS.items()
}

# -- the reference implementation's word lists (data from OpenMLRL/LLM_Collab_Writing, rewards/tldr_rewards.py)
REFERENCE_STOPWORDS = frozenset(
    """
a all also an and any are as at bad be been being both but by can could did do does each few first
for from good great had has have he her here him his how i if in is it its just last left little
long low many may me might more most much must my new no not now of old on only or other our own
right same shall should so some such than that the their them then there these they this those to
too us very was we were what when where which who why will with would you your
""".split()
)

_REFERENCE_TRANSITION_TEXT = {
    "elaboration": "furthermore, moreover, additionally, also, besides, in addition, what is more, not only, "
    "as well as, along with, coupled with, together with, likewise, similarly, equally important, by the same "
    "token, in the same way, correspondingly, in like manner, comparatively, analogously",
    "examples": "for example, for instance, specifically, particularly, namely, such as, including, especially, "
    "in particular, to illustrate, as an illustration, case in point, to demonstrate, as evidence, to exemplify, "
    "notably, markedly, chiefly, mainly, primarily, above all, most importantly",
    "explanation": "that is, in other words, to put it simply, to clarify, indeed, in fact, actually, clearly, "
    "obviously, to put it another way, to rephrase, more precisely, specifically speaking, what this means is, "
    "the point is, essentially, basically, fundamentally, at its core, in essence, simply put, stated differently",
    "cause_effect": "therefore, thus, consequently, as a result, hence, accordingly, for this reason, due to this, "
    "because of this, so, then, thereby, wherefore, thence, ergo, as a consequence, in consequence, "
    "it follows that, this leads to, this results in, this causes, this brings about, owing to, on account of, "
    "thanks to, resulting from",
    "contrast": "however, nevertheless, nonetheless, on the other hand, in contrast, while, whereas, although, "
    "even though, despite this, but, yet, still, conversely, on the contrary, rather, instead, alternatively, "
    "otherwise, in opposition, by contrast, contrarily, notwithstanding, regardless, all the same, even so, "
    "be that as it may, in any case, at any rate",
    "sequence": "first, second, third, next, then, after that, finally, lastly, initially, subsequently, meanwhile, "
    "to begin with, to start with, in the beginning, at first, at the outset, primarily, secondly, thirdly, "
    "following this, afterward, later, later on, in the meantime, simultaneously, concurrently, at the same time, "
    "in conclusion, to conclude, ultimately, in the end, to summarize, in summary",
    "emphasis": "indeed, certainly, surely, undoubtedly, without doubt, definitely, absolutely, positively, "
    "unquestionably, indubitably, of course, naturally, obviously, clearly, evidently, manifestly, undeniably, "
    "admittedly, granted, to be sure, in fact, as a matter of fact, notably, significantly",
    "summary": "in summary, in conclusion, to summarize, to conclude, in short, in brief, briefly, to sum up, "
    "on the whole, overall, all in all, in essence, essentially, basically, fundamentally, in the final analysis, "
    "after all, ultimately, in the end, when all is said and done, the bottom line is",
    "comparison": "similarly, likewise, in the same way, equally, just as, comparable to, in comparison, "
    "by the same token, correspondingly, in like manner, along the same lines, in similar fashion, analogously, "
    "by analogy, just like, much like, as with",
    "concession": "although, though, even though, while, whereas, despite, in spite of, regardless of, "
    "notwithstanding, admittedly, granted, even if, be that as it may, nevertheless, nonetheless, however, yet, "
    "still, all the same",
    "condition": "if, unless, provided that, assuming that, supposing that, in case, in the event that, "
    "on condition that, given that, as long as, so long as, only if, even if, whether or not, should, were, had, "
    "otherwise, or else",
    "time": "when, while, as, after, before, until, since, during, meanwhile, simultaneously, at the same time, "
    "concurrently, previously, formerly, earlier, later, afterward, subsequently, eventually, finally, recently, "
    "lately, nowadays, currently, presently, immediately",
}
REFERENCE_TRANSITIONS: dict[str, tuple[str, ...]] = {
    cat: tuple(text.split(", ")) for cat, text in _REFERENCE_TRANSITION_TEXT.items()
}
REFERENCE_WORD_RE = re.compile(r"\w+")


def check_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`REWARD_MODES`, else a :class:`~collab.errors.UserError`."""
    if mode not in REWARD_MODES:
        raise unknown("writing reward_mode", mode, REWARD_MODES)
    return mode


# -- measurements, paper mode ------------------------------------------------------------------------
def words(text: str) -> list[str]:
    """Lowercase words of ``text`` (regex ``[a-z']+``)."""
    return WORD_RE.findall(text.lower())


def vocabulary(text: str) -> set[str]:
    """The distinct non-stopword words of ``text`` (F.1: uniqueness and style exclude stopwords)."""
    return {w for w in words(text) if w not in STOPWORDS and w.strip("'")}


def length_ratio(concise: str, detailed: str) -> float:
    """Character-length ratio detailed / concise (whitespace-stripped; 0.0 for an empty concise)."""
    n = len(concise.strip())
    return len(detailed.strip()) / n if n else 0.0


def unique_word_ratio(concise: str, detailed: str) -> float:
    """Unique non-stopword words of detailed / of concise (0.0 when concise has none)."""
    n = len(vocabulary(concise))
    return len(vocabulary(detailed)) / n if n else 0.0


def transition_categories(text: str) -> set[str]:
    """The transition-word categories (of 12) with a whole-word/phrase match in ``text``."""
    return {cat for cat, pattern in _TRANSITION_RES.items() if pattern.search(text)}


def jaccard(a: set[str], b: set[str]) -> float:
    """|a & b| / |a | b| (0.0 for two empty sets)."""
    union = a | b
    return len(a & b) / len(union) if union else 0.0


# -- measurements, reference mode ---------------------------------------------------------------------
def reference_words(text: str) -> list[str]:
    """Lowercase ``\\w+`` runs of ``text``: digits count, an apostrophe splits ("don't" -> don, t)."""
    return REFERENCE_WORD_RE.findall(text.lower())


def reference_transition_categories(text: str) -> set[str]:
    """Categories with a phrase occurring anywhere in lowercased ``text``, inside words too ("so" in "also")."""
    lower = text.lower()
    return {cat for cat, phrases in REFERENCE_TRANSITIONS.items() if any(p in lower for p in phrases)}


def reference_jaccard(a: set[str], b: set[str]) -> float:
    """|a & b| / |a | b|, but 1.0 for two empty sets."""
    return len(a & b) / len(a | b) if a or b else 1.0


def _measure_reference(concise: str, detailed: str) -> dict[str, float]:
    n_chars, n_unique = len(concise), len(set(reference_words(concise)))
    content = [{w for w in reference_words(t) if w not in REFERENCE_STOPWORDS} for t in (concise, detailed)]
    return {
        "concise_words": len(concise.split()),
        "detailed_words": len(detailed.split()),
        "length_ratio": len(detailed) / n_chars if n_chars else 0.0,
        "unique_ratio": len(set(reference_words(detailed))) / n_unique if n_unique else 0.0,
        "categories": len(reference_transition_categories(detailed)),
        "jaccard": reference_jaccard(content[0], content[1]),
    }


def measure(concise: str, detailed: str, mode: str = "paper") -> dict[str, float]:
    """Every quantity the reward and the feedback look at, as ``mode`` measures it."""
    if check_mode(mode) == "reference":
        return _measure_reference(concise, detailed)
    return {
        "concise_words": len(words(concise)),
        "detailed_words": len(words(detailed)),
        "length_ratio": length_ratio(concise, detailed),
        "unique_ratio": unique_word_ratio(concise, detailed),
        "categories": len(transition_categories(concise + "\n" + detailed)),
        "jaccard": jaccard(vocabulary(concise), vocabulary(detailed)),
    }


# -- reward bands (None = out of band: the episode terminates) ----------------------------------------
def structure_reward(n_concise: int, n_detailed: int) -> float | None:
    """CoLLM F.1 structure: both completions 8-256 words -> 0.5, else stop (None)."""
    ok = all(MIN_WORDS <= n <= MAX_WORDS for n in (n_concise, n_detailed))
    return 0.5 if ok else None


def length_reward(ratio: float) -> float | None:
    """CoLLM F.1 length ratio: 1.6-3.2 -> 1.0; linear 0->1 over 1.1-1.6 and 1->0 over 3.2-5.0; else None."""
    if 1.6 <= ratio <= 3.2:
        return 1.0
    if 1.1 <= ratio < 1.6:
        return (ratio - 1.1) / 0.5
    if 3.2 < ratio <= 5.0:
        return (5.0 - ratio) / 1.8
    return None


def reference_length_reward(ratio: float) -> float | None:
    """:func:`length_reward`'s bands in the reference's floating-point arithmetic (spans as differences)."""
    if 1.6 <= ratio <= 3.2:
        return 1.0
    if 1.1 <= ratio < 1.6:
        return (ratio - 1.1) / (1.6 - 1.1)
    if 3.2 < ratio <= 5.0:
        return 1.0 - (ratio - 3.2) / (5.0 - 3.2)
    return None


def uniqueness_reward(ratio: float) -> float | None:
    """CoLLM F.1 unique-word ratio: >= 2.0 -> 0.5; linear 0->0.5 over 1.3-2.0; else None."""
    if ratio >= 2.0:
        return 0.5
    if ratio >= 1.3:
        return 0.5 * (ratio - 1.3) / 0.7
    return None


def reference_uniqueness_reward(ratio: float) -> float | None:
    """:func:`uniqueness_reward`'s bands in the reference's floating-point arithmetic."""
    if ratio >= 2.0:
        return 0.5
    if ratio >= 1.3:
        return (ratio - 1.3) / (2.0 - 1.3) * 0.5
    return None


def transition_score(n_categories: int) -> float:
    """CoLLM F.1 logical coherence: T = min(0.6 ln(#categories + 1), 1)."""
    return min(0.6 * math.log(n_categories + 1), 1.0)


def reference_transition_score(n_categories: int) -> float:
    """Reference coherence: 0 without transitions, else 0.4 + 0.05 per category past the first (<= 0.95)."""
    if n_categories <= 0:
        return 0.0
    return min(0.4 + min((n_categories - 1) * 0.05, 0.6), 1.0)


def jaccard_score(similarity: float) -> float:
    """CoLLM F.1 style consistency: J = min(Jaccard, 0.03) / 0.03."""
    return min(similarity, 0.03) / 0.03


def style_reward(n_categories: int, similarity: float) -> float:
    """CoLLM F.1 style term (the reference code's weights): 1.0 * (0.4 T + 0.6 J), in [0, 1]."""
    return 0.4 * transition_score(n_categories) + 0.6 * jaccard_score(similarity)


def reference_style_reward(n_categories: int, similarity: float) -> float:
    """The reference's style term 0.4 T + 0.6 J with its T (at most 0.98)."""
    return 0.4 * reference_transition_score(n_categories) + 0.6 * jaccard_score(similarity)


_BANDS: dict[
    str, tuple[Callable[[float], float | None], Callable[[float], float | None], Callable[[int, float], float]]
] = {
    "paper": (length_reward, uniqueness_reward, style_reward),
    "reference": (reference_length_reward, reference_uniqueness_reward, reference_style_reward),
}


def writing_reward(concise: str, detailed: str, mode: str = "paper") -> tuple[float, bool, dict[str, float]]:
    """Total reward (max 3.0), whether it terminated early, and the per-stage components."""
    m = measure(concise, detailed, mode)
    length, uniqueness, style = _BANDS[mode]
    info = {"structure": 0.0, "length": 0.0, "uniqueness": 0.0, "style": 0.0}
    stages = [
        ("structure", lambda: structure_reward(int(m["concise_words"]), int(m["detailed_words"]))),
        ("length", lambda: length(m["length_ratio"])),
        ("uniqueness", lambda: uniqueness(m["unique_ratio"])),
        ("style", lambda: style(int(m["categories"]), m["jaccard"])),
    ]
    return staged(stages, info)


def staged(
    stages: list[tuple[str, Callable[[], float | None]]], info: dict[str, float]
) -> tuple[float, bool, dict[str, float]]:
    """The stages in order, each adding its value to ``info`` (the per-stage components, zero until reached); a stage
    that returns None ends the episode with what was earned so far. Returns the total, whether it ended early, and
    ``info`` with the total."""
    terminated = False
    for key, stage in stages:
        value = stage()
        if value is None:
            terminated = True
            break
        info[key] = value
    info["total"] = sum(info.values())
    return info["total"], terminated, info
