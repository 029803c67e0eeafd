"""Micro-batches sized from a memory budget (collab.runtime.memory, ``micro_batch_tokens: auto``)."""

from __future__ import annotations

import pytest
import torch

from collab.runtime import memory


@pytest.fixture(scope="module")
def teams():
    from collab.policy.models import BaseConfig
    from collab.policy.team import AgentSpec, AgentTeam

    return {
        gc: AgentTeam([AgentSpec(role="a")], BaseConfig(name="tiny", gradient_checkpointing=gc)) for gc in (False, True)
    }


def test_bytes_per_token_are_the_activations_saved_for_the_backward(teams):
    plain, checkpointed = (memory.bytes_per_token(teams[gc]) for gc in (False, True))
    # the tiny Llama: 2 layers of hidden 64, intermediate 128; a float32 layer saves some tens of values per token
    assert 2 * 64 * 4 < plain < 2 * 64 * 4 * 100
    assert checkpointed < plain  # checkpointing keeps each layer's input only
    # no weight counts (the output head alone is 49,152 x 64 x 4 bytes, 188 times a token's bytes here)
    assert plain * memory.PROBE_TOKENS < 49_152 * 64 * 4


@pytest.mark.parametrize("algo, env", [("magrpo", "writing"), ("marft_a", "math")])
def test_a_fitted_module_leaves_nothing_alive(algo, env, tmp_path):
    """A notebook or a sweep fits several modules in one process: once the trainer, module and data are deleted,
    no parameter and no autograd graph of the run may stay. The micro-batch probe (``micro_batch_tokens: auto``,
    the default) must not hand autograd's saved op outputs back as themselves: that makes a cycle through the
    C++ graph that ``gc`` cannot see, which keeps the probe's graph and every weight it saved alive (a whole base
    a run: docs/measurements.md, the H200 sections)."""
    import gc
    import weakref

    import lightning as L

    from collab.algos import data_from_config, from_config

    before = {id(o) for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.grad_fn is not None}
    module = from_config(algo, base={"name": "tiny"}, agents=None)
    data = data_from_config(algo, env=env, batch_size=2, seed=0)
    trainer = L.Trainer(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, data)
    params = [weakref.ref(p) for p in module.parameters()]
    assert params
    del trainer, module, data
    gc.collect()
    assert sum(ref() is not None for ref in params) == 0
    graphs = [
        o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.grad_fn is not None and id(o) not in before
    ]
    assert graphs == []  # (other tests' graphs, alive before, are not this run's)


def test_the_size_fits_the_budget(teams):
    team = teams[False]
    per_token = memory.bytes_per_token(team) * memory.SAFETY
    tokens, line = memory.auto_tokens(team, torch.device("cpu"), 0.01)
    budget = 0.01 * 2**30
    assert tokens * per_token <= budget < (tokens + 1) * per_token
    assert line.startswith(f"micro-batches: {tokens} padded tokens") and "--model.micro_batch_memory_gb" in line


def test_the_default_budget_is_a_share_of_the_total_memory(monkeypatch):
    monkeypatch.setattr(memory, "total_ram", lambda: 8 * 2**30)
    assert memory.budget_bytes(torch.device("cpu"), None) == 2**29  # 1/16 of 8 GiB
    monkeypatch.setattr(memory, "total_ram", lambda: 64 * 2**30)
    assert memory.budget_bytes(torch.device("cpu"), None) == 2**30  # at most 1 GiB
    assert memory.budget_bytes(torch.device("cpu"), 2.5) == int(2.5 * 2**30)


def test_a_run_decides_once_and_its_checkpoint_keeps_the_size(monkeypatch, capsys):
    from collab.algos import from_config

    module = from_config(
        "magrpo", base={"name": "tiny"}, agents=None, micro_batch_tokens="auto", micro_batch_memory_gb=0.05
    )
    from collab.envs import make_env

    module.build(make_env("math", dataset="addition", profile="solo"))
    calls = []
    measure = memory.auto_tokens
    monkeypatch.setattr(memory, "auto_tokens", lambda *a: calls.append(a) or measure(*a))
    size = module.micro_tokens()
    assert module.micro_tokens() == size > 1 and len(calls) == 1  # measured once
    assert capsys.readouterr().err.count("micro-batches: ") == 1
    checkpoint = {"state_dict": {}}
    monkeypatch.setattr("collab.algos.base.gather_per_rank", lambda obj: [obj])
    module.on_save_checkpoint(checkpoint)
    assert checkpoint["collab"]["micro_batch_tokens"] == size
    resumed = from_config(
        "magrpo", base={"name": "tiny"}, agents=None, micro_batch_tokens="auto", micro_batch_memory_gb=0.05
    )
    resumed.on_load_checkpoint(checkpoint)
    monkeypatch.setattr(memory, "auto_tokens", lambda *a: pytest.fail("a resumed run measured again"))
    assert resumed.micro_tokens() == size


_FREED_BUT_HELD = """
import sys
import torch
from collab.runtime.memory import release

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))

start = rss()
tensors = [torch.ones(16384) for _ in range(4000)]  # 64 KiB each, 250 MiB: from glibc's heap, not mmap
last = tensors[-1]  # the heap's top stays in use: free() alone cannot shrink it
del tensors
held = rss()
released = release()
print(held - start, held - rss(), released)
"""


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="/proc and glibc")
def test_release_gives_freed_tensors_memory_back_to_the_os():
    """A phase's freed tensors stay in the process's resident memory (glibc keeps its heap's pages) until
    ``release``: measured in a fresh process, so that the heap holds only this pattern."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FREED_BUT_HELD], capture_output=True, text=True, check=True)
    grown, returned, released = out.stdout.split()
    assert released == "True"
    assert int(grown) > 200 * 2**20  # freed, yet still resident (measured: 253 MiB of 250 MiB allocated)
    assert int(returned) > 0.9 * int(grown)  # measured: 251 MiB back
