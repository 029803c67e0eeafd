"""Static analysis of the agents' code (paper 002, F.2 and the E.2 diagnostics), with ``ast`` only.

Responses are cleaned before anything else: small models wrap code in markdown fences and add prose
before or after it despite the E.2 instructions, so :func:`clean_response` keeps the fenced code when
there is some (else it starts at the first line of code), and :func:`parseable_prefix` drops trailing
lines that do not parse (a sentence after the function). What cannot be repaired that way is kept as it is and fails the syntax check.

Choices where the paper is silent (tested in ``tests/test_coding_reward.py``):

- From the auxiliary agent's response we keep imports and top-level functions except a definition of
  the entry point; from the main agent's response, imports and top-level functions except ``aux``
  (E.2 tells main not to redefine it; a redefinition would silently replace the partner's code).
- "Defined with a return" means a top-level ``def`` of that name whose own body (not a nested
  function's) has a ``return <value>``.
- Main *calls* aux when a call ``aux(...)`` appears anywhere in its body (nested functions and
  lambdas included).
- Main *discards* aux's value when a call to aux is an expression statement, or its value is bound
  to a name (``x = aux(...)``, ``_ = ...``) that main never reads afterwards.
- Main is a *thin wrapper* when its body, without docstring and ``pass``, is ``return aux(...)`` or
  ``r = aux(...)`` followed by ``return r``, with aux's arguments plain names or constants: it adds
  no logic of its own.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

AUX = "aux"
_CODE_START = re.compile(r"^(?:async\s+def|def|import|from|class|@)\b", re.M)
_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def clean_response(text: str) -> str:
    """The code of a response: the contents of its markdown code blocks if it has any, else the text
    from its first line that starts code (``def``, ``import``, ``from``, ``class``, ``@``), if any."""
    blocks = _FENCE.findall(text)
    if blocks:
        return "\n\n".join(b.strip("\n") for b in blocks).strip("\n")
    start = _CODE_START.search(text)
    return (text[start.start():] if start else text).strip("\n")


def parseable_prefix(code: str) -> ast.Module | None:
    """Parse ``code``; if it fails, the longest prefix of whole lines that parses and defines something.

    ``None`` when no prefix holding a function definition parses.
    """
    lines = code.splitlines()
    for end in range(len(lines), 0, -1):
        try:
            module = ast.parse("\n".join(lines[:end]))
        except (SyntaxError, ValueError):
            continue
        has_def = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in module.body)
        return module if has_def else None
    return None


def select_definitions(response: str, drop: str) -> str:
    """Imports and top-level functions of ``response`` except a function named ``drop``.

    A response that does not parse even after trimming is returned cleaned but otherwise as is.
    """
    code = clean_response(response)
    module = parseable_prefix(code)
    if module is None:
        return code
    keep = [n for n in module.body
            if isinstance(n, (ast.Import, ast.ImportFrom))
            or (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name != drop)]
    return "\n\n".join(ast.get_source_segment(code, n, padded=False) or ast.unparse(n) for n in keep)


def function_def(module: ast.Module | None, name: str) -> ast.FunctionDef | None:
    """The last top-level ``def name`` of ``module`` (the one Python would bind)."""
    if module is None:
        return None
    found = None
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            found = node
    return found


def own_nodes(fn: ast.AST):
    """Every node in ``fn``'s body, not descending into nested functions, lambdas or classes."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def returns_value(fn: ast.FunctionDef | None) -> bool:
    """``fn`` has its own ``return <value>``."""
    return fn is not None and any(isinstance(n, ast.Return) and n.value is not None for n in own_nodes(fn))


def is_call_to(node: ast.AST, name: str = AUX) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name


def calls(fn: ast.FunctionDef | None, name: str = AUX) -> bool:
    """A call ``name(...)`` appears anywhere in ``fn`` (nested scopes included)."""
    return fn is not None and any(is_call_to(n, name) for n in ast.walk(fn))


def body_statements(fn: ast.FunctionDef) -> list[ast.stmt]:
    """``fn``'s top-level statements without a docstring and ``pass``."""
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return [s for s in body if not isinstance(s, ast.Pass)]


def discards(fn: ast.FunctionDef | None, name: str = AUX) -> bool:
    """Some call to ``name`` in ``fn`` has its value thrown away (see the module docstring)."""
    if fn is None:
        return False
    loaded = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for node in ast.walk(fn):
        if isinstance(node, ast.Expr) and is_call_to(node.value, name):
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and is_call_to(node.value, name):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(t, ast.Name) and t.id not in loaded for t in targets):
                return True
    return False


def _plain_call(node: ast.AST, name: str) -> bool:
    return is_call_to(node, name) and all(isinstance(a, (ast.Name, ast.Constant)) for a in node.args) \
        and all(isinstance(k.value, (ast.Name, ast.Constant)) for k in node.keywords)


def thin_wrapper(fn: ast.FunctionDef | None, name: str = AUX) -> bool:
    """``fn`` only forwards its arguments to ``name`` and returns the result."""
    if fn is None:
        return False
    body = body_statements(fn)
    if len(body) == 1 and isinstance(body[0], ast.Return):
        return body[0].value is not None and _plain_call(body[0].value, name)
    if len(body) == 2 and isinstance(body[0], ast.Assign) and isinstance(body[1], ast.Return):
        target = body[0].targets[0] if len(body[0].targets) == 1 else None
        value = body[1].value
        return (isinstance(target, ast.Name) and _plain_call(body[0].value, name)
                and isinstance(value, ast.Name) and value.id == target.id)
    return False


@dataclass(frozen=True)
class CodeFacts:
    """What the reward and the diagnostics need to know about one (aux, main) pair."""

    aux_code: str
    main_code: str
    program: str
    """``imports + aux_code + main_code``: the code the tests run against."""
    aux_defined: bool
    main_defined: bool
    syntax_ok: bool
    syntax_error: str | None
    calls_aux: bool
    discards_aux: bool
    thin_wrapper: bool


def combine(imports: str, aux_code: str, main_code: str) -> str:
    return "\n\n".join(part.strip("\n") for part in (imports, aux_code, main_code) if part.strip()) + "\n"


def analyze(aux_response: str, main_response: str, entry_point: str, imports: str = "") -> CodeFacts:
    """Clean both responses, concatenate them with the problem's imports and look at the result."""
    aux_code = select_definitions(aux_response, drop=entry_point)
    main_code = select_definitions(main_response, drop=AUX)
    program = combine(imports, aux_code, main_code)
    try:
        module = ast.parse(program)
        syntax_error = None
    except SyntaxError as e:
        module, syntax_error = None, f"line {e.lineno}: {e.msg}"
    except ValueError as e:  # e.g. null bytes
        module, syntax_error = None, str(e)
    aux_fn = function_def(_try_parse(aux_code), AUX)
    main_fn = function_def(_try_parse(main_code), entry_point)
    return CodeFacts(
        aux_code=aux_code, main_code=main_code, program=program,
        aux_defined=returns_value(aux_fn), main_defined=returns_value(main_fn),
        syntax_ok=module is not None, syntax_error=syntax_error,
        calls_aux=calls(main_fn), discards_aux=discards(main_fn), thin_wrapper=thin_wrapper(main_fn),
    )


def _try_parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None
