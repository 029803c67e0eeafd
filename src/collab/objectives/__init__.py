"""The math of collab's algorithms as small pure tensor functions.

Every function here is unit-tested against a hand computation (tests/algos/test_objectives.py).
Algorithm files call these and read like the papers' pseudo-code. Import them from here
(``from collab.objectives import gae``); they live by topic:

- :mod:`~collab.objectives.returns`: returns and advantages. ``discounted_returns``,
  ``absorbing_reward``, ``group_advantages`` (and its ``BASELINES``; MAGRPO, CoLLM), ``low_mean_groups`` and
  ``best_joint`` (AT-GRPO),
  ``num_inference_calls`` (CoLLM Prop. 3.2), ``td_targets``, ``td_errors``, ``gae``, ``normalize``,
  ``mixed_rewards``, and MARFT's decision chain: ``chain``, ``bellman_targets``.
- :mod:`~collab.objectives.policy`: policy losses. ``clipped_surrogate``, ``ratio_stats``, ``kl_k3``.
- :mod:`~collab.objectives.preference`: MADPO's preference loss. ``preference_pairs`` (and its
  ``PAIR_SELECTIONS``), ``joint_log_ratios``, ``joint_dpo_loss``; MARLHF's ``bradley_terry_loss``.
- :mod:`~collab.objectives.critic`: critic losses. ``value_loss``, ``explained_variance``.
- :mod:`~collab.objectives.debate`: MAPoRL's debate rewards. ``influence_rewards``, ``majority_vote``,
  ``majority_of_others``, ``majority_of_others_table``, ``revision_incentives``,
  ``influence_incentives``, ``debate_rewards``, ``absorb``, ``episode_rewards``, ``token_rewards``.
"""

from collab.objectives.critic import explained_variance, value_loss
from collab.objectives.debate import (
    absorb,
    debate_rewards,
    episode_rewards,
    influence_incentives,
    influence_rewards,
    majority_of_others,
    majority_of_others_table,
    majority_vote,
    revision_incentives,
    token_rewards,
)
from collab.objectives.policy import clipped_surrogate, kl_k3, ratio_stats
from collab.objectives.preference import (
    PAIR_SELECTIONS,
    bradley_terry_loss,
    joint_dpo_loss,
    joint_log_ratios,
    preference_pairs,
)
from collab.objectives.returns import (
    BASELINES,
    absorbing_reward,
    bellman_targets,
    best_joint,
    chain,
    discounted_returns,
    gae,
    group_advantages,
    low_mean_groups,
    mixed_rewards,
    normalize,
    num_inference_calls,
    td_errors,
    td_targets,
)

__all__ = [
    "BASELINES",
    "PAIR_SELECTIONS",
    "absorb",
    "absorbing_reward",
    "bellman_targets",
    "best_joint",
    "bradley_terry_loss",
    "chain",
    "clipped_surrogate",
    "debate_rewards",
    "discounted_returns",
    "episode_rewards",
    "explained_variance",
    "gae",
    "group_advantages",
    "low_mean_groups",
    "influence_incentives",
    "influence_rewards",
    "joint_dpo_loss",
    "joint_log_ratios",
    "kl_k3",
    "majority_of_others",
    "majority_of_others_table",
    "majority_vote",
    "mixed_rewards",
    "normalize",
    "num_inference_calls",
    "preference_pairs",
    "ratio_stats",
    "revision_incentives",
    "td_errors",
    "td_targets",
    "token_rewards",
    "value_loss",
]
