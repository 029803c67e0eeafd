"""``search``: BM25 over a local corpus, the documents an env ships or a file the user names.

Okapi BM25 (Robertson and Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond", 2009, Eq. 3.15)
with Lucene's non-negative idf:

    score(q, d) = sum over query terms t of  idf(t) * f(t, d) * (k1 + 1) / (f(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t) = ln(1 + (N - n(t) + 0.5) / (n(t) + 0.5))

``f(t, d)``: the term's count in the document, ``|d|`` its length in terms, ``avgdl`` the corpus's mean length,
``N`` the documents, ``n(t)`` those holding ``t``; ``k1`` 1.5 and ``b`` 0.75 (the usual values). Terms are the
lowercased runs of letters and digits. A query term counts once however often the query repeats it. Ties keep the
corpus's order. The result lists the best ``k`` documents (default 3), each ``[i] title: text``, cut to
``max_chars`` characters in all.

A corpus is a list of ``{"title", "text"}`` records, or a file: JSON lines with those fields, or plain text whose
documents are separated by blank lines (the title is then the document's first line).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

from collab.errors import UserError
from collab.tools.base import Tool

TERM = re.compile(r"[^\W_]+")
K1, B = 1.5, 0.75


def terms(text: str) -> list[str]:
    return TERM.findall(text.lower())


def read_corpus(path: str | Path) -> list[dict[str, str]]:
    """The documents of a corpus file (JSON lines of title and text, or blank-line-separated text)."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(
            f"search corpus {path}: {e.strerror or e}; give a file of JSON lines "
            '({"title": ..., "text": ...}) or of documents separated by blank lines'
        ) from None
    if path.suffix in (".jsonl", ".json"):
        docs = []
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                docs.append({"title": str(record.get("title", "")), "text": str(record["text"])})
            except (ValueError, KeyError, AttributeError):
                raise UserError(f"search corpus {path}, line {n}: not a JSON object with a 'text' field") from None
        return docs
    blocks = [b.strip() for b in re.split(r"\n\s*\n", raw) if b.strip()]
    return [{"title": b.splitlines()[0], "text": b} for b in blocks]


class BM25:
    """An index of ``docs`` (their titles and texts) for :meth:`scores` and :meth:`top`."""

    def __init__(self, docs: list[dict[str, str]], k1: float = K1, b: float = B) -> None:
        self.docs, self.k1, self.b = docs, k1, b
        self.counts = [Counter(terms(f"{d.get('title', '')} {d['text']}")) for d in docs]
        self.lengths = [sum(c.values()) for c in self.counts]
        self.avgdl = sum(self.lengths) / max(len(docs), 1)
        held = Counter(t for c in self.counts for t in c)
        n = len(docs)
        self.idf = {t: math.log(1 + (n - m + 0.5) / (m + 0.5)) for t, m in held.items()}

    def scores(self, query: str) -> list[float]:
        out = []
        for counts, length in zip(self.counts, self.lengths):
            norm = self.k1 * (1 - self.b + self.b * length / self.avgdl) if self.avgdl else self.k1
            out.append(
                sum(
                    self.idf[t] * counts[t] * (self.k1 + 1) / (counts[t] + norm)
                    for t in set(terms(query))
                    if t in counts
                )
            )
        return out

    def top(self, query: str, k: int) -> list[int]:
        """Indices of the ``k`` best documents with a positive score, best first (ties: corpus order)."""
        scores = self.scores(query)
        ranked = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: (-scores[i], i))
        return ranked[:k]


class Search(Tool):
    name = "search"
    description = "Search the local documents; returns the best matches' titles and texts."
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "words to look for"},
            "k": {"type": "integer", "description": "how many documents (default 3)"},
        },
        "required": ["query"],
    }

    def __init__(self, corpus: list[dict[str, str]] | str | Path, max_k: int = 5, max_chars: int = 1500) -> None:
        """``corpus``: the documents, or a file of them (:func:`read_corpus`); ``max_k``: most documents a call
        returns; ``max_chars``: the result's length in characters."""
        docs = read_corpus(corpus) if isinstance(corpus, (str, Path)) else list(corpus)
        self.index, self.max_k, self.max_chars = BM25(docs), max_k, max_chars

    def run(self, arguments: dict[str, Any]) -> str:
        query = self.argument(arguments, "query", str)
        k = min(max(self.argument(arguments, "k", int, 3), 1), self.max_k)
        found = self.index.top(query, k)
        if not found:
            return "no document matches"
        text = "\n".join(
            f"[{n}] {self.index.docs[i].get('title', '')}: {self.index.docs[i]['text']}" for n, i in enumerate(found, 1)
        )
        return text if len(text) <= self.max_chars else text[: self.max_chars] + " [truncated]"
