"""Search-based question answering over a local corpus: Dr. MAS's search task (arXiv 2602.08847; ``langfengQ/DrMAS``
at 55668d2: its search orchestra and the SkyRL search env it vendors), with collab's BM25 ``search`` tool
(:mod:`collab.tools.search`) as the search engine.

Each turn the team either searches or answers. With ``team: orchestra`` (Dr. MAS's three agents,
``agent_system/agent/orchestra/search``) the **verifier** says whether what was found so far answers the question
(``<verify>yes</verify>`` or ``<verify>no</verify>``); on yes the **answerer**'s response is the team's action,
otherwise the **searcher**'s. In Dr. MAS only the routed agent then writes; here every agent writes each turn (collab's
turns are joint actions) and the env plays the routed one: a verifier without a verdict routes to the searcher.
With ``team: solo`` one agent searches or answers (SkyRL's and Search-R1's single agent).

The team's action ends the episode when it holds ``<answer>`` and ``</answer>``, and the horizon (the reference's
``max_turns``) ends it too. Otherwise its first ``<search> ... </search>`` is run against the corpus and the best
``top_k`` documents come back as ``<information> ... </information>`` in every agent's next prompt, which restates the
question with every search so far and its result (Dr. MAS rebuilds its prompt from its memory each step; here an
agent's history is its system prompt and that one message). An action with neither gets "no search query" back
(the reference runs its tool on a missing query and shows the error). The reward is 0 until the end, then Search-R1's
exact match of the last answer in the episode's text against the gold answers
(:func:`collab.envs.search_qa.reward.exact_match`), the team's joint reward.

Data: questions as JSON lines (or any format of :func:`collab.envs.records.load_records`) with ``question`` and
``golden_answers`` (a list, or one string), FlashRAG's and Search-R1's fields; a corpus as JSON lines of ``title`` and
``text`` (:func:`collab.tools.search.read_corpus`) or of ``contents``, the Wikipedia corpus of Search-R1 and FlashRAG
(its first line the title, in quotes). collab ships a small example (``collab/data/search_qa``: docs/environments.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from collab.envs.base import AgentRole, Env, EnvState, Message, Score
from collab.envs.records import load_records, packaged
from collab.envs.search_qa.reward import exact_match
from collab.errors import UserError, require
from collab.tools.search import BM25, read_corpus

TEAMS = ("orchestra", "solo")
SEARCH = re.compile(r"<search>(.*?)</search>", re.DOTALL)
VERDICT = re.compile(r"<verify>\s*(yes|no)\s*</verify>", re.IGNORECASE)
NO_QUERY = "no search query: write a query between search tags to search, or the answer between answer tags"
"""What an action with neither a query nor an answer gets back (no tags: the transcript's answer stays the team's)."""

TASK = (
    "Question: {question}\n\nYour team answers it in steps: at each step it either searches a collection of "
    "documents or gives its final answer."
)
ROLES = {
    "verifier": (
        "You check whether the documents found so far are enough to answer the question. Think briefly, then write "
        "<verify>yes</verify> if they are, <verify>no</verify> if another search is needed."
    ),
    "searcher": (
        "You look for the facts the question needs. Write one search query as <search> words to look for </search> "
        "and nothing else."
    ),
    "answerer": (
        "You answer the question from the documents found. Write the answer alone, a few words, as "
        "<answer> the answer </answer>."
    ),
    "agent": (
        "You answer questions using a search engine over a collection of documents. At each step write either one "
        "query as <search> words to look for </search> or, when you know it, the final answer alone as "
        "<answer> the answer </answer>."
    ),
}


def holds_contents(path: Path) -> bool:
    """Whether the first record of a JSON lines file has a ``contents`` field (the file read up to that line)."""
    if path.suffix != ".jsonl":
        return False
    with path.open(encoding="utf-8") as f:
        first = next((line for line in f if line.strip()), "")
    try:
        return "contents" in json.loads(first)
    except (ValueError, TypeError):  # not a JSON object: read_corpus says what is wrong, in one line
        return False


def read_documents(path: str | Path) -> list[dict[str, str]]:
    """A corpus: JSON lines of ``contents`` (Search-R1's and FlashRAG's Wikipedia: ``"Title"\\ntext``), else
    :func:`collab.tools.search.read_corpus`'s formats."""
    if holds_contents(Path(path)):
        docs = []
        for record in load_records(path, ["contents"]):
            title, _, text = str(record["contents"]).partition("\n")
            docs.append({"title": title.strip().strip('"'), "text": text.strip()})
        return docs
    return read_corpus(path)


class SearchQAEnv(Env):
    """Question answering with a search engine (module docstring)."""

    name = "search_qa"
    reward_max = 1.0

    def __init__(
        self,
        dataset: str | None = None,
        corpus: str | None = None,
        eval_dataset: str | None = None,
        num_eval: int = 8,
        team: str = "orchestra",
        horizon: int = 4,
        top_k: int = 3,
        max_chars: int = 1200,
        max_new_tokens: int = 64,
    ) -> None:
        """
        Args:
            dataset: The questions (module docstring); default: the shipped example's.
            corpus: The documents searched; default: the shipped example's.
            eval_dataset: The held-out questions; default: the last ``num_eval`` of ``dataset``, the rest training.
            num_eval: Questions held out of ``dataset`` when no ``eval_dataset`` is given.
            team: ``orchestra`` (verifier, searcher, answerer: Dr. MAS) or ``solo`` (one agent).
            horizon: Turns of an episode (the reference's ``max_turns``).
            top_k: Documents a search returns.
            max_chars: Characters of a search's result at most.
            max_new_tokens: Each role's response length.
        """
        super().__init__(horizon)
        require(team in TEAMS, f"search_qa option team must be one of {', '.join(TEAMS)}, got {team!r}")
        counts = {"num_eval": num_eval, "top_k": top_k, "max_chars": max_chars, "max_new_tokens": max_new_tokens}
        for key, value in counts.items():
            require(type(value) is int and value >= 1, f"search_qa option {key} must be an integer >= 1, got {value!r}")
        self.team, self.top_k, self.max_chars, self.num_eval = team, top_k, max_chars, num_eval
        names = ("verifier", "searcher", "answerer") if team == "orchestra" else ("agent",)
        self.roles = tuple(AgentRole(n, ROLES[n], max_new_tokens) for n in names)
        self.sources = {"dataset": dataset or str(packaged("search_qa/questions.jsonl")), "eval_dataset": eval_dataset}
        corpus = corpus or str(packaged("search_qa/corpus.jsonl"))
        if not Path(corpus).is_file():
            raise UserError(f"search_qa corpus not found: {corpus}; give a JSON lines file of title and text")
        self.index = BM25(read_documents(corpus))
        self._splits: dict[str, list[dict[str, Any]]] = {}

    # -- tasks ---------------------------------------------------------------------------------------
    def tasks(self, split: str) -> Sequence[Mapping[str, Any]]:
        require(split in ("train", "eval"), f"unknown split {split!r}; valid: train, eval")
        if not self._splits:
            questions = self._questions(self.sources["dataset"])
            if self.sources["eval_dataset"] is None:
                require(
                    len(questions) > self.num_eval,
                    f"search_qa dataset holds {len(questions)} questions: give more than num_eval ({self.num_eval})",
                )
                self._splits = {"train": questions[: -self.num_eval], "eval": questions[-self.num_eval :]}
            else:
                self._splits = {"train": questions, "eval": self._questions(self.sources["eval_dataset"])}
        return self._splits[split]

    @staticmethod
    def _questions(path: str) -> list[dict[str, Any]]:
        out = []
        for i, record in enumerate(load_records(path, ["question", "golden_answers"])):
            gold = record["golden_answers"]
            gold = [gold] if isinstance(gold, str) else [str(g) for g in gold]
            out.append({"id": str(record.get("id", i)), "question": str(record["question"]), "golden_answers": gold})
        return out

    # -- a turn --------------------------------------------------------------------------------------
    def observe(self, task: Mapping[str, Any]) -> list[str]:
        return [self.prompt(task, ())] * self.n_agents

    def prompt(self, task: Mapping[str, Any], transcript: Sequence[str]) -> str:
        """The question, then every search so far and its result."""
        text = TASK.format(question=task["question"])
        if transcript:
            text += "\n\nWhat your team did so far:\n" + "\n".join(transcript)
        return text

    def action(self, actions: Sequence[str]) -> str:
        """The team's action: the one agent's, or the answerer's when the verifier says yes, else the searcher's."""
        if self.team == "solo":
            return actions[0]
        return actions[2] if self.answers(actions[0]) else actions[1]

    @staticmethod
    def answers(verifier: str) -> bool:
        """Whether the verifier routes the turn to the answerer (``<verify>yes</verify>``)."""
        verdict = VERDICT.search(verifier)
        return bool(verdict) and verdict.group(1).lower() == "yes"

    def played(self, state: EnvState, actions: Sequence[str]) -> tuple[bool, ...]:
        """The verifier and the agent it routes to: the reference's calls of a step."""
        if self.team == "solo":
            return (True,)
        yes = self.answers(actions[0])
        return (True, not yes, yes)

    def search(self, action: str) -> str:
        """What a non-final action gets back: the search's result in ``<information>`` tags, or :data:`NO_QUERY`."""
        query = SEARCH.search(action) if "<search>" in action and "</search>" in action else None
        if query is None:
            return NO_QUERY
        found = self.index.top(query.group(1), self.top_k)
        docs = "\n".join(
            f"Doc {n} ({self.index.docs[i]['title']}): {self.index.docs[i]['text']}" for n, i in enumerate(found, 1)
        )
        return f"\n<information>{(docs or 'no document matches')[: self.max_chars]}</information>\n"

    def score(self, state: EnvState, actions: Sequence[str]) -> Score:
        action = self.action(actions)
        transcript = list(state.memory.get("transcript", ()))
        answered = "<answer>" in action and "</answer>" in action
        searches = float(state.memory.get("searches", 0))
        if answered or state.turn + 1 >= self.horizon:
            reward = exact_match("".join([*transcript, action]), state.task["golden_answers"])
            info = {"solved": float(reward >= 1.0), "answered": float(answered), "searches": searches}
            return Score((reward,) * self.n_agents, terminated=answered, info=info)
        result = self.search(action)
        memory = {"transcript": (*transcript, action, result), "searches": searches + (result != NO_QUERY)}
        return Score((0.0,) * self.n_agents, info={"searches": memory["searches"]}, memory=memory)

    def feedback(self, state: EnvState, actions: Sequence[str], score: Score) -> list[str]:
        return [self.prompt(state.task, score.memory["transcript"])] * self.n_agents

    def next_histories(
        self, state: EnvState, actions: Sequence[str], score: Score, done: bool
    ) -> list[tuple[Message, ...]]:
        """Each agent's system prompt and the question restated with the searches so far (Dr. MAS's prompt of a
        step); the last turn's histories end with the agents' actions."""
        if done:
            return super().next_histories(state, actions, score, done)
        message = {"role": "user", "content": self.feedback(state, actions, score)[0]}
        return [(*h[:1], message) if h[0]["role"] == "system" else (message,) for h in state.histories]

    def prompt_tokens(self, first: int, turn: int, responses: Sequence[int]) -> int:
        """The question's prompt and, each turn, the team's action and a search result (``max_chars`` characters,
        counted a token each)."""
        return first + turn * (max(responses, default=0) + self.max_chars + 16)
