"""The ClassEval team reward: OpenMLRL/LLM_Collab_Code_Completion (read at 1b754a3), ``rewards/CE_reward.py``,
``get_reward_function``, rules R1-R4.

No paper states this task's reward (the MAGRPO and CoLLM papers have no ClassEval task), so the reference code is
the only definition and collab has one mode, the reference's:

- R1 (lv1, syntax): 2 x (methods whose assigned agent wrote a snippet that parses) / (methods to write);
- R2 (lv2, tests): 4 x passed / tests run (:mod:`~collab.envs.classeval.runner`, T3-T5: after three timeouts the
  tests not run leave the denominator; no result line: 0);
- R3 (lv3, overlap): -(methods that two agents or more wrote, assigned or not) / (methods to write);
- R4: the total is lv1 + lv2 + lv3, summed in that order, but 0 when the class and its tests do not compile; a
  class with no method to write has lv1 = lv3 = 0.

The range is [-1, 6]; the reference's config subtracts 6 afterwards (``reward_processor.shift: -6``), collab's
``reward_shift`` option.
"""

from __future__ import annotations

__all__ = ["REWARD_MAX", "classeval_reward"]

REWARD_MAX = 6.0


def classeval_reward(
    valid: int, methods: int, overlap: int, compiles: bool, passed: int, run: int
) -> tuple[float, dict[str, float]]:
    """R1-R4: (total, the levels by name)."""
    lv1 = 2.0 * (float(valid) / float(methods)) if methods > 0 else 0.0
    lv3 = -float(overlap) / float(methods) if methods > 0 else 0.0
    lv2 = 4.0 * float(passed) / float(run) if compiles and run > 0 else 0.0
    total = float(lv1 + lv2 + lv3) if compiles else 0.0
    return total, {"lv1_syntax": lv1, "lv2_tests": lv2, "lv3_overlap": lv3}
