r"""The writing environment: TLDR summaries (CoLLM, Sections 5 and E.1; reward F.1), or MAGRPO's arXiv expansion.

``task: tldr`` (the default) is described here; ``task: arxiv`` (two agents expand an arXiv abstract into
introduction content, chosen by ``dataset: arxiv:PATH`` too) has its prompts, bands and reward in
:mod:`collab.envs.writing.arxiv`. Two agents summarize the same Reddit-style post: agent 1 (``concise``)
writes a short summary and agent 2 (``detailed``) an elaborate one. The joint reward (max 3.0) is built
in stages; a pair out of band at a stage ends the episode with the reward earned so far:

1. structure: both completions 8-256 words -> +0.5, else stop;
2. length: character ratio detailed/concise in 1.6-3.2 -> +1.0, linear in 1.1-1.6 and 3.2-5.0, else stop;
3. uniqueness: ratio of unique non-stopword words (detailed / concise) >= 2.0 -> +0.5, linear in
   1.3-2.0, else stop;
4. style: 0.4*T + 0.6*J with T = min(0.6 ln(#categories + 1), 1) over 12 transition-word categories
   in the combined text and J = min(Jaccard of non-stopword vocabularies, 0.03) / 0.03.

``reward_mode`` (:mod:`collab.envs.writing.reward`): ``paper`` (default) the rules above as CoLLM F.1 states
them; ``reference`` what OpenMLRL/LLM_Collab_Writing's ``rewards/tldr_rewards.py`` computes (its TLDR config: scale
1.0, shift 0.0). Where they differ and why: docs/fidelity.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from collab.envs.base import AgentRole, Env, EnvState, Score
from collab.envs.published import read_published, split_source
from collab.envs.records import load_records, packaged, select
from collab.envs.writing import arxiv
from collab.envs.writing.reward import (  # noqa: F401  (re-exported: the reward's public names)
    MAX_REWARD,
    MAX_WORDS,
    MIN_WORDS,
    REFERENCE_STOPWORDS,
    REFERENCE_TRANSITIONS,
    REWARD_MODES,
    STOPWORDS,
    TRANSITIONS,
    check_mode,
    jaccard,
    jaccard_score,
    length_ratio,
    length_reward,
    measure,
    reference_jaccard,
    reference_length_reward,
    reference_style_reward,
    reference_transition_categories,
    reference_transition_score,
    reference_uniqueness_reward,
    reference_words,
    structure_reward,
    style_reward,
    transition_categories,
    transition_score,
    unique_word_ratio,
    uniqueness_reward,
    vocabulary,
    words,
    writing_reward,
)
from collab.errors import UserError

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
TASKS = ("tldr", "arxiv")
HUB_IDS = {"tldr": HUB_TLDR, "arxiv": "OpenMLRL/arXiv_abstract"}
TEXT_FIELDS = {"tldr": "prompt", "arxiv": arxiv.TEXT_FIELD}


def _default_splits(n: int) -> tuple[str, str]:
    """CoLLM C.1 splits, train [0:1000] and eval [1000:1100], clamped for files under 1100 records.

    A shorter file keeps its last tenth (at least 1, at most 100 records) for eval and the records
    before it (at most 1000) for train; a single-record file serves both splits.
    """
    if n >= 1100:
        return "[0:1000]", "[1000:1100]"
    if n <= 1:
        return "[:]", "[:]"
    n_eval = min(100, max(1, n // 10))
    return f"[:{min(1000, n - n_eval)}]", f"[{n - n_eval}:]"


def _load_hub(name: str, text_field: str, task: str) -> list[dict[str, Any]]:
    hint = f"download its files and pass dataset: {task}:PATH (or a local .jsonl with a '{text_field}' field)"
    try:
        import datasets
    except ImportError:
        raise UserError(f"dataset {name!r} needs the 'datasets' package, which is not installed; {hint}") from None
    try:
        data = datasets.load_dataset(name, split="train")
    except Exception as e:  # offline, unknown name, gated...: any failure is the user's to fix
        raise UserError(
            f"could not load dataset {name!r} from the Hugging Face hub ({type(e).__name__}); {hint}"
        ) from None
    records = [dict(r) for r in data]
    if records and text_field not in records[0]:
        raise UserError(f"hub dataset {name!r} has no {text_field!r} field (it has: {', '.join(sorted(records[0]))})")
    return records


EVAL_POSTS = 24
"""Posts of the packaged corpus held out for evaluation (the last ones; the first 40 train)."""


def _posts(source: str, text_field: str, task: str) -> list[dict[str, Any]]:
    """The records of ``tldr:PATH`` or ``arxiv:PATH`` (the publishers' files), a hub id, or a local json/jsonl
    file."""
    name, path = split_source(source, TASKS)
    if name is not None:
        return read_published(name, path)
    if source in HUB_IDS.values() or source.startswith("hub:"):
        return _load_hub(source.removeprefix("hub:"), text_field, task)
    return load_records(source, required=[text_field])


def _task(task: str | None, *sources: str | None) -> str:
    """``task``, or the one a ``NAME:PATH`` source names (``arxiv:`` -> arxiv), else tldr; a source of the other
    task's dataset is an error."""
    named = {split_source(s, TASKS)[0] for s in sources if s is not None} - {None}
    if task is None:
        task = "arxiv" if "arxiv" in named else "tldr"
    if task not in TASKS:
        raise UserError(f"unknown writing task {task!r}; valid: {', '.join(TASKS)}")
    wrong = sorted(named - {task})
    if wrong:
        raise UserError(
            f"the writing task {task!r} cannot read the {wrong[0]} dataset ({wrong[0]}:PATH): "
            f"pass task: {wrong[0]}, or the {task} dataset ({task}:PATH; docs/data.md)"
        )
    return task


class WritingEnv(Env):
    """Two agents write about one text, scored by a joint staged reward: ``task: tldr`` a concise and a
    detailed summary of a post (:func:`writing_reward`), ``task: arxiv`` two parts of an introduction from an
    abstract (:func:`collab.envs.writing.arxiv.arxiv_reward`)."""

    name = "writing"
    roles = (AgentRole("concise", max_new_tokens=64), AgentRole("detailed", max_new_tokens=128))
    reward_max = MAX_REWARD

    def __init__(
        self,
        horizon: int = 1,
        dataset: str | None = None,
        text_field: str | None = None,
        train_split: str | None = None,
        eval_split: str | None = None,
        reward_mode: str = "paper",
        eval_dataset: str | None = None,
        task: str | None = None,
    ) -> None:
        """``dataset``: ``None`` (the packaged posts), ``tldr:PATH`` (a file of the hub's ``trl-lib/tldr``, e.g.
        ``data/tldr/data/train-*.parquet``), ``arxiv:PATH`` (of the hub's ``OpenMLRL/arXiv_abstract``, e.g.
        ``data/arXiv_abstract/data/train-*.parquet``), a local json/jsonl path, or a hub id when ``datasets`` is
        installed. ``eval_dataset``: where the eval split comes from instead (the same forms; the reference code
        evaluates on TLDR's test split and on the abstracts' val split); each split then defaults to its whole
        file. ``task``: ``tldr`` or ``arxiv``; ``None``: arxiv when a dataset is ``arxiv:PATH``, else tldr.
        ``text_field``: the record's text (``None``: ``prompt`` for tldr, ``abstract_text`` for arxiv).
        ``reward_mode``: ``paper`` (the rule as stated) or ``reference`` (the reference code, quirks included);
        this module's docstring and :mod:`collab.envs.writing.arxiv`'s list their differences."""
        super().__init__(horizon)
        self.reward_mode = check_mode(reward_mode)
        self.task = _task(task, dataset, eval_dataset)
        self.text_field = text_field or TEXT_FIELDS[self.task]
        if self.task == "arxiv":
            self.roles = arxiv.ROLES
            self.reward_max = arxiv.MAX_REWARD
        if dataset is None:
            if self.task == "arxiv":
                raise UserError(
                    "the writing env's arxiv task has no packaged abstracts: pass dataset: arxiv:PATH, a file of "
                    f"the hub's {HUB_IDS['arxiv']} (docs/data.md)"
                )
            records = load_records(packaged("writing_corpus.jsonl"), required=[self.text_field])
            # the packaged 64 posts: the last 24 held out, so that a held-out mean has a usable standard error
            default_train, default_eval = f"[:{len(records) - EVAL_POSTS}]", f"[{len(records) - EVAL_POSTS}:]"
        else:
            records = _posts(dataset, self.text_field, self.task)
            default_train, default_eval = _default_splits(len(records))
        eval_records = records
        if eval_dataset is not None:
            eval_records, default_train, default_eval = _posts(eval_dataset, self.text_field, self.task), "[:]", "[:]"
        self.splits = {
            "train": select(records, train_split or default_train),
            "eval": select(eval_records, eval_split or default_eval),
        }

    def tasks(self, split: str) -> Sequence[Mapping[str, Any]]:
        if split not in self.splits:
            raise UserError(f"unknown split {split!r}; valid: eval, train")
        return self.splits[split]

    def observe(self, task: Mapping[str, Any]) -> list[str]:
        text = str(task[self.text_field]).strip()
        if self.task == "arxiv":
            return [arxiv.BACKGROUND_PROMPT.format(abstract=text), arxiv.METHODS_PROMPT.format(abstract=text)]
        return [CONCISE_PROMPT.format(prompt=text), DETAILED_PROMPT.format(prompt=text)]

    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        reward = arxiv.arxiv_reward if self.task == "arxiv" else writing_reward
        total, terminated, info = reward(actions[0], actions[1], self.reward_mode)
        return Score(rewards=(total, total), terminated=terminated, info=info)

    def feedback(self, state: EnvState, actions: Sequence[str], score: Score) -> list[str]:
        """Per agent: the measured bands, which one failed or was met, and what that agent should change."""
        if self.task == "arxiv":
            return arxiv.feedback(actions[0], actions[1], self.reward_mode, score.rewards[0])
        m = measure(actions[0], actions[1], self.reward_mode)
        head = (
            f"Reward {score.rewards[0]:.2f} of {MAX_REWARD:.1f}. Your concise summary is {m['concise_words']} words; "
            f"the detailed one is {m['detailed_words']} words (each must be {MIN_WORDS}-{MAX_WORDS})."
        )
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
                    full, used = (
                        (5, "used {k} of 12 (5 or more is full)")
                        if self.reward_mode == "paper"
                        else (12, "in the detailed summary {k} of 12 (more is better)")
                    )  # reference: +0.05 per category
                    line = f"Transition categories {used.format(k=k)}; shared vocabulary {j:.3f} (target 0.03)."
                    concise.append(line + (" Reuse the key terms of the post." if j < 0.03 else ""))
                    detailed.append(
                        line
                        + (" Use more kinds of transition words." if k < full else "")
                        + (" Reuse the key terms of the concise summary." if j < 0.03 else "")
                    )
        return [" ".join(concise) + " Revise your summary.", " ".join(detailed) + " Revise your summary."]
