"""The coding collaboration reward (CoLLM, F.2; weights from the CoopHumanEval reference, max 4.0).

Levels, evaluated in order; a failed level stops the evaluation (``stage`` names it) and the later
levels earn nothing:

1. structure: aux defined with a ``return`` +0.4 (not a stop); main defined with a ``return`` +0.6,
   else stop;
2. syntax: the concatenated code parses (``ast``) +0.5, else stop;
3. tests: +1.0 x passed / total, each assert of ``check(candidate)`` run on its own with a timeout
   (8 s in the paper); stop if none passes;
4. cooperation, when aux is defined: +0.5 when main calls aux, +1.0 more when main is not a thin
   wrapper of aux, and -0.5 when main discards aux's return value.

"Stop" here ends the *reward evaluation*, as F.2 words it ("evaluation termination"); whether the
episode also ends is the environment's choice (:class:`~collab.envs.coding.env.CodingEnv`,
``stop_on_failure``). The discard penalty applies whenever main calls aux and throws a value away,
including alongside the wrapper bonus, so a main that calls aux for show (``aux(x)`` as a statement)
nets 0.5 + 1.0 - 0.5 = 1.0 instead of the full 1.5; it cannot fire without a call, since it needs one.
"""

from __future__ import annotations

from dataclasses import dataclass

from collab.envs.coding.static import CodeFacts

STAGES = ("structure", "syntax", "tests", "cooperation", "complete")


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the levels (the defaults sum to the maximum, 4.0)."""

    aux_defined: float = 0.4
    main_defined: float = 0.6
    syntax: float = 0.5
    tests: float = 1.0
    calls_aux: float = 0.5
    not_wrapper: float = 1.0
    discard_penalty: float = 0.5

    @property
    def maximum(self) -> float:
        return self.aux_defined + self.main_defined + self.syntax + self.tests + self.calls_aux + self.not_wrapper


def cooperation_reward(facts: CodeFacts, w: RewardWeights) -> float:
    """Level 4 (only reached with at least one passing test): bonus for using aux, penalty for discarding it."""
    if not facts.aux_defined or not facts.calls_aux:
        return 0.0
    value = w.calls_aux + (0.0 if facts.thin_wrapper else w.not_wrapper)
    return value - (w.discard_penalty if facts.discards_aux else 0.0)


def coding_reward(
    facts: CodeFacts, n_passed: int, n_total: int, weights: RewardWeights | None = None
) -> tuple[float, str, dict[str, float]]:
    """Total reward, the stage where the evaluation stopped (``complete`` if none), and the components.

    ``n_passed`` / ``n_total`` are the test counts; they are ignored (and need not have been run)
    when the evaluation stops before the tests.
    """
    w = weights or RewardWeights()
    parts = {"structure": 0.0, "syntax": 0.0, "tests": 0.0, "cooperation": 0.0}
    parts["structure"] = w.aux_defined if facts.aux_defined else 0.0
    stage = "complete"
    if not facts.main_defined:
        stage = "structure"
    else:
        parts["structure"] += w.main_defined
        if not facts.syntax_ok:
            stage = "syntax"
        else:
            parts["syntax"] = w.syntax
            if n_passed <= 0:
                stage = "tests"
            else:
                parts["tests"] = w.tests * n_passed / max(n_total, 1)
                parts["cooperation"] = cooperation_reward(facts, w)
    return sum(parts.values()), stage, parts
