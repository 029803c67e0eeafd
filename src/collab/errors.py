"""User-facing errors.

A :class:`UserError` is bad input from the person running collab (an unknown name, a value out of
range, a malformed data record). The command-line entries print its message as one line and exit with
code 2; no traceback. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterable


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
