"""A resumed run is the uninterrupted run, bitwise.

Every algorithm trains 4 optimizer steps straight, and 2 steps then ``--ckpt_path .../last.ckpt`` to 4,
through ``collab.fit`` (its shipped config, the tiny model, the CPU, one thread); the two end with
equal adapters, heads and optimizer states (``torch.equal``), equal random and task-stream states,
equal ``adapters/last`` folders and the same reward for every rollout, and ``last.ckpt`` holds the
final step. The resumed run's ``reward_summary.json`` covers all 4 rollouts.
"""

import json
from pathlib import Path

import pytest

from tests.support import SAMPLE_THE_POLICY_ARGS, adapters, assert_same_tensors, fit, load
from tests.support.algos import algos, settings

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_thread")


# What each algorithm's test plays (tests/support/algos.py's ``resume``), and MARFT-A with the Reasoner's turns
# opening a calculator call (collab.tools): rounds, inserted tokens and own-token masks
ALGOS = {
    **{algo: settings(algo).resume for algo in algos()},
    "marft_a+tools": lambda tmp: [
        "--data.env_options",
        "{dataset: small_addition, profile: duo, tools: {0: [calculator]}, tool_choice: calculator}",
        "--model.agents",
        "[{sampling: {max_new_tokens: 8}}, {sampling: {max_new_tokens: 4}}]",
        *SAMPLE_THE_POLICY_ARGS,
        "--data.batch_size",
        "2",
    ],
}


@pytest.mark.parametrize("algo", list(ALGOS))
def test_resume_repeats_the_uninterrupted_run_bitwise(algo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ALGOS[algo](tmp_path)
    algo = algo.split("+")[0]
    straight = fit(tmp_path / "straight", algo, args, 4)
    part = fit(tmp_path / "parts", algo, args, 2)
    resumed = fit(tmp_path / "parts", algo, args, 4, part / "checkpoints" / "last.ckpt")
    assert resumed != part  # a new version folder

    a, p, r = load(straight), load(part), load(resumed)
    assert (a["global_step"], p["global_step"], r["global_step"]) == (4, 2, 4)  # last.ckpt: the final step
    assert a["state_dict"] and a["state_dict"].keys() == r["state_dict"].keys()
    assert_same_tensors(a["state_dict"], r["state_dict"], "state_dict")  # adapters, critics, heads
    assert_same_tensors(a["optimizer_states"], r["optimizer_states"], "optimizer")
    assert_same_tensors(a["collab"], r["collab"], "collab")  # rollouts, random state of torch/python/numpy
    assert_same_tensors(a["RolloutDataModule"], r["RolloutDataModule"], "task stream")
    assert_same_tensors(adapters(straight), adapters(resumed), "adapters/last")

    rewards = json.loads((straight / "reward_summary.json").read_text())
    continued = json.loads((resumed / "reward_summary.json").read_text())
    assert continued["rollouts"] == rewards["rollouts"] == a["collab"]["rollouts"]
    assert continued["rewards"] == rewards["rewards"]  # every rollout, before and after the resume
    # the rewards say something (MARFT-T: 2 rollouts; the tiny model never adds right: all 0)
    assert len(set(rewards["rewards"])) > 1 or algo == "marft_t" or "tools" in str(args)


def test_a_snapshot_copies_what_a_step_changes_and_references_what_only_an_optimizer_step_does():
    """``collab.training.resume.frozen``: a step's snapshot (what a stop inside the next step saves) keeps the
    weights and optimizer moments by reference, and copies the rest, which the next step's rollout changes."""
    from collections import OrderedDict, defaultdict, namedtuple

    import numpy as np
    import torch

    from collab.training.resume import frozen

    weight, moment, rng = torch.ones(3), torch.zeros(3), torch.arange(4, dtype=torch.uint8)
    Pair = namedtuple("Pair", "a b")
    order, counts = [3, 1, 2], defaultdict(int, {"rollouts": 2})
    checkpoint = {
        "state_dict": OrderedDict(w=weight),
        "optimizer_states": [{"state": {0: {"exp_avg": moment}}}],
        "collab": {"rng": [rng], "np": np.arange(3), "pair": Pair(1, [5])},
        "stream": {"order": order, "counts": counts},
    }
    shared = {t.untyped_storage().data_ptr() for t in (weight, moment)}
    snap = frozen(checkpoint, shared)
    weight.add_(1)
    moment.add_(1)  # an optimizer step: the snapshot is no longer valid, and sees it (collab checks global_step)
    assert torch.equal(snap["state_dict"]["w"], weight) and torch.equal(
        snap["optimizer_states"][0]["state"][0]["exp_avg"], moment
    )
    rng.add_(1)  # what a rollout changes: the snapshot keeps the step end's values
    order.pop(0)
    counts["rollouts"] += 1
    checkpoint["collab"]["np"][0] = 9
    checkpoint["collab"]["pair"].b.append(6)
    assert snap["collab"]["rng"][0].tolist() == [0, 1, 2, 3] and snap["stream"]["order"] == [3, 1, 2]
    assert snap["stream"]["counts"] == {"rollouts": 2} and isinstance(snap["stream"]["counts"], defaultdict)
    assert snap["collab"]["np"].tolist() == [0, 1, 2] and snap["collab"]["pair"] == Pair(1, [5])
    assert isinstance(snap["state_dict"], OrderedDict) and isinstance(snap["collab"]["pair"], Pair)
