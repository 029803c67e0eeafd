"""Math problems read from their publishers' files (:mod:`collab.envs.published`), as ``NAME:PATH``.

* ``marft:PATH`` — MARFT's benchmark files (https://github.com/jwliao-ai/MARFT,
  ``marft/envs/math/benchmarks/``): a .json list of ``{"problem", "final_answer"}`` (``MATH/train.json``, the
  7500 MATH training problems MARFT trains on; ``MATH/test.json``; ``cmath/cmath_test.json``; ``aime_2024``...);
* ``aime_1983_2024:PATH`` — ``AIME_Dataset_1983_2024.csv`` of the hub's ``di-zhang-fdu/AIME_1983_2024``
  (columns ``ID``, ``Year``, ``Problem Number``, ``Question``, ``Answer``, ``Part``), the set MARFT's main
  AIME experiment trains on;
* ``gsm8k:PATH`` — the hub's ``openai/gsm8k`` (``main/train-*.parquet``, ``main/test-*.parquet``: ``question``,
  ``answer`` with the final answer after ``####``);
* ``tinygsm:PATH`` — the hub's ``TinyGSM/TinyGSM`` (``question``, ``code``: a Python function
  ``simple_math_problem()`` that returns the answer), MAPoRL's training set (its first 12,800 problems).
  As in MAPoRL's code the answer is what the function returns, kept when it is a whole number; the code
  runs in the sandbox (:mod:`collab.sandbox`), and only for the problems a split selects
  (:func:`with_answers`), since the published set has millions.
* ``drmas_math:PATH`` — the parquet files Dr. MAS's ``examples/data_preprocess/drmas_math.py`` writes
  (``langfengQ/DrMAS``): each record's ``env_kwargs`` holds ``question``, ``ground_truth`` and ``data_source``
  (``dapo_filter`` for training; ``math500``, ``aime24``, ``aime25``, ``olympiadbench``, ``amc23``, ``minerva`` for
  test), the problems as its env reads them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from collab import sandbox
from collab.envs.math.datasets import DATASETS, _after_hashes, _record, is_path, load_dataset
from collab.envs.published import read_published, split_source

__all__ = ["NAMES", "is_source", "known", "load_source", "whole_number", "with_answers"]

NAMES = ("marft", "aime_1983_2024", "gsm8k", "tinygsm", "drmas_math")
CHUNK = 200
"""TinyGSM programs run per sandboxed process."""
_RUNNER = """
import io, json, signal, sys
def _stop(*_):
    raise TimeoutError
signal.signal(signal.SIGALRM, _stop)
out, real = [], sys.stdout
for code in json.load(sys.stdin):
    sys.stdout = io.StringIO()
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        scope = {}
        exec(code, scope)
        value = scope["simple_math_problem"]()
        out.append(value if isinstance(value, (int, float)) and not isinstance(value, bool) else None)
    except BaseException:
        out.append(None)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.stdout = real
real.write(json.dumps(out))
"""


def is_source(dataset: str) -> bool:
    """Whether ``dataset`` is ``NAME:PATH`` of a published math dataset."""
    return split_source(dataset, NAMES)[0] is not None


def load_source(dataset: str) -> list[dict[str, Any]]:
    """The records of ``NAME:PATH`` (module docstring), or of a packaged dataset or local file."""
    name, path = split_source(dataset, NAMES)
    if name is None:
        return load_dataset(dataset)
    rows = read_published(name, path)
    if name == "marft":
        return [_record(f"marft/{i}", "marft", r["problem"], str(r["final_answer"])) for i, r in enumerate(rows)]
    if name == "aime_1983_2024":
        return [
            _record(f"aime_1983_2024/{r.get('ID') or i}", "aime_1983_2024", r["Question"], str(r["Answer"]))
            for i, r in enumerate(rows)
        ]
    if name == "drmas_math":
        return [drmas_record(i, r["env_kwargs"]) for i, r in enumerate(rows)]
    if name == "gsm8k":
        return [_record(f"gsm8k/{i}", "gsm8k", r["question"], _after_hashes(r["answer"])) for i, r in enumerate(rows)]
    return [{**_record(f"tinygsm/{i}", "tinygsm", r["question"], ""), "code": r["code"]} for i, r in enumerate(rows)]


def drmas_record(index: int, kwargs: dict[str, Any]) -> dict[str, str]:
    """A record of Dr. MAS's preprocessed files: its env's question and ground truth, numbered within its source."""
    source = str(kwargs.get("data_source") or "drmas_math")
    return _record(f"drmas_math/{source}/{index}", source, str(kwargs["question"]), str(kwargs["ground_truth"]))


def whole_number(value: Any) -> str | None:
    """``"18"`` for 18 or 18.0, ``None`` for anything else (MAPoRL keeps whole-number answers only)."""
    if value is None or not math.isfinite(value) or float(value) != int(value):
        return None
    return str(int(value))


def run_programs(codes: Sequence[str]) -> list[Any]:
    """What each TinyGSM program's ``simple_math_problem()`` returns (``None``: an error, a timeout, no number)."""
    chunks = [list(codes[i : i + CHUNK]) for i in range(0, len(codes), CHUNK)]
    limits = sandbox.Limits(timeout_s=10.0 + 1.2 * CHUNK, max_output_bytes=1_000_000)
    results = sandbox.Pool(limits=limits).map([_RUNNER] * len(chunks), [json.dumps(c) for c in chunks])
    values: list[Any] = []
    for chunk, result in zip(chunks, results):
        try:
            got = json.loads(result.stdout) if result.ok else None
        except json.JSONDecodeError:
            got = None
        values += got if isinstance(got, list) and len(got) == len(chunk) else [None] * len(chunk)
    return values


def with_answers(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` with the answers of TinyGSM problems computed from their code; problems whose code gives no
    whole number are left out. Records that have an answer already pass unchanged."""
    pending = [i for i, r in enumerate(records) if "code" in r and not r["answer"]]
    if not pending:
        return records
    answers = dict(zip(pending, (whole_number(v) for v in run_programs([records[i]["code"] for i in pending]))))
    out = []
    for i, r in enumerate(records):
        if i not in answers:
            out.append(r)
        elif answers[i] is not None:
            out.append({**r, "answer": answers[i]})
    return out


def known(dataset: str) -> bool:
    """Whether ``dataset`` names math data: a packaged or generated set, a local file, or ``NAME:PATH``."""
    return dataset in DATASETS or is_path(dataset) or is_source(dataset)
