"""One MAGRPO update on the tiny model per PettingLLMs grid game (plan_path, sudoku, sokoban): a 2-turn tree
(K = 2) of the tool and plan agents, every turn's programs run in the sandbox. The tiny model's responses are noise,
so the rewards are not asserted here (the hand computations are in test_plan_path.py, test_sudoku.py and
test_sokoban.py); that the run logs each role's per-turn reward and the env's components, and ends with its step-1
checkpoint of the two roles, is."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.support import fit, load


@pytest.mark.parametrize("env", ["plan_path", "sudoku", "sokoban"])
def test_one_magrpo_update(env, tmp_path):
    args = ["--data.env", env, "--data.env_options", "{num_train: 4, num_eval: 2, max_new_tokens: 16}"]
    args += ["--data.num_turns", "2", "--model.num_generations", "2", "--data.batch_size", "1"]
    args += [
        "--trainer.callbacks",
        "[{class_path: collab.training.callbacks.ModelCheckpoint, init_args: {save_last: true}}]",
    ]
    run = fit(tmp_path, "magrpo", args, steps=1)
    events = EventAccumulator(str(next(run.glob("events.out.tfevents.*"))))
    events.Reload()
    tags = [f"reward/turn{t}/agent{i}" for t in (0, 1) for i in (0, 1)]
    tags += ["env/plan_reward", "env/tool_reward", "env/plan_parsed", "env/tool_parsed", "env/solved"]
    for tag in tags:
        assert [e.step for e in events.Scalars(tag)] == [0], tag
    for tag in ("env/plan_parsed", "env/tool_parsed", "env/solved"):
        assert 0.0 <= events.Scalars(tag)[0].value <= 1.0, tag
    saved = load(run)
    assert saved["global_step"] == 1 and saved["collab"]["agents"] == ["tool", "plan"]
