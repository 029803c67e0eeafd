"""The ``math`` environment: MARFT's math problem solving (MARFT, Section 5.1).

:mod:`~collab.envs.math.answers` extracts and compares final answers, :mod:`~collab.envs.math.datasets`
loads and generates the problems and :mod:`~collab.envs.math.env` holds :class:`MathEnv` (built by
``make_env("math", ...)``).
"""

from collab.envs.math.answers import extract_answer, is_equiv, normalize

__all__ = ["extract_answer", "is_equiv", "normalize"]
