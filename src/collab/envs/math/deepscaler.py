r"""DeepScaleR's answer rules, as Dr. MAS grades math (Dr. MAS, arXiv 2602.08847).

The reference: ``langfengQ/DrMAS`` at 19c632bc0f75730b6db98d90b5035ee9bb7f66d1,
``agent_system/environments/env_package/math/math_reward.py`` (``RewardMathFn``) and ``utils.py`` beside it.
The same rules, quirks included (``tests/envs/test_math_deepscaler.py`` holds the cross-check):

* :func:`final_answer` — the last ``\boxed{...}`` after ``</think>`` (else of the whole response).
* :func:`mathd_normalize` — MATH's string clean-up; equal clean strings are one answer.
* :func:`sympy_match` — a second clean-up (:func:`sympy_normalize`: units, LaTeX to text), then item by item
  ``sympy.simplify`` of the difference, under the reference's guards against long evaluations (at most two
  letters, no ``^{``, ``^(``, towers or exponents of two digits; no timeout, as in the reference). One
  difference: the guards also read ``**`` and ``^-`` as ``^``, which the reference would evaluate for minutes.
* :func:`grade` — correct when either test accepts the answer for some ground truth.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from collab.envs.math.answers import brace_group

__all__ = ["final_answer", "grade", "mathd_normalize", "matches", "sympy_match", "sympy_normalize"]

_OPEN = "\\boxed{"
_LEADING_TEXT = re.compile(r"^\\text\{(?P<inner>.+?)\}")
_BRACKETS = "()[]"
_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month",
          "year", "foot", "feet", "inch", "yard")  # fmt: skip
_UNIT_PATTERNS = [re.compile(rf"{unit}(es)?(s)? *(\^[0-9]+)?") for unit in _UNITS]  # in this order: "cm" first
_THOUSANDS = re.compile(r"(\d),(\d\d\d)($|\D)")
_PLAIN_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_RISKY = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_SYMBOLS = {"√": "sqrt", "π": "pi", "∞": "inf", "∪": "U", "·": "*", "×": "*"}


# -- extraction ---------------------------------------------------------------------------------------
def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}``; None without one, when it is left open, or for ``\boxed 5``."""
    if "\\boxed" not in text:  # a lone \fbox never counts: the reference looks for \boxed first
        return None
    start = text.rfind("\\boxed")
    brace = text.find("{", start)
    group = brace_group(text, brace) if brace >= 0 else None
    # the box runs from \boxed to its first brace group closed; \boxed 5 {x} is no box
    return group[0] if group is not None and text[start : brace + 1] == _OPEN else None


def final_answer(response: str | None) -> str | None:
    """The graded answer of a response: the last box after ``</think>`` (the whole text without one)."""
    if not response:
        return None
    if "</think>" in response:
        response = response.split("</think>")[1]  # between the first and a second </think>, as the reference
    return last_boxed(response)


# -- MATH's string normalisation -------------------------------------------------------------------------
def _brace_fracs(s: str) -> str:
    r"""``\frac12`` -> ``\frac{1}{2}``, ``\frac1{7}`` -> ``\frac{1}{7}``; unchanged when a single character
    follows a ``\frac``; ValueError when none does (the reference then keeps the whole answer)."""
    head, *pieces = s.split("\\frac")
    out = [head]
    for piece in pieces:
        if not piece:
            raise ValueError("\\frac without arguments")
        if piece[0] == "{":
            out.append("\\frac" + piece)
        elif len(piece) < 2:
            return s
        else:
            second = piece[1] if piece[1] == "{" else "{" + piece[1] + "}"
            out.append("\\frac{" + piece[0] + "}" + second + piece[2:])
    return "".join(out)


def _brace_sqrts(s: str) -> str:
    r"""``\sqrt3`` -> ``\sqrt{3}``; ValueError at a trailing ``\sqrt``."""
    head, *pieces = s.split("\\sqrt")
    for piece in pieces:
        if not piece:
            raise ValueError("\\sqrt without an argument")
        head += "\\sqrt" + (piece if piece[0] == "{" else "{" + piece[0] + "}" + piece[1:])
    return head


def _slash_to_frac(s: str) -> str:
    """``a/b`` of two integers written plainly -> ``\\frac{a}{b}``."""
    if s.count("/") != 1:
        return s
    try:
        num, den = map(int, s.split("/"))
    except ValueError:
        return s
    return f"\\frac{{{num}}}{{{den}}}" if s == f"{num}/{den}" else s


def _mathd_clean(s: str) -> str:
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"),
                     ("\\left", ""), ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", "")):  # fmt: skip
        s = s.replace(old, new)
    if "\\text{ " in s:  # a unit after the value: keep the value, refuse two of them
        value, *units = s.split("\\text{ ")
        if len(units) != 1:
            raise ValueError("several units")
        s = value
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "x = 5", "k=5": the value
        s = sides[1]
    s = _brace_fracs(_brace_sqrts(s).replace(" ", ""))
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_to_frac(s)


def _unwrap_text(s: str) -> str:
    m = _LEADING_TEXT.search(s)
    return m.group("inner") if m else s


def mathd_normalize(answer: str) -> str:
    """The MATH dataset's normal form of an answer (Hendrycks et al.); on a malformed one, the answer itself."""
    answer = _unwrap_text(answer.strip()).strip()
    try:
        return _mathd_clean(answer)
    except ValueError:
        return answer


# -- the sympy test ----------------------------------------------------------------------------------------
def _is_whole(x: float) -> bool:
    try:
        return abs(x - round(x)) <= 1e-7
    except (OverflowError, ValueError):  # inf, nan
        return False


def _drop_thousands_commas(s: str) -> str:
    while True:  # overlapping groups ("1,000,000") need several passes
        stripped = _THOUSANDS.sub(r"\1\2\3", s)
        if stripped == s:
            return s
        s = stripped


def _is_int_string(s: str) -> bool:
    try:
        return _is_whole(float(_drop_thousands_commas(s)))
    except ValueError:
        return False


def _latex_to_text(s: str) -> str:
    import logging

    from pylatexenc.latex2text import LatexNodes2Text

    # a malformed macro (\frac without arguments) is logged as a warning at every answer: the text is kept anyway
    logging.getLogger("pylatexenc").setLevel(logging.ERROR)

    s = s.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")  # 1 \frac12: +
    s = LatexNodes2Text().latex_to_text(s)
    for symbol, name in _SYMBOLS.items():
        s = s.replace(symbol, name)
    return s.strip()


def sympy_normalize(expr: str) -> str:
    """The second normal form: units, ``$``, ``%`` and words dropped, LaTeX as plain text, lower case."""
    expr = _unwrap_text(expr)
    for old, new in (("\\%", "%"), ("\\$", "$"), ("$", ""), ("%", ""), (" or ", " , "), (" and ", " , "),
                     ("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12")):  # fmt: skip
        expr = expr.replace(old, new)
    for pattern in _UNIT_PATTERNS:
        expr = pattern.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr[:1] == "{" and expr[-1:] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    try:
        if _is_whole(float(expr)):
            expr = str(round(float(expr)))
    except ValueError:
        pass
    if "\\" in expr:
        try:
            expr = _latex_to_text(expr)
        except Exception:  # pylatexenc's errors: keep the LaTeX, as the reference does
            pass
    expr = re.sub(r"([0-9]) +([0-9])", r"\1+\2", re.sub("- *", "-", expr))  # "7 3/4" is 7 + 3/4
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _is_int_string(expr):
        expr = str(int(float(expr.replace(",", ""))))  # int(): truncated, as the reference
    return expr


def _safe_to_evaluate(expr: str) -> bool:
    """The reference's guards; they also read ``**`` and ``^-`` as ``^``, since ``10**10**10`` or ``10^-999999``
    pass the reference's and keep sympy busy for minutes (the reference then hangs)."""
    if len({c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}) > 2:
        return False
    for text in (expr, expr.replace("**", "^").replace("^-", "^")):
        if "^{" in text or "^(" in text or any(p.search(text) for p in _RISKY):
            return False
    return True


def _sympy_zero(truth: str, given: str) -> bool:
    """Whether ``truth - given`` simplifies to 0 (False when refused or unparsable)."""
    from sympy import simplify
    from sympy.parsing.sympy_parser import implicit_multiplication_application, parse_expr, standard_transformations

    difference = f"({truth})-({given})"
    if not _safe_to_evaluate(difference):
        return False
    try:
        rules = (*standard_transformations, implicit_multiplication_application)
        return simplify(parse_expr(difference.replace("^", "**"), transformations=rules)) == 0
    except Exception:  # sympy raises many kinds on text that is no expression
        return False


def _items(expr: str) -> list[str]:
    """The items of a tuple or interval ``(a, b]``, else ``[expr]``; thousands commas are no separators."""
    expr = _drop_thousands_commas(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if len(expr) > 2 and expr[0] in _BRACKETS and expr[-1] in _BRACKETS and not any(b in inner for b in _BRACKETS):
        return [item.strip() for item in inner.split(",")]
    return [expr]


def _item_match(truth: str, given: str) -> bool:
    if _PLAIN_FRACTION.search(truth) and _PLAIN_FRACTION.search(given):
        return truth == given  # 2/4 is not 1/2: the fraction must be reduced as the truth is
    if _is_int_string(truth) != _is_int_string(given):
        return False
    return _sympy_zero(truth, given)


def sympy_match(given: str, truth: str) -> bool:
    """Equality after :func:`sympy_normalize`: as strings, else item by item under sympy."""
    truth, given = sympy_normalize(truth), sympy_normalize(given)
    if truth == given:
        return True
    if not given:
        return False
    truth_items, given_items = _items(truth), _items(given)
    if len(truth_items) > 1 and (truth[0], truth[-1]) != (given[0], given[-1]):
        return False  # (1, 2) is not [1, 2)
    if len(truth_items) != len(given_items):
        return False
    return all(_item_match(t, g) for t, g in zip(truth_items, given_items))


# -- grading ----------------------------------------------------------------------------------------------
def _truth_list(truths: str | float | Iterable | None) -> list[str]:
    if isinstance(truths, (str, float, int)):
        truths = [truths]
    unboxed = (last_boxed(t) if "\\boxed" in t else t for t in map(str, truths or ()))
    return [t for t in unboxed if t is not None]  # a box that does not close drops its truth


def matches(answer: str, truths: str | float | Iterable | None) -> bool:
    """Whether an extracted answer equals one of the ground truths (a boxed truth is unboxed first)."""
    return any(
        mathd_normalize(answer) == mathd_normalize(truth) or sympy_match(answer, truth) for truth in _truth_list(truths)
    )


def grade(response: str | None, truths: str | float | Iterable | None) -> bool:
    """Dr. MAS's verdict on a response: its :func:`final_answer` :func:`matches` a ground truth."""
    answer = final_answer(response)
    return answer is not None and matches(answer, truths)
