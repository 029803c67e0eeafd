"""ClassEval's classes as their publisher ships them, and which agent writes which method.

The file is ``data/ClassEval_data.json`` of https://github.com/FudanSELab/ClassEval (the reference loads the hub's
copy, ``FudanSELab/ClassEval``, one split ``test``): a json list of 100 records that have
``task_id`` (``ClassEval_0``...), ``skeleton`` (the imports and the class: its docstring, each method's signature
and docstring, no bodies), ``test`` (unittest classes that use the class by name, run after it in one module),
``solution_code``, ``class_name``, ``methods_info`` and more. The reward reads ``skeleton`` and ``test`` only, as
the reference does; the task keeps ``solution_code`` when the record has it.

The methods to write and who writes each follow OpenMLRL/LLM_Collab_Code_Completion (read at 1b754a3), rules D1-D5:

- D1 (``utils/data.py``): the class is the first ``class NAME:`` in the skeleton (a regex: a class written with a
  base list, ``class A(B):``, is passed over);
- D2 (``utils/data.py``): its methods to write are its direct ``def``s whose body, after a docstring, is empty, one
  ``pass`` or one ``raise NotImplementedError(...)``; a skeleton that does not parse has none;
- D3 (``utils/data.py``): before D1 and D2, and in the prompt, smart quotes, dashes, the ellipsis, the no-break
  and zero-width spaces become ASCII; the merge uses the skeleton as written;
- D4 (``train/strategies.py``, ``ParamCountStrategy``): a method whose signature has one parameter (``self``) goes
  to the first agent, every other to the second; a third agent would get none, so this partition takes 2 agents;
- D5 (``train/train_magrpo.py``): the splits are slices of the 100 records, train ``[:66]`` and eval ``[66:82]``
  (``configs/magrpo_classeval_config.yaml``).

``partition: round_robin`` is collab's, for teams of 2-8 (the reference has no other partition): the methods dealt in
skeleton order, the k-th to agent k mod n.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from collab.envs.published import read_published, split_source
from collab.envs.records import packaged
from collab.errors import UserError

__all__ = ["PARTITIONS", "assign", "class_name", "load_classes", "methods", "param_counts", "sanitize"]

PARTITIONS = ("params", "round_robin")
EXAMPLE = "classeval_example.json"
"""collab's own three small classes in ClassEval's format (none is a ClassEval record), the default data."""

_ASCII = str.maketrans(
    {"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'", "\u2013": "-", "\u2014": "-", "\u2026": "..."}
    | {"\u00a0": " ", "\u200b": None}
)
_CLASS = re.compile(r"\bclass\s+([A-Za-z_][A-Za-z0-9_]*)\s*:\s*")


def sanitize(text: str) -> str:
    """D3."""
    return text.translate(_ASCII)


def class_name(skeleton: str) -> str | None:
    """D1 (on the sanitized skeleton)."""
    found = _CLASS.search(sanitize(skeleton))
    return found.group(1) if found else None


def _class_node(skeleton: str) -> ast.ClassDef | None:
    name = class_name(skeleton)
    try:
        tree = ast.parse(sanitize(skeleton))
    except Exception:  # as the reference: a skeleton that does not parse has no method
        return None
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _unwritten(body: list[ast.stmt]) -> bool:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]
    if not body:
        return True
    if len(body) != 1:
        return False
    stmt = body[0]
    return isinstance(stmt, ast.Pass) or (
        isinstance(stmt, ast.Raise)
        and isinstance(stmt.exc, ast.Call)
        and getattr(stmt.exc.func, "id", None) == "NotImplementedError"
    )


def methods(skeleton: str) -> list[str]:
    """D2: the class's methods to write, in skeleton order (``async def`` ones are not: the reference skips them)."""
    node = _class_node(skeleton)
    if node is None:
        return []
    return [f.name for f in node.body if isinstance(f, ast.FunctionDef) and _unwritten(f.body)]


def param_counts(skeleton: str) -> dict[str, int]:
    """D4's counts: every parameter of each method, ``self``, ``*args`` and ``**kwargs`` included."""
    node = _class_node(skeleton)
    counts = {}
    for f in node.body if node else []:
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = f.args
            counts[f.name] = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None)
            counts[f.name] += a.kwarg is not None
    return counts


def assign(skeleton: str, agents: int, partition: str) -> tuple[tuple[str, ...], ...]:
    """Each agent's methods: D4 (``params``) or collab's ``round_robin``."""
    names = methods(skeleton)
    if partition == "params":
        counts = param_counts(skeleton)
        owner = [0 if counts.get(m, -1) == 1 else 1 for m in names]
    else:
        owner = [k % agents for k in range(len(names))]
    return tuple(tuple(m for m, o in zip(names, owner) if o == i) for i in range(agents))


def load_classes(dataset: str | None) -> list[dict[str, Any]]:
    """The records of ``dataset`` (``PATH`` or ``classeval:PATH``; None: collab's example), checked: each needs
    ``task_id`` and the strings ``skeleton`` and ``test``."""
    path = str(packaged(EXAMPLE)) if dataset is None else split_source(dataset, ("classeval",))[1]
    records = read_published("classeval", path)
    head = f"ClassEval ({path})"
    if not records:
        raise UserError(f"{head}: the file holds no record; expected a .json list of ClassEval's records")
    tasks = []
    for i, r in enumerate(records):
        bad = next((f for f in ("skeleton", "test") if not isinstance(r[f], str)), None)
        if bad is not None:
            raise UserError(
                f"{head}: record {i} ({r['task_id']}) has a {type(r[bad]).__name__} as {bad!r}; expected a string "
                "of Python source, as ClassEval_data.json has"
            )
        tasks.append(
            {
                "task_id": str(r["task_id"]),
                "class_name": class_name(r["skeleton"]) or "",
                "skeleton": r["skeleton"],
                "test": r["test"],
                "solution_code": r.get("solution_code"),
            }
        )
    return tasks
