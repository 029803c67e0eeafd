"""``calculator``: exact arithmetic on an expression, without evaluating code.

The expression is parsed by Python's ``ast`` and only numbers, parentheses, unary ``+``/``-`` and the binary
``+ - * / // % **`` are accepted (a name, a call, an attribute, a string or any other node is refused in one
line). Every number is a :class:`fractions.Fraction` read from its literal's text (``0.1`` is one tenth, not the
nearest float), so sums and products of any size are exact. A result is an integer, a terminating decimal
(``7/4`` gives ``1.75``) or a fraction with its rounded decimal (``1/3`` gives ``1/3 ≈ 0.333333333333``).

Bounds, so that one call cannot take the machine: expressions of at most :data:`MAX_CHARS` characters; a power's
exponent must be an integer and its result at most :data:`MAX_DIGITS` digits (``9**9**9`` is refused before it
is computed).
"""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction
from typing import Any

from collab.tools.base import Tool, ToolError

MAX_CHARS = 1000
MAX_DIGITS = 4000
"""Below Python's own limit on converting an integer to text (4,300 digits)."""
SIGNIFICANT = 12
BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: None,  # bounded: power()
}
SYMBOLS = {ast.BitXor: "^ (use ** for a power)", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|"}


def digits(x: Fraction) -> float:
    """log10 of the larger of numerator and denominator (about their digits; 0 for 0)."""
    return max(math.log10(abs(x.numerator)) if x.numerator else 0.0, math.log10(x.denominator))


def power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise ToolError(f"the exponent must be an integer, got {format_number(exponent)}")
    if base == 0 and exponent < 0:
        raise ToolError("division by zero (0 to a negative power)")
    if base not in (0, 1, -1):  # the result's digits, from the logarithm, before computing it
        if digits(base) * abs(exponent) > MAX_DIGITS:
            raise ToolError(f"the result would have more than {MAX_DIGITS} digits")
    return base ** int(exponent)


def evaluate(node: ast.AST, source: str) -> Fraction:
    """The exact value of an expression's node (a ToolError for anything but arithmetic on numbers)."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body, source)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(ast.get_source_segment(source, node).replace("_", ""))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = evaluate(node.operand, source)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = evaluate(node.left, source), evaluate(node.right, source)
        if isinstance(node.op, ast.Pow):
            return power(left, right)
        if right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            raise ToolError("division by zero")
        result = BINARY[type(node.op)](left, right)
        if digits(result) > MAX_DIGITS:
            raise ToolError(f"the result would have more than {MAX_DIGITS} digits")
        return result
    if isinstance(node, ast.BinOp) and type(node.op) in SYMBOLS:
        raise ToolError(f"the operator {SYMBOLS[type(node.op)]} is not arithmetic here; use + - * / // % **")
    what = type(node).__name__ if not isinstance(node, ast.Constant) else type(node.value).__name__
    raise ToolError(f"only numbers and + - * / // % ** ( ) are allowed, not {what}")


def format_number(x: Fraction) -> str:
    """An integer, a terminating decimal, or ``p/q ≈ decimal``."""
    if x.denominator == 1:
        return str(x.numerator)
    q, twos, fives = x.denominator, 0, 0
    while q % 2 == 0:
        q, twos = q // 2, twos + 1
    while q % 5 == 0:
        q, fives = q // 5, fives + 1
    if q == 1:  # terminates after max(twos, fives) digits
        places = max(twos, fives)
        scaled = abs(x.numerator) * 10**places // x.denominator
        whole, frac = divmod(scaled, 10**places)
        return f"{'-' if x < 0 else ''}{whole}.{frac:0{places}d}"
    return f"{x.numerator}/{x.denominator} ≈ {float(x):.{SIGNIFICANT}g}"


def calculate(expression: str) -> str:
    """The exact value of ``expression`` as text (a ToolError for what is not arithmetic)."""
    text = expression.strip()
    if not text:
        raise ToolError("the expression is empty")
    if len(text) > MAX_CHARS:
        raise ToolError(f"the expression has {len(text)} characters; at most {MAX_CHARS}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ToolError(f"not an arithmetic expression ({e.msg})") from None
    except (ValueError, MemoryError, RecursionError):
        raise ToolError("not an arithmetic expression") from None
    try:
        return format_number(evaluate(tree, text))
    except RecursionError:
        raise ToolError("the expression is nested too deeply") from None


class Calculator(Tool):
    name = "calculator"
    description = "Exact arithmetic: + - * / // % ** and parentheses on integers and decimals."
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. (123456 + 654321) * 7"}},
        "required": ["expression"],
    }

    def run(self, arguments: dict[str, Any]) -> str:
        return calculate(self.argument(arguments, "expression", str))
