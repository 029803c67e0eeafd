"""Which agents a MARFT rollout trains, and when its updates stop: options where the paper is silent or gives a choice.

- ``critic_warmup``: the first N rollouts train the critic only (the actors stay fixed while the
  head learns the return scale; Section 5.3.1 notes the high early value loss);
- ``agent_schedule``: ``all`` (every agent every update, Eq. 2) or ``round_robin`` (one agent per
  rollout, in order: HAPPO's sequential updates, which the paper cites for monotonic improvement);
- ``target_kl`` (:meth:`collab.algos.marft.MARFT.accept`): stop a rollout's remaining minibatches once the
  approximate KL between the behaviour and current policies (k3 estimator, mean over the minibatch's decisions)
  exceeds it; the minibatch that crossed it is not applied. A rollout's first minibatch is on-policy, so every
  rollout makes at least one update.
"""

from __future__ import annotations

SCHEDULES = ("all", "round_robin")


def scheduled_agents(rollout: int, n: int, critic_warmup: int, schedule: str) -> list[int]:
    """The agents of a team of ``n`` that rollout number ``rollout`` (counted from 1) trains: all, one in turn
    (``round_robin``), none in the critic's warm-up."""
    after_warmup = rollout - 1 - critic_warmup  # this rollout's place (< 0: in the warm-up)
    return [] if after_warmup < 0 else list(range(n)) if schedule == "all" else [after_warmup % n]
