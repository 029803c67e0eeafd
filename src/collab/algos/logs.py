"""What a training step logs: the rollout's and the update's scalars, and now and then sample texts.

Every rank plays its own rollout, so each scalar is logged as its mean over the ranks (the global mean, the
ranks playing equal shares of the step's tasks): the same values on every rank. The progress bar shows the
return and the decoding speed; TensorBoard gets the sample texts every ``log_samples_every`` rollouts.
"""

from __future__ import annotations

from collab.rollout.experience import Experience
from collab.runtime.collectives import global_means


def log_rollout(module, experience: Experience, metrics: dict[str, float]) -> None:
    """Log the rollout's statistics and ``metrics`` (the batch's and the update's) through ``module`` (the
    :class:`~collab.algos.base.CollabModule` that played it) and, every ``log_samples_every`` rollouts, sample
    texts."""
    engine = module.team.engine
    if engine is not None:  # adapter exports so far, their versions, vLLM's log-prob agreement
        metrics = {**metrics, **engine.metrics()}
    scalars = global_means(module, {**experience.stats, **metrics, "rollout/count": float(module.rollouts)})
    bar = {
        "reward": scalars.get("reward/return", float("nan")),
        "tok_s": scalars.get("rollout/tokens_per_s", float("nan")),
    }
    module.log_dict(bar, prog_bar=True, logger=False, on_step=True, batch_size=1)
    module.log_dict(scalars, on_step=True, batch_size=1)
    logger = module.logger
    if logger is not None and experience.examples and (module.rollouts - 1) % max(module.log_samples_every, 1) == 0:
        experiment = getattr(logger, "experiment", None)
        if hasattr(experiment, "add_text"):
            text = "\n\n---\n\n".join(
                "\n\n".join(
                    f"**{module.team.specs[i].role}** (reward {ex['reward'][i]:.3f}): {r}"
                    for i, r in enumerate(ex["responses"])
                )
                for ex in experience.examples
            )
            experiment.add_text("samples", text, module.global_step)
