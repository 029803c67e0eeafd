"""``--trainer.max_steps`` counts optimizer updates; a rollout gives ``num_epochs`` of them (whole-rollout updates).
A ``max_steps`` that is not a whole number of rollouts is said in one line at the start, and the run ends at
``max_steps`` inside the last rollout's updates: the progress line and the checkpoint count what was asked for."""

import json

import pytest
import torch

from collab.runtime.collectives import steps_note


@pytest.mark.parametrize(
    "max_steps,num_epochs,minibatch_size,expected",
    [
        (5, 2, None, "the run makes 3 rollouts, the last stopped after 1 of its updates"),
        (7, 3, None, "the run makes 3 rollouts, the last stopped after 1 of its updates"),
        (8, 3, None, "the run makes 3 rollouts, the last stopped after 2 of its updates"),
        (4, 2, None, ""),  # whole rollouts
        (5, 1, None, ""),  # one update a rollout
        (5, 2, 4, ""),  # minibatches of 4 items: their number depends on each rollout
        (-1, 2, None, ""),  # no max_steps
    ],
)
def test_the_start_line(max_steps, num_epochs, minibatch_size, expected):
    note = steps_note(max_steps, num_epochs, minibatch_size)
    assert (expected in note and note.startswith(f"--trainer.max_steps {max_steps} ")) if expected else note == ""


def test_a_run_ends_at_max_steps_inside_a_rollout(tmp_path, monkeypatch, capsys, one_thread):
    """MAGRPO with 2 epochs a rollout and max_steps 3: two rollouts, the second stopped after its first update."""
    from collab.fit import main

    monkeypatch.chdir(tmp_path)
    argv = ["--algo", "magrpo", "--model.base.name", "tiny", "--trainer.accelerator", "cpu"]
    argv += [
        "--data.env",
        "matrix",
        "--data.env_options",
        "{}",
        "--data.batch_size",
        "1",
        "--model.ppo.num_epochs",
        "2",
    ]
    argv += ["--model.agent_lr", "1e-2", "--model.kl_coef", "0.01", "--trainer.max_steps", "3"]
    callbacks = [{"class_path": "collab.training.callbacks.ModelCheckpoint", "init_args": {"save_last": True}}]
    assert main([*argv, "--trainer.callbacks", json.dumps(callbacks)]) == 0
    out = capsys.readouterr().out
    note = (
        "--trainer.max_steps 3 is not a whole number of rollouts of 2 updates (model.ppo.num_epochs): the run makes 2"
    )
    assert out.count(note) == 1, out
    assert "step 3/3" in out and "step 4/3" not in out, out
    (ckpt,) = (tmp_path / "runs").rglob("last.ckpt")
    assert torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] == 3
