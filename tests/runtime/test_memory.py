"""Micro-batches sized from a memory budget (collab.runtime.memory, ``micro_batch_tokens: auto``)."""

from __future__ import annotations

import pytest
import torch

from collab.runtime import memory


@pytest.fixture(scope="module")
def teams():
    from collab.policy.models import BaseConfig
    from collab.policy.team import AgentSpec, AgentTeam

    teams = {
        gc: AgentTeam([AgentSpec(role="a")], BaseConfig(name="tiny", gradient_checkpointing=gc)) for gc in (False, True)
    }
    for team in teams.values():
        team.train()  # as in an update, where the probe runs (transformers checkpoints in train mode only)
    return teams


def saved_only(team) -> float:
    """Bytes a token that the probe's forward saves for the backward (weights not counted)."""
    seen, _ = memory.saved_for_backward(lambda: team.logprobs(0, [list(range(10, 42))], [list(range(42, 74))]))
    weights = {p.untyped_storage().data_ptr() for p in team.parameters()}
    return sum(n for ptr, n in seen.items() if ptr not in weights) / memory.PROBE_TOKENS


def test_bytes_per_token_are_the_activations_saved_for_the_backward(teams):
    plain, checkpointed = (memory.bytes_per_token(teams[gc]) for gc in (False, True))
    # the tiny Llama: 2 layers of hidden 64, intermediate 128; a float32 layer saves some tens of values per token
    assert 2 * 64 * 4 < plain < 2 * 64 * 4 * 100
    assert plain == saved_only(teams[False])
    inputs = saved_only(teams[True])
    assert inputs < plain / 2  # checkpointing saves each layer's input only
    # and its backward holds RECOMPUTE times what a layer's forward saves without checkpoints besides
    team = teams[True]
    layers = memory.checkpointed_layers(team.model_of(0))
    weights = {p.untyped_storage().data_ptr() for p in team.parameters()}
    with memory.checkpointing_off(layers):
        whole = saved_only(team)
        per_layer = memory.saved_in_layers(
            lambda: team.logprobs(0, [list(range(10, 42))], [list(range(42, 74))]), layers, weights
        )
    assert len(layers) == 2 and per_layer[0] == per_layer[1] > 0  # two layers of one shape save alike
    assert sum(per_layer) / memory.PROBE_TOKENS < whole  # the embeddings' and the head's inputs are outside them
    assert checkpointed == pytest.approx(inputs + memory.RECOMPUTE * per_layer[0] / memory.PROBE_TOKENS, rel=1e-12)
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

    def is_graph(o) -> bool:  # type(), not isinstance(): isinstance reads o.__class__, and torch's deprecated
        return issubclass(type(o), torch.Tensor) and o.grad_fn is not None  # aliases warn when it is read

    before = {id(o) for o in gc.get_objects() if is_graph(o)}
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
    graphs = [o for o in gc.get_objects() if is_graph(o) and id(o) not in before]
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


def peak_allocated(fn) -> int:
    """The most bytes torch's CPU allocator held at once while ``fn`` ran, above what it held before (the profiler's
    allocation events: every tensor, exactly)."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
    return max(totals) - (totals[0] - events[[e.get("name") for e in events].index("[memory]")]["args"]["Bytes"])


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory) -> str:
    """A 4-layer Llama of width 512 (intermediate 2,048): under checkpointing a layer's activations are many times
    its saved input, as at the papers' widths."""
    from tests.support.architectures import model_dir

    shape = dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8)
    return model_dir("llama", tmp_path_factory.mktemp("wide"), **shape)


def test_a_checkpointed_micro_batch_stays_within_its_budget(wide_model, monkeypatch):
    """Under gradient checkpointing the forward saves only each layer's input, but the backward runs each layer
    again and holds its activations and their gradients: an ``auto`` micro-batch counts them, and its forward and
    backward stay within the budget (the saved inputs alone undercount the peak several times: a micro-batch
    sized on them overruns it, as a 3B model's update did, by 6 GB). The output head's chunks of logits, a fixed
    64 MiB that the budget's headroom holds, are cut to 1 MiB here, where the budget is 30 MiB."""
    from collab.policy import head
    from collab.policy.models import BaseConfig
    from collab.policy.team import AgentSpec, AgentTeam

    monkeypatch.setattr(head, "chunk_tokens", lambda vocab: max(1, 2**20 // (4 * vocab)))

    torch.manual_seed(0)
    team = AgentTeam([AgentSpec(role="a")], BaseConfig(name=wide_model, gradient_checkpointing=True))
    team.train()
    budget = 0.03 * 2**30
    tokens, _ = memory.auto_tokens(team, torch.device("cpu"), 0.03)
    rows, length = 4, tokens // 4
    prompts = [list(range(10 + r, 10 + r + length // 2)) for r in range(rows)]
    completions = [list(range(500 + r, 500 + r + length - length // 2)) for r in range(rows)]
    peak = peak_allocated(lambda: sum(t.sum() for t in team.logprobs(0, prompts, completions)).backward())
    assert peak <= budget, (peak, budget, tokens)
    layers = memory.checkpointed_layers(team.model_of(0))
    with memory.checkpointing_off(layers):
        assert len(memory.checkpointed_layers(team.model_of(0))) == 0
    assert len(memory.checkpointed_layers(team.model_of(0))) == len(layers) == 4
    # the estimate of the saved inputs alone was more than twice short of the peak
    assert peak / (rows * length) > 2 * saved_only(team) * memory.SAFETY
