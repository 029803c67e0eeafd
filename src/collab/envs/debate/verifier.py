r"""The rule verifier of the debate environment: the score Verifier(q, s) in [0, 1] of an answer (MAPoRL, Section 3).

MAPoRL rewards each debate answer by a verifier's score (Definition 1). The environment takes any
:class:`Verifier`:

* :class:`RuleVerifier` (the default, ``DebateEnv(verifier="rule")``): 1.0 when the extracted final
  answer is correct (:func:`grade_answer`: math answers by :mod:`collab.envs.math.answers`, NLI
  labels by :func:`collab.envs.debate.datasets.extract_label`), else 0.0.
* a learned verifier (:mod:`collab.envs.debate.learned_verifier`: an MLP head on a frozen LM, its training
  loop and command line; its labelled examples: :mod:`collab.envs.debate.verifier_examples`), built
  outside ``envs/`` and handed to the env as an object; on the command line
  ``--data.env_options '{verifier: runs/verifier}'`` names its folder and the rollout data module loads
  it (:func:`collab.envs.debate.learned_verifier.load_verifier`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from collab.envs.debate.datasets import extract_label
from collab.envs.math.answers import extract_answer, is_equiv, normalize

__all__ = ["RuleVerifier", "Verifier", "grade_answer"]


def grade_answer(task: Mapping[str, Any], text: str, fallback: bool = True) -> tuple[str | None, bool]:
    r"""The rule verdict on one response: (its normalised final answer or ``None``, whether it is correct).

    NLI tasks (records with ``labels``): the extracted label. Math: the last ``\boxed{}``, else with
    ``fallback`` the last "answer is X" phrase or number, normalised (:func:`collab.envs.math.answers.normalize`)
    so that equal answers vote together; correct when equivalent to the gold answer.
    """
    if task.get("labels"):
        label = extract_label(text or "", task["labels"], fallback)
        return label, label is not None and label == task["answer"]
    pred = extract_answer(text or "", fallback=fallback)
    if not pred or not pred.strip():
        return None, False
    try:
        key = normalize(pred)
    except Exception:  # a malformed answer the normaliser cannot render: keep its text
        key = pred.strip()
    return key or pred.strip(), is_equiv(pred, str(task["answer"]))


class Verifier(ABC):
    """Scores answers: ``score(tasks, texts)[k]`` in [0, 1] is Verifier(q_k, s_k)."""

    @abstractmethod
    def score(self, tasks: Sequence[Mapping[str, Any]], texts: Sequence[str]) -> list[float]:
        """The score of each response ``texts[k]`` to ``tasks[k]``."""


class RuleVerifier(Verifier):
    """1.0 for a correct final answer, 0.0 otherwise (:func:`grade_answer`)."""

    def __init__(self, fallback: bool = True) -> None:
        self.fallback = fallback

    def score(self, tasks: Sequence[Mapping[str, Any]], texts: Sequence[str]) -> list[float]:
        return [float(grade_answer(t, x, self.fallback)[1]) for t, x in zip(tasks, texts, strict=True)]
