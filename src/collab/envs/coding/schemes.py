"""Cooperation schemes between the auxiliary and the main coder (MAGRPO appendix, Appendix B).

MAGRPO appendix reports four schemes that emerge when an auxiliary agent writes ``aux(...)`` and a main
agent writes the problem's entry point, which may call it: B.1 *fallback* (Listing 1), B.2
*decorator* (Listing 2), B.3 *coordinator* (Listing 3) and B.4 *strategy filter* (Listing 4). The
paper describes them in prose only; :func:`classify` turns them into rules over main's AST (the code
is never run), written out in docs/environments.md, *Cooperation schemes*.
"""

from __future__ import annotations

import ast
import copy
from collections import Counter
from collections.abc import Iterable

from collab.envs.coding.static import (
    AUX,
    body_statements,
    calls,
    clean_response,
    function_def,
    is_call_to,
    parse_code,
    returns_value,
    thin_wrapper,
)

SCHEMES = ("fallback", "decorator", "coordinator", "strategy_filter", "none")
_PRECEDENCE = ("fallback", "coordinator", "strategy_filter", "decorator")
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_TRY = (ast.Try, ast.TryStar)


def classify(main_code: str, entry_point: str, aux_name: str = AUX) -> str:
    """The scheme (one of :data:`SCHEMES`) of the main function ``entry_point`` in a raw response."""
    fn = function_def(parse_code(clean_response(main_code)), entry_point)
    if fn is None or not calls(fn, aux_name) or _thin(fn, aux_name):
        return "none"
    found = set()
    for call, places in _aux_calls(fn, aux_name):
        if _used(call, fn):
            found |= places or {"decorator"}
    for scheme in _PRECEDENCE:
        if scheme in found:
            return scheme
    return "none"


def classify_pair(aux_code: str, main_code: str, entry_point: str, aux_name: str = AUX) -> str:
    """:func:`classify`, or ``"none"`` when ``aux_code`` does not define ``aux_name`` with a return."""
    aux_fn = function_def(parse_code(clean_response(aux_code)), aux_name)
    return classify(main_code, entry_point, aux_name) if returns_value(aux_fn) else "none"


def distribution(labels: Iterable[str]) -> dict[str, float]:
    """Fraction of each scheme among ``labels`` (all of :data:`SCHEMES`; all zeros when empty)."""
    counts = Counter(labels)
    unknown = set(counts) - set(SCHEMES)
    if unknown:
        raise ValueError(f"unknown schemes {sorted(unknown)}; expected {SCHEMES}")
    total = sum(counts.values())
    return {s: counts[s] / total if total else 0.0 for s in SCHEMES}


def _aux_calls(fn: ast.AST, name: str):
    """``(call, places)`` for each call to ``name`` in ``fn``: the structures (schemes) it sits in."""
    stack = [(child, frozenset()) for child in ast.iter_child_nodes(fn)]
    while stack:
        node, places = stack.pop()
        if is_call_to(node, name):
            yield node, places
        for child, extra in _children(node):
            stack.append((child, places | extra))


def _children(node: ast.AST):
    """``node``'s children, each with the schemes its position gives to the calls inside it."""
    if isinstance(node, _TRY):
        body = {"fallback"} if any(_does_work(h) for h in node.handlers) else set()
        rest = node.handlers + node.orelse + node.finalbody
        return [(s, body) for s in node.body] + [(n, set()) for n in rest]
    if isinstance(node, _LOOPS):
        if isinstance(node, ast.While):
            head = [(node.test, {"strategy_filter"})]
        else:  # the iterable is evaluated once
            head = [(node.target, set()), (node.iter, set())]
        return head + [(s, {"coordinator"}) for s in node.body] + [(s, set()) for s in node.orelse]
    if isinstance(node, (ast.If, ast.IfExp)):
        return [(c, {"strategy_filter"} if c is node.test else set()) for c in ast.iter_child_nodes(node)]
    if isinstance(node, ast.Match):
        return [(node.subject, {"strategy_filter"})] + [(c, set()) for c in node.cases]
    if isinstance(node, ast.match_case):
        return ([(node.guard, {"strategy_filter"})] if node.guard else []) + [(s, set()) for s in node.body]
    if isinstance(node, _COMPREHENSIONS):  # the first iterable is evaluated once, the rest per element
        first = node.generators[0]
        per_element = [c for c in ast.iter_child_nodes(node) if c is not first] + first.ifs
        return [(first.iter, set()), (first.target, set())] + [(c, {"coordinator"}) for c in per_element]
    if isinstance(node, ast.Call):
        return [
            (c, {"coordinator"} if isinstance(c, ast.Lambda) else set())
            for c in [node.func, *node.args, *(k.value for k in node.keywords)]
        ]
    return [(c, set()) for c in ast.iter_child_nodes(node)]


def _does_work(handler: ast.ExceptHandler) -> bool:
    """The handler does something besides silencing the error (see the module docstring)."""
    return any(not _trivial(s) for s in handler.body)


def _trivial(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Pass, ast.Raise, ast.Break, ast.Continue)):
        return True
    if isinstance(stmt, ast.Expr):
        return isinstance(stmt.value, ast.Constant) or is_call_to(stmt.value, "print")
    if isinstance(stmt, (ast.Return, ast.Assign, ast.AnnAssign)):
        return stmt.value is None or _literal(stmt.value)
    return False


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _thin(fn: ast.FunctionDef, name: str) -> bool:
    """:func:`thin_wrapper` once ``try`` blocks whose handlers only silence errors are unwrapped."""
    bare = copy.copy(fn)
    bare.body = _unwrap(body_statements(fn))
    return thin_wrapper(bare, name)


def _unwrap(body: list[ast.stmt]) -> list[ast.stmt]:
    """``body`` with each ``try`` that only silences errors (no ``else``/``finally`` work) replaced by its body."""
    out = []
    for s in body:
        if (
            isinstance(s, _TRY)
            and not any(_does_work(h) for h in s.handlers)
            and all(isinstance(t, ast.Pass) for t in s.orelse + s.finalbody)
        ):
            out += _unwrap([t for t in s.body if not isinstance(t, ast.Pass)])
        else:
            out.append(s)
    return out


def _used(call: ast.Call, fn: ast.AST) -> bool:
    """The call's value is not thrown away (an expression statement, or bound to names never read)."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Expr) and node.value is call:
            return False
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is call:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            return not all(isinstance(t, ast.Name) and t.id not in read for t in targets)
    return True
