"""The exact-match reward of Search-R1's question answering, as Dr. MAS scores its search task (its vendored SkyRL
search env, whose ``compute_score`` is Search-R1's ``qa_em``; SkyRL ``skyrl_gym/envs/search/utils.py`` at 185caf6).

The answer is the last ``<answer> ... </answer>`` of the episode's text (every action and every search result, in
order), stripped; it scores 1 when, normalized, it equals one of the gold answers normalized (lowercased, ASCII
punctuation removed, the articles a / an / the removed as words, runs of white space made one space), 0 otherwise and
0 without an answer. An exact answer in a text that opens or closes more than 10 answer tags scores 1/4 (Search-R1's
guard against a response of repeated tags).
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
TAG_LIMIT = 10
"""Answer tags (opening or closing) a text may hold before an exact answer scores :data:`GUARDED`."""
GUARDED = 0.25


def normalize(text: str) -> str:
    """Lowercased, without punctuation and articles, its white space runs one space."""
    text = "".join(c for c in text.lower() if c not in string.punctuation)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def last_answer(text: str) -> str | None:
    """The last ``<answer>`` section's text, stripped; None when there is none."""
    found = ANSWER.findall(text)
    return found[-1].strip() if found else None


def exact_match(text: str, gold: Sequence[str]) -> float:
    """The episode text's reward against the gold answers (module docstring)."""
    answer = last_answer(text)
    if answer is None or normalize(answer) not in {normalize(g) for g in gold}:
        return 0.0
    if text.count("<answer>") > TAG_LIMIT or text.count("</answer>") > TAG_LIMIT:
        return GUARDED
    return 1.0
