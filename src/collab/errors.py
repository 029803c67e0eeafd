"""User-facing errors.

A :class:`UserError` is bad input from the person running collab (an unknown name, a value out of
range, a malformed data record). The command-line entries print its message as one line and exit with
code 2; no traceback. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping


class UserError(ValueError):
    """Bad input: the message says what is wrong and what would be valid."""


def unknown(kind: str, name: object, valid: Iterable[object]) -> UserError:
    """``unknown model 'x'; valid: a, b, c`` as a :class:`UserError`."""
    choices = ", ".join(sorted(str(v) for v in valid))
    return UserError(f"unknown {kind} {name!r}; valid: {choices}")


def require(condition: bool, message: str) -> None:
    """Raise :class:`UserError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise UserError(message)


def require_ranges(
    values: dict,
    unit: Iterable[str] = (),
    positive: Iterable[str] = (),
    non_negative: Iterable[str] = (),
    counts: Iterable[str] = (),
    optional_positive: Iterable[str] = (),
    choices: dict | None = None,
    widths: Iterable[str] = (),
    prefix: str = "model",
) -> None:
    """Check an algorithm's options by name in ``values`` (its ``locals()``): ``unit`` in [0, 1], ``positive`` > 0,
    ``non_negative`` >= 0, ``counts`` >= 1 or null, ``optional_positive`` > 0 or null, ``choices`` (name -> the
    valid values) one of them, ``widths`` a list of layer widths >= 1 or null. The first bad one is a
    :class:`UserError` naming ``prefix.name``, what is valid and the value given."""
    rules = [
        (unit, lambda v: 0 <= v <= 1, "be in [0, 1]"),
        (positive, lambda v: v > 0, "be > 0"),
        (non_negative, lambda v: v >= 0, "be >= 0"),
        (counts, lambda v: v is None or v >= 1, "be >= 1 or null"),
        (optional_positive, lambda v: v is None or v > 0, "be > 0 or null"),
        (
            widths,
            lambda v: v is None or all(isinstance(w, int) and w >= 1 for w in v),
            "list layer widths >= 1 (e.g. [1024, 512]) or be null",
        ),
    ]
    for names, ok, valid in rules:
        for name in names:
            require(ok(values[name]), f"{prefix}.{name} must {valid}, got {values[name]}")
    for name, valid in (choices or {}).items():
        require(values[name] in valid, f"unknown {prefix}.{name} {values[name]!r}; valid: {', '.join(map(str, valid))}")


def class_from_path(path: str, base: type, option: str, builtins: Iterable[str]) -> type:
    """The class that ``path`` (``module:Class``, as ``--algo reinforce:Reinforce`` or ``--data.env
    guess_env:GuessEnv``) names, imported from ``sys.path`` (``python -m`` puts the working directory first):
    a subclass of ``base``. A module that cannot be imported, a missing class or one of another kind ends
    in one line naming what is wrong and what is valid (docs/extending.md)."""
    import importlib

    module, _, name = path.partition(":")
    valid = (
        f"give a built-in name ({', '.join(sorted(builtins))}) or module:Class naming a {base.__module__}."
        f"{base.__name__} subclass importable from the working directory"
    )
    if not module or not name or ":" in name:
        raise UserError(f"{option} {path} is not a class path module:Class; {valid}")
    try:
        loaded = importlib.import_module(module)
    except ImportError as e:
        raise UserError(f"{option} {path}: cannot import module {module!r} ({e}); {valid}") from None
    cls = getattr(loaded, name, None)
    if cls is None:
        raise UserError(
            f"{option} {path}: module {module!r} ({getattr(loaded, '__file__', '?')}) has no {name!r}; {valid}"
        )
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise UserError(f"{option} {path}: {name} is not a {base.__module__}.{base.__name__} subclass; {valid}")
    return cls


def registered_class(name: str, table: Mapping[str, str], base: type, kind: str, option: str) -> type:
    """The class a registry's ``name`` stands for: a built-in name of ``table`` (name -> ``"module:Class"``, the
    module imported only now), or a class path of one's own (:func:`class_from_path`, ``option`` naming where it
    was given). An unknown name is a UserError listing the valid ones."""
    import importlib

    if ":" in name:
        return class_from_path(name, base, option, table)
    if name not in table:
        raise unknown(kind, name, table)
    module, cls = table[name].split(":")
    return getattr(importlib.import_module(module), cls)


class OneLineParser(argparse.ArgumentParser):
    """argparse for collab's commands (``collab.evaluate``, ``collab.export``, ``collab.compare``): a bad argument is
    one :class:`UserError` line (for a bad number, what is expected; then ``hint``, e.g. where the options are
    documented) instead of argparse's usage block and its own exit."""

    def __init__(self, *args, hint: str = "", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hint = hint

    def error(self, message: str):
        message = message.removeprefix("argument ")
        kind = re.search(r"invalid (int|float) value", message)
        if kind:
            message += f"; expected {'an integer' if kind.group(1) == 'int' else 'a number'}"
        raise UserError(message + (f" ({self.hint})" if self.hint else ""))
