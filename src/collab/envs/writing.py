"""TLDR writing collaboration (paper 002, Sections 5 and E.1; reward F.1).

Two agents summarize the same Reddit-style post: agent 1 (``concise``) writes a short summary and
agent 2 (``detailed``) an elaborate one. The joint reward (max 3.0) is built in stages; a pair out
of band at a stage ends the episode with the reward earned so far:

1. structure: both completions 8-256 words -> +0.5, else stop;
2. length: character ratio detailed/concise in 1.6-3.2 -> +1.0, linear in 1.1-1.6 and 3.2-5.0, else stop;
3. uniqueness: ratio of unique non-stopword words (detailed / concise) >= 2.0 -> +0.5, linear in
   1.3-2.0, else stop;
4. style: 0.4*T + 0.6*J with T = min(0.6 ln(#categories + 1), 1) over 12 transition-word categories
   in the combined text and J = min(Jaccard of non-stopword vocabularies, 0.03) / 0.03.

Transition words are matched as whole words and phrases (the reference implementation matches
substrings, so "so" counted inside "also"; see DESIGN.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from collab.envs.base import AgentRole, Env, EnvState, Score
from collab.envs.records import load_records, packaged, select
from collab.errors import UserError

WORD_RE = re.compile(r"[a-z']+")
MIN_WORDS, MAX_WORDS = 8, 256
MAX_REWARD = 3.0

STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be been before being below between
both but by can could did do does doing down during each few for from further had has have having he
her here hers him his how i i'm i've if in into is it it's its itself just me more most my myself no
nor not now of off on once only or other our ours out over own same she should so some such than that
the their them then there these they this those through to too under until up very was we were what
when where which while who whom why will with would you your yours don't didn't can't won't
""".split())

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


# -- measurements -------------------------------------------------------------------------------------
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


# -- reward bands (None = out of band: the episode terminates) ----------------------------------------
def structure_reward(n_concise: int, n_detailed: int) -> float | None:
    """Paper 002 F.1 structure / DESIGN.md: both completions 8-256 words -> 0.5, else stop (None)."""
    ok = all(MIN_WORDS <= n <= MAX_WORDS for n in (n_concise, n_detailed))
    return 0.5 if ok else None


def length_reward(ratio: float) -> float | None:
    """Paper 002 F.1 length ratio: 1.6-3.2 -> 1.0; linear 0->1 over 1.1-1.6 and 1->0 over 3.2-5.0; else None."""
    if 1.6 <= ratio <= 3.2:
        return 1.0
    if 1.1 <= ratio < 1.6:
        return (ratio - 1.1) / 0.5
    if 3.2 < ratio <= 5.0:
        return (5.0 - ratio) / 1.8
    return None


def uniqueness_reward(ratio: float) -> float | None:
    """Paper 002 F.1 unique-word ratio: >= 2.0 -> 0.5; linear 0->0.5 over 1.3-2.0; else None."""
    if ratio >= 2.0:
        return 0.5
    if ratio >= 1.3:
        return 0.5 * (ratio - 1.3) / 0.7
    return None


def transition_score(n_categories: int) -> float:
    """Paper 002 F.1 logical coherence: T = min(0.6 ln(#categories + 1), 1)."""
    return min(0.6 * math.log(n_categories + 1), 1.0)


def jaccard_score(similarity: float) -> float:
    """Paper 002 F.1 style consistency: J = min(Jaccard, 0.03) / 0.03."""
    return min(similarity, 0.03) / 0.03


def style_reward(n_categories: int, similarity: float) -> float:
    """DESIGN.md style term: 1.0 * (0.4 T + 0.6 J), in [0, 1]."""
    return 0.4 * transition_score(n_categories) + 0.6 * jaccard_score(similarity)


def measure(concise: str, detailed: str) -> dict[str, float]:
    """Every quantity the reward and the feedback look at."""
    return {
        "concise_words": len(words(concise)),
        "detailed_words": len(words(detailed)),
        "length_ratio": length_ratio(concise, detailed),
        "unique_ratio": unique_word_ratio(concise, detailed),
        "categories": len(transition_categories(concise + "\n" + detailed)),
        "jaccard": jaccard(vocabulary(concise), vocabulary(detailed)),
    }


def writing_reward(concise: str, detailed: str) -> tuple[float, bool, dict[str, float]]:
    """Total reward (max 3.0), whether it terminated early, and the per-stage components."""
    m = measure(concise, detailed)
    info = {"structure": 0.0, "length": 0.0, "uniqueness": 0.0, "style": 0.0}
    stages = [
        ("structure", lambda: structure_reward(int(m["concise_words"]), int(m["detailed_words"]))),
        ("length", lambda: length_reward(m["length_ratio"])),
        ("uniqueness", lambda: uniqueness_reward(m["unique_ratio"])),
        ("style", lambda: style_reward(int(m["categories"]), m["jaccard"])),
    ]
    terminated = False
    for key, stage in stages:
        value = stage()
        if value is None:
            terminated = True
            break
        info[key] = value
    info["total"] = sum(info.values())
    return info["total"], terminated, info


# -- the environment ----------------------------------------------------------------------------------
CONCISE_PROMPT = (
    "Create a concise summary response to this post.\nQuery: {prompt}\n"
    "Instructions: Provide a brief and focused summary in a few sentences"
)
DETAILED_PROMPT = (
    "Create a detailed summary response to this post.\nQuery: {prompt}\n"
    "Instructions: You should use transition words to improve flow"
)
HUB_TLDR = "trl-lib/tldr"


def _default_splits(n: int) -> tuple[str, str]:
    """Paper 002 C.1 splits, train [0:1000] and eval [1000:1100], clamped for files under 1100 records.

    A shorter file keeps its last tenth (at least 1, at most 100 records) for eval and the records
    before it (at most 1000) for train; a single-record file serves both splits.
    """
    if n >= 1100:
        return "[0:1000]", "[1000:1100]"
    if n <= 1:
        return "[:]", "[:]"
    n_eval = min(100, max(1, n // 10))
    return f"[:{min(1000, n - n_eval)}]", f"[{n - n_eval}:]"


def _load_hub(name: str, text_field: str) -> list[dict[str, Any]]:
    hint = "download it and pass a local .jsonl with a '" + text_field + "' field as dataset="
    try:
        import datasets
    except ImportError:
        raise UserError(f"dataset {name!r} needs the 'datasets' package, which is not installed; {hint}") from None
    try:
        data = datasets.load_dataset(name, split="train")
    except Exception as e:  # offline, unknown name, gated...: any failure is the user's to fix
        raise UserError(f"could not load dataset {name!r} from the Hugging Face hub ({type(e).__name__}); {hint}") from None
    records = [dict(r) for r in data]
    if records and text_field not in records[0]:
        raise UserError(f"hub dataset {name!r} has no {text_field!r} field (it has: {', '.join(sorted(records[0]))})")
    return records


class WritingEnv(Env):
    """Concise + detailed summaries of one post, scored by :func:`writing_reward` (joint reward)."""

    name = "writing"
    roles = (AgentRole("concise", max_new_tokens=64), AgentRole("detailed", max_new_tokens=128))
    reward_max = MAX_REWARD

    def __init__(
        self,
        horizon: int = 1,
        dataset: str | None = None,
        text_field: str = "prompt",
        train_split: str | None = None,
        eval_split: str | None = None,
    ) -> None:
        super().__init__(horizon)
        self.text_field = text_field
        if dataset is None:
            records = load_records(packaged("writing_corpus.jsonl"), required=[text_field])
            default_train, default_eval = f"[:{len(records) - 10}]", f"[{len(records) - 10}:]"
        else:
            if dataset == HUB_TLDR or dataset.startswith("hub:"):
                records = _load_hub(dataset.removeprefix("hub:"), text_field)
            else:
                records = load_records(dataset, required=[text_field])
            default_train, default_eval = _default_splits(len(records))
        self.splits = {
            "train": select(records, train_split or default_train),
            "eval": select(records, eval_split or default_eval),
        }

    def tasks(self, split: str) -> Sequence[Mapping[str, Any]]:
        if split not in self.splits:
            raise UserError(f"unknown split {split!r}; valid: eval, train")
        return self.splits[split]

    def observe(self, task: Mapping[str, Any]) -> list[str]:
        post = str(task[self.text_field]).strip()
        return [CONCISE_PROMPT.format(prompt=post), DETAILED_PROMPT.format(prompt=post)]

    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        total, terminated, info = writing_reward(actions[0], actions[1])
        return Score(rewards=(total, total), terminated=terminated, info=info)

    def feedback(self, state: EnvState, actions: Sequence[str], score: Score) -> list[str]:
        """Per agent: the measured bands, which one failed or was met, and what that agent should change."""
        m = measure(actions[0], actions[1])
        head = (f"Reward {score.rewards[0]:.2f} of {MAX_REWARD:.1f}. Your concise summary is {m['concise_words']} words; "
                f"the detailed one is {m['detailed_words']} words (each must be {MIN_WORDS}-{MAX_WORDS}).")
        concise, detailed = [head], [head]
        for n, notes in ((m["concise_words"], concise), (m["detailed_words"], detailed)):
            if not MIN_WORDS <= n <= MAX_WORDS:
                notes.append("Yours is out of range: " + ("write more." if n < MIN_WORDS else "cut it down."))
        if structure_reward(int(m["concise_words"]), int(m["detailed_words"])) is not None:
            r = m["length_ratio"]
            line = f"Length ratio {r:.2f} (target 1.6-3.2)"
            if r < 1.6:
                concise.append(line + ": make yours shorter.")
                detailed.append(line + ": make yours longer, with more detail.")
            elif r > 3.2:
                concise.append(line + ": add a little to yours.")
                detailed.append(line + ": trim yours.")
            else:
                concise.append(line + ": met.")
                detailed.append(line + ": met.")
            if length_reward(r) is not None:
                u = m["unique_ratio"]
                line = f"Unique-word ratio {u:.2f} (target >= 2.0)"
                if u < 2.0:
                    concise.append(line + ": keep yours focused on the key points.")
                    detailed.append(line + ": cover more distinct details in your own words.")
                else:
                    concise.append(line + ": met.")
                    detailed.append(line + ": met.")
                if uniqueness_reward(u) is not None:
                    k, j = int(m["categories"]), m["jaccard"]
                    line = f"Transition categories used {k} of 12 (5 or more is full); shared vocabulary {j:.3f} (target 0.03)."
                    concise.append(line + (" Reuse the key terms of the post." if j < 0.03 else ""))
                    detailed.append(line + (" Use more kinds of transition words." if k < 5 else "")
                                    + (" Reuse the key terms of the concise summary." if j < 0.03 else ""))
        return [" ".join(concise) + " Revise your summary.", " ".join(detailed) + " Revise your summary."]
