"""The training step every algorithm shares (``CollabModule.update``, issue 15).

Micro-batching is done once, in the skeleton, for every algorithm: a minibatch split into parts of at
most ``micro_batch_tokens`` padded tokens (here 1: every item alone) must give the gradient and the loss
of one pass over it, which holds only when each algorithm's loss divides by the whole minibatch's
normalisers (``normalizers``), not by the part's. MAPoRL's case is in tests/algos/test_maporl.py.
"""

from dataclasses import replace

import pytest
import torch

from tests.support import EarlySolveEnv, minibatch_gradient
from tests.algos.test_known_optimum import make

ALGOS = ["magrpo", "collm_cc", "collm_dc", "ippo", "marft_a", "marft_t"]


def gradient(module, batch, budget):
    module.micro_batch_tokens = budget
    params = [p for group in module.param_groups() for p in group["params"]]
    for p in params:
        p.grad = None
    stats = minibatch_gradient(module, batch)
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params], stats


@pytest.mark.parametrize("algo", ALGOS)
def test_micro_batches_give_the_gradient_of_one_pass(algo, one_thread):
    env = EarlySolveEnv(n_agents=2, horizon=2)
    module = make(algo, seed=0)
    module.build(env)
    module.rollouts = 1  # as in training: the first rollout's update (MARFT trains its actors from it)
    torch.manual_seed(0)
    experience = module.rollout(env.tasks("train") * 4)
    batch = module.prepare(experience)
    if algo == "magrpo":  # mixed signs and zeros, unequal counts per agent
        for j, s in enumerate(experience.items):
            s.advantages = float(j % 3) - 1.0
        batch = replace(batch, items=experience.items[:-1])
    items = batch.items
    whole, stats = gradient(module, batch, None)
    parts, part_stats = gradient(module, batch, 1)
    assert len(module.micro_batches(items)) == len(items) > 1
    assert any(g.abs().sum() > 0 for g in whole)
    for a, b in zip(whole, parts):  # another summation order: float32 noise relative to each tensor's scale
        assert torch.allclose(a, b, atol=1e-4 * float(a.abs().max()) + 1e-12, rtol=1e-4)
    assert part_stats["train/loss"] == pytest.approx(stats["train/loss"], rel=1e-4, abs=1e-6)
    assert set(part_stats) == set(stats)


def test_a_refused_update_moves_nothing_and_ends_the_rollout(one_thread):
    """MARFT's ``target_kl``: the skeleton asks ``accept`` after the backward passes; a refusal drops the
    gradient, takes no step and stops the rollout's remaining minibatches."""
    from tests.support import datamodule_for, quiet_fit

    env = EarlySolveEnv(n_agents=2, horizon=2)
    module = make("marft_a", seed=0)
    module.num_epochs, module.minibatch_size = 3, 2
    module.target_kl = 1e-3
    calls = []
    accept = module.accept
    module.accept = lambda stats, count, scale: calls.append(stats["train/approx_kl"]) or accept(stats, count, scale)
    module.build(env)
    before = {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}
    quiet_fit(module, datamodule_for(env, batch_size=2, seed=0), 1)
    # the first minibatch is on-policy (KL ~0: accepted); after that step the second one's is above the target
    assert calls[0] <= 1e-3 and len(calls) == 2 and calls[1] > 1e-3  # measured: 0.0 and 0.12
    moved = [n for n, p in module.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert moved  # the first update was applied


def test_every_algorithm_has_the_one_contract():
    """rollout(tasks) -> Experience, prepare(experience) -> Batch, normalizers(minibatch, batch, index) ->
    Normalizers, loss(micro, scale): the same signatures in every algorithm, and none of the old second names."""
    import inspect

    from collab.algos import algo_registry
    from collab.algos.base import CollabModule

    hooks = ("rollout", "prepare", "normalizers", "loss", "accept")
    for name, cls in algo_registry().items():
        for hook in hooks:
            ours = list(inspect.signature(getattr(cls, hook)).parameters)
            assert ours == list(inspect.signature(getattr(CollabModule, hook)).parameters), (name, hook, ours)
        assert not any(hasattr(cls, old) for old in ("losses", "begin_update", "accumulate", "optimizer_update")), name


def test_the_dataloader_yields_this_ranks_tasks_only():
    """The dataloader hands ``training_step`` the step's tasks, this rank's share (the module plays them itself)."""
    from types import SimpleNamespace

    from collab.algos import data_from_config
    from collab.rollout.datamodule import TaskStream, shard

    dm = data_from_config("magrpo", env="matrix", batch_size=4, seed=0)
    tasks = [{"id": i} for i in range(8)]
    dm.stream = TaskStream(tasks, 4, True, 0)
    expected = TaskStream(tasks, 4, True, 0)
    dm.trainer = SimpleNamespace(world_size=2, global_rank=1)
    batches = iter(dm.train_dataloader())
    for _ in range(3):
        assert next(batches) == shard(expected.next(), 1, 2)
