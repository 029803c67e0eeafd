"""One environment where every algorithm trains: the ``debate`` env on ``small_addition``, with 4 debaters.

MAPoRL trains only a debate; the other six take the debate as a POSG with per-agent rewards (each agent's
verifier score). Each algorithm runs ``collab.fit`` for one update on the tiny model with a team of four (the
environment's ``agents: 4`` under each algorithm's config of two agents: the two more repeat the second's
settings, ``collab.algos.agents``) and must log the debate's own metrics (every turn's majority vote) and end
with its step-1 checkpoint of the four agents. The tiny model's answers
are noise, so the reward is not asserted here; learning is the known-optimum tests'
(tests/algos/test_known_optimum.py) and the default runs'
(docs/measurements.md).
"""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.support import fit, load
from tests.support.algos import algos, settings

DEBATE = [
    "--data.env",
    "debate",
    "--data.env_options",
    "{dataset: small_addition, max_new_tokens: 6, agents: 4}",
    "--data.batch_size",
    "1",
    "--model.micro_batch_tokens",
    "4096",
    "--trainer.callbacks",
    "[{class_path: collab.training.callbacks.ModelCheckpoint, init_args: {save_last: true}}]",
]


@pytest.mark.parametrize("algo", algos())
def test_every_algorithm_trains_on_the_debate(algo, tmp_path):
    run = fit(tmp_path, algo, [*DEBATE, *settings(algo).debate], steps=1)
    events = EventAccumulator(str(next(run.glob("events.out.tfevents.*"))))
    events.Reload()
    for tag in ("env/majority@1", "env/majority@2", "reward/return"):
        assert [e.step for e in events.Scalars(tag)] == [0], (algo, tag)
    saved = load(run)
    assert saved["global_step"] == 1
    roles = ["agent1", "agent2", "agent3", "agent4"]
    assert saved["collab"]["agents"] == (roles * 2 if settings(algo).agent_per_turn else roles)  # 2 turns
