"""Static analysis of the agents' code (CoLLM, F.2 and the E.2 diagnostics), with ``ast`` only.

Responses are cleaned before anything else: small models wrap code in markdown fences and add prose
before or after it despite the E.2 instructions, so :func:`clean_response` keeps the fenced code when
there is some (else it starts at the first line of code), and :func:`parse_code` drops unindented lines
of prose (a sentence after the function) when the code does not parse with them. Only prose goes: code
is never cut, so a response whose code does not parse as written (``return y +`` on its last line) is
kept as it is and fails the syntax level. A response with no code at all (``I cannot help with
that.``) contributes nothing: that agent's function is missing, the team's code is not broken.

The choices where the paper is silent (what is kept of each agent's response, "defined with a return", calls,
discards, thin wrappers): docs/environments.md, *Coding: choices where the paper is silent*.
"""

from __future__ import annotations

import ast
import keyword
import re
from dataclasses import dataclass

AUX = "aux"
_CODE_START = re.compile(
    r"^(?:(?:async\s+)?def\s+\w+\s*\(|class\s+\w+|import\s+[\w.]+|from\s+[\w.]+\s+import\b|@[\w.]+)", re.M
)
_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def clean_response(text: str) -> str:
    """The code of a response: the contents of its markdown code blocks if it has any, else the text
    from its first line that starts code (``def f(``, ``import m``, ``from m import``, ``class``, ``@``);
    ``""`` when no line starts code (a reply in prose only)."""
    blocks = _FENCE.findall(text)
    code = "\n\n".join(b.strip("\n") for b in blocks) if blocks else text
    start = _CODE_START.search(code)
    return code[start.start() :].strip("\n") if start else ""


# Words that open Python statements or expressions: a line starting with one is code, not prose.
_NOT_PROSE = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | {"print", "exec"}
_WORDS = re.compile(r"[A-Za-z][\w'’]*")


def is_prose(line: str) -> bool:
    """An unindented line of natural language or markdown, not of code.

    It does not parse on its own, and either is a markdown bullet, quote, heading, emphasis or fence
    (``- The ...``, ``1. ...``, ``**Note**``, a stray ```` ``` ````), or is a capitalised sentence of words ending in
    ``.!?:`` (``This is it.``, ``Explanation:``), or holds two consecutive words, neither a Python keyword nor
    ``print``, separated by one space (``I cannot help with that``): two names in a row never make
    valid Python. Indented lines are never prose: they belong to a block.
    """
    if not line.strip() or line[0].isspace():
        return False
    try:
        ast.parse(line)
        return False
    except (SyntaxError, ValueError):
        pass
    if re.match(r"(?:[-*+>]|\d+[.)])\s+[A-Za-z*`]|\*\*\w|#+\s|```[\w+-]*\s*$", line):
        return True  # markdown, a stray fence line included
    if (
        re.fullmatch(r"[A-Z][\w'’,]*(?: [\w'’,]+)*[.!?:]", line.strip())
        and _WORDS.match(line).group() not in _NOT_PROSE
    ):
        return True  # a sentence: "Explanation:", "This is it."
    words = [(m.group(), m.start(), m.end()) for m in _WORDS.finditer(line)]
    return any(
        a not in _NOT_PROSE and b not in _NOT_PROSE and line[end_a:start_b] == " "
        for (a, _, end_a), (b, start_b, _) in zip(words, words[1:])
    )


def parse_code(code: str) -> ast.Module | None:
    """Parse ``code`` as written, else without its unindented prose lines (:func:`is_prose`).

    ``None`` when neither parses or the module defines no function. Code is never cut: a line that
    is not prose stays, so a syntax error in the code is not "repaired" by dropping it.
    """
    return _parse_code(code)[0]


def _parse_code(code: str) -> tuple[ast.Module | None, str]:
    """:func:`parse_code` and the text it parsed (``code`` without its prose lines where needed)."""
    candidates = [code]
    lines = code.split("\n")
    kept = [line for line in lines if not is_prose(line)]
    if len(kept) < len(lines):
        candidates.append("\n".join(kept))
    for text in candidates:
        try:
            module = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        has_def = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in module.body)
        return (module if has_def else None), text
    return None, code


def defined_in_text(code: str, name: str) -> bool:
    """For code that does not parse: an unindented ``def name(`` whose block has ``return <value>``.

    The block is the ``def`` line and the lines after it up to the next unindented, non-blank one.
    """
    header = re.compile(rf"(?:async\s+)?def\s+{re.escape(name)}\s*\(")
    returns = re.compile(r"(?:^|[\s:;])return\b[ \t]*(?![\s;#]|$)")
    lines = code.split("\n")
    for i, line in enumerate(lines):
        if not header.match(line):
            continue
        block = [line[header.match(line).end() :]]
        for nxt in lines[i + 1 :]:
            if nxt.strip() and not nxt[0].isspace():
                break
            block.append(nxt)
        if any(returns.search(b) for b in block):
            return True
    return False


def select_definitions(response: str, drop: str) -> str:
    """Imports and top-level functions of ``response`` except a function named ``drop``.

    A response that does not parse even without its prose is returned cleaned but otherwise as is
    (it then fails the syntax level); one without code gives ``""``.
    """
    module, code = _parse_code(clean_response(response))
    if module is None:
        return code
    keep = [
        n
        for n in module.body
        if isinstance(n, (ast.Import, ast.ImportFrom))
        or (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name != drop)
    ]
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
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
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
    return (
        is_call_to(node, name)
        and all(isinstance(a, (ast.Name, ast.Constant)) for a in node.args)
        and all(isinstance(k.value, (ast.Name, ast.Constant)) for k in node.keywords)
    )


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
        return (
            isinstance(target, ast.Name)
            and _plain_call(body[0].value, name)
            and isinstance(value, ast.Name)
            and value.id == target.id
        )
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
    aux_module, main_module = _try_parse(aux_code), _try_parse(main_code)
    aux_fn, main_fn = function_def(aux_module, AUX), function_def(main_module, entry_point)
    return CodeFacts(
        aux_code=aux_code,
        main_code=main_code,
        program=program,
        aux_defined=returns_value(aux_fn) if aux_module is not None else defined_in_text(aux_code, AUX),
        main_defined=returns_value(main_fn) if main_module is not None else defined_in_text(main_code, entry_point),
        syntax_ok=module is not None,
        syntax_error=syntax_error,
        calls_aux=calls(main_fn),
        discards_aux=discards(main_fn),
        thin_wrapper=thin_wrapper(main_fn),
    )


def _try_parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None
