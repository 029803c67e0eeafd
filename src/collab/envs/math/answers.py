r"""Final answers of math solutions: extraction and equivalence (MARFT, Section 5.1).

MARFT's math verifier gives reward 1 when the team's final answer is correct and 0 otherwise; the
profiles ask the graded agent for its answer "within boxed{}". This module finds that answer and
decides whether it equals the gold one, without sympy:

* :func:`last_boxed` — the content of the last complete ``\boxed{...}`` / ``\fbox{...}`` (balanced
  braces; ``\boxed 5`` too; a bare ``boxed{...}`` counts, as the D.3 prompt spells it without a
  backslash); a box left open by a truncated generation is ignored.
* :func:`extract_answer` — the boxed answer, else (``fallback=True``) the last "answer is X" /
  "Answer: X" / "#### X" phrase, else the last number of the text; ``None`` when nothing is found.
  Small models rarely box, so the fallback keeps their reward from being all zero; with
  ``fallback=False`` only boxed answers count, as in the paper.
* :func:`normalize` / :func:`is_equiv` — equality up to notation: numbers exactly as :class:`fractions.Fraction`,
  tuples and intervals in order, unbracketed lists as multisets, else the cleaned text (docs/environments.md,
  *Answer equivalence*, gives every rule).
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["brace_group", "extract_answer", "fallback_answer", "is_equiv", "last_boxed", "normalize"]

REL_TOL = 1e-9
"""Two numbers closer than this (relative) are equal: float noise, not rounding."""

# -- extraction -------------------------------------------------------------------------------------

_BOX = re.compile(r"\\?(?:boxed|fbox)\b")
_PHRASE = re.compile(r"(?:####|\b(?:final\s+)?answer\s*(?:is\b\s*:?|:|=))[ \t*:]*([^\n]*)", re.IGNORECASE)
_NUMBER = re.compile(r"(?:(?<![\w)\]])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|(?<!\d)\.\d+")


def brace_group(text: str, start: int) -> tuple[str, int] | None:
    """The content of the brace group opening at ``text[start] == "{"`` and the index after it."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None  # unbalanced: the text was cut off inside the group


def last_boxed(text: str) -> str | None:
    r"""The content of the last complete ``\boxed{...}`` (or ``\fbox``, ``\boxed 5``, ``boxed{...}``)."""
    found = None
    for m in _BOX.finditer(text):
        i = m.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            group = brace_group(text, i)
            if group is not None:
                found = group[0].strip()
        elif m.group().startswith("\\"):  # \boxed 5: one token, up to a space, "$" or the end
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                found = token.group().rstrip(".,")
    return found


def fallback_answer(text: str) -> str | None:
    """The answer of an unboxed solution: the last "answer is X" / "Answer: X" / "#### X" phrase
    (up to the end of its line or sentence), else the last number in the text."""
    for m in reversed(list(_PHRASE.finditer(text))):
        phrase = re.split(r"\.(?:\s|$)", m.group(1), maxsplit=1)[0].strip(" \t*$.")
        if phrase:
            return phrase
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def extract_answer(text: str, fallback: bool = True) -> str | None:
    r"""The final answer of ``text``: the last ``\boxed{}``; without one, :func:`fallback_answer` when
    ``fallback`` is set, else ``None``."""
    if not text:
        return None
    boxed = last_boxed(text)
    if boxed is not None or not fallback:
        return boxed
    return fallback_answer(text)


# -- cleaning ---------------------------------------------------------------------------------------

_COMMANDS = re.compile(r"\\(?:left|right)(?:\.|(?![a-zA-Z]))|\\displaystyle|\^\{\\circ\}|\^?\\circ(?![a-zA-Z])")
"""Removed: ``\\left(`` -> ``(``, ``\\right.`` -> nothing, degrees (but not ``\\rightarrow``)."""
_REMOVE = [r"\!", r"\$", "$", r"\(", r"\)", r"\[", r"\]", "°", r"\%", "%", "{,}"]
_SPACES = [r"\,", r"\;", r"\:", r"\ ", r"\qquad", r"\quad", "~"]
_TEXT = re.compile(r"\\(?:text|textbf|textit|textnormal|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_UNITS = re.compile(r"^(.*?[\d}.])\s*([a-zA-Z]{2,}(?:(?:\.\s*|\s+)[a-zA-Z]{2,})*\.?\s*(?:\^\s*\{?\d\}?)?)$")
_MATH_WORDS = {"pi", "sqrt", "inf", "infty", "infinity"}
"""Words after a number that are not units: ``2 pi`` stays as it is."""
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])")
_IN = re.compile(r"\\in(?![a-zA-Z])")
_VARIABLE = re.compile(r"^\s*[a-zA-Z](?:_\{?\w+\}?)?\s*$")


def _braced_args(s: str, command: str, nargs: int) -> str:
    r"""Rewrite ``\frac12`` as ``\frac{1}{2}``: every argument of ``command`` in braces (an optional
    ``[...]`` argument, as in ``\sqrt[3]8``, is kept as it is)."""
    out, i = [], 0
    while (j := s.find(command, i)) >= 0:
        k = j + len(command)
        if k < len(s) and s[k].isalpha():  # \fracx is another command
            out.append(s[i:k])
            i = k
            continue
        option = ""
        if s[k : k + 1] == "[" and "]" in s[k:]:
            option, k = s[k : s.index("]", k) + 1], s.index("]", k) + 1
        args = []
        for _ in range(nargs):
            while k < len(s) and s[k] == " ":
                k += 1
            if k >= len(s):
                break
            if s[k] == "{":
                group = brace_group(s, k)
                if group is None:
                    break
                arg, k = group
            elif s[k] == "\\":
                name = re.match(r"\\[a-zA-Z]+", s[k:])
                arg = name.group() if name else s[k : k + 2]
                k += len(arg)
            else:
                arg, k = s[k], k + 1
            args.append(arg)
        if len(args) < nargs:  # malformed: keep the rest as it is
            out.append(s[i:])
            return "".join(out)
        out.append(s[i:j] + command + option + "".join("{" + _braced_args(a, command, nargs) + "}" for a in args))
        i = k
    out.append(s[i:])
    return "".join(out)


def _clean(answer: str) -> str:
    """The answer without presentation: delimiters, spacing, units, ``x =``, thousands commas."""
    s = str(answer).strip().replace("\u2212", "-")
    boxed = last_boxed(s)
    if boxed is not None and s.lstrip("$ ").startswith(("\\boxed", "\\fbox", "boxed")):
        s = boxed
    s = _COMMANDS.sub("", s)
    for token in _REMOVE:
        s = s.replace(token, "")
    for token in _SPACES:
        s = s.replace(token, " ")
    s = s.replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac")
    s = _TEXT.sub(lambda m: f" {m.group(1)} ", s)
    s = s.strip().rstrip(".").strip()
    if s.count("=") == 1 and _VARIABLE.match(s.split("=")[0]):  # x = 5
        s = s.split("=")[1].strip()
    elif len(parts := _IN.split(s)) == 2 and _VARIABLE.match(parts[0]):  # x \in [-2, 7]
        s = parts[1].strip()
    elif "=" in s and _number(_compact(s.rsplit("=", 1)[1])) is not None:  # 2 + 3 = 5
        s = s.rsplit("=", 1)[1].strip()
    if not any(c in s for c in "()[]"):
        s = _THOUSANDS.sub(lambda m: m.group().replace(",", ""), s)
    units = _UNITS.match(s)
    if (
        units
        and _number(_compact(units.group(1))) is not None
        and not _MATH_WORDS & {w.lower() for w in re.findall(r"[a-zA-Z]+", units.group(2))}
    ):
        s = units.group(1)  # 18 dollars, \frac{68}{3} pounds
    return _compact(s)


def _compact(s: str) -> str:
    s = _braced_args(_braced_args(s, r"\frac", 2), r"\sqrt", 1)
    s = re.sub(r"\s+", "", s)
    return re.sub(r"([\^_])\{(\w)\}", r"\1\2", s)  # x^{2} -> x^2


# -- parsing ----------------------------------------------------------------------------------------

_PLAIN = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")
_SLASH = re.compile(r"([+-]?\d+)/(\d+)")
_FRAC = re.compile(r"([+-]?)(\d*)\\frac\{([^{}]+)\}\{([^{}]+)\}")


def _number(s: str) -> Fraction | None:
    """``s`` (compact: no spaces) as an exact number, or ``None``."""
    if _PLAIN.fullmatch(s):
        return Fraction(s.rstrip(".") or "0")
    if m := _SLASH.fullmatch(s):
        return Fraction(int(m.group(1)), int(m.group(2))) if int(m.group(2)) else None
    if m := _FRAC.fullmatch(s):
        num, den = _number(m.group(3)), _number(m.group(4))
        if num is None or den is None or den == 0:
            return None
        value = Fraction(int(m.group(2) or 0)) + num / den  # 2\frac{1}{2}: a mixed number
        return -value if m.group(1) == "-" else value
    if s.startswith("+"):
        return _number(s[1:])
    return None


def _split_top(s: str) -> list[str]:
    """``s`` split at the commas outside brackets and braces."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:])
    return parts


def _parse(s: str):
    """A compact answer as ``("num", Fraction)``, ``("seq", open, close, items)`` (``open`` empty:
    an unordered list) or ``("text", str)``."""
    value = _number(s)
    if value is not None:
        return ("num", value)
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _balanced(s[1:-1]):
        items = _split_top(s[1:-1])
        if len(items) == 1 and s[0] == "(":  # (5) is 5, (A) is A
            return _parse(items[0])
        return ("seq", s[0], s[-1], tuple(_parse(x) for x in items))
    items = _split_top(s)
    if len(items) > 1 and all(items):
        return ("seq", "", "", tuple(_parse(x) for x in items))
    return ("text", s.lower())


def _balanced(s: str) -> bool:
    depth = 0
    for c in s:
        depth += c in "([{"
        depth -= c in ")]}"
        if depth < 0:
            return False
    return depth == 0


def _render(parsed) -> str:
    kind = parsed[0]
    if kind == "num":
        return str(parsed[1])
    if kind == "seq":
        items = [_render(x) for x in parsed[3]]
        return parsed[1] + ",".join(items if parsed[1] else sorted(items)) + parsed[2]
    return parsed[1]


def _same(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "num":
        x, y = a[1], b[1]
        return x == y or abs(x - y) <= REL_TOL * max(abs(x), abs(y))
    if a[0] == "text":
        return a[1] == b[1]
    if a[1:3] != b[1:3] or len(a[3]) != len(b[3]):
        return False
    if a[1]:  # ordered: tuple or interval
        return all(_same(x, y) for x, y in zip(a[3], b[3]))
    rest = list(b[3])  # unordered list of solutions: match each item once
    for x in a[3]:
        match = next((k for k, y in enumerate(rest) if _same(x, y)), None)
        if match is None:
            return False
        rest.pop(match)
    return True


# -- public -----------------------------------------------------------------------------------------


def normalize(answer: str) -> str:
    """A canonical string of ``answer``: ``"1/2"`` for ``\\dfrac12``, ``"18"`` for ``$18.00``, ``"(1,2)"``..."""
    return _render(_parse(_clean(answer)))


def is_equiv(pred: str | None, gold: str | None) -> bool:
    """Whether the predicted answer equals the gold one under the rules of the module docstring."""
    if pred is None or gold is None:
        return False
    a, b = _clean(pred), _clean(gold)
    if not a or not b:
        return False
    return a.lower() == b.lower() or _same(_parse(a), _parse(b))
