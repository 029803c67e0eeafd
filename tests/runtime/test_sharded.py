"""The sharded frozen base (collab.runtime.sharded, ``--trainer.strategy fsdp``) on 2 gloo processes.

The processes do different work, as collab's ranks do: rank 0 decodes 3 prompts (its responses end at
different lengths) and takes two log-prob forwards with a backward each; rank 1 decodes one prompt for
more steps and takes one forward without gradients. Every result (tokens, log-probs, adapter
gradients) must equal what the same process computed with the whole base before sharding, each
process must hold half of every sharded weight, and after :func:`settle` both must meet in an
ordinary collective (no process waits for a layer while the other waits elsewhere). Rank 0's backward is
taken once more with gradient checkpointing (each layer's forward recomputed inside the backward).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _team():
    from collab.policy.models import BaseConfig
    from collab.policy.team import AgentSpec, AgentTeam, SamplingSpec

    team = AgentTeam(
        [
            AgentSpec(role="a", sampling=SamplingSpec(temperature=0.0)),
            AgentSpec(role="b", sampling=SamplingSpec(temperature=0.0)),
        ],
        BaseConfig(name="tiny"),
    )
    torch.manual_seed(1)
    with torch.no_grad():  # random nonzero B: the two agents' outputs differ
        for name, p in team.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return team


def _work(team, rank: int) -> dict:
    """Rank 0: 3 prompts decoded, 2 forwards with a backward; rank 1: 1 prompt, longer, 1 forward without gradients."""
    from collab.policy.sampling import GenerationRequest

    prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12]] if rank == 0 else [[20, 21, 22]]
    limit = 5 if rank == 0 else 9
    outs = team.generate([GenerationRequest(i % 2, p) for i, p in enumerate(prompts)], max_new_tokens=limit)
    tokens = [o[0].completion_ids for o in outs]
    result = {"tokens": tokens, "logprobs": [], "grads": None}
    team.zero_grad(set_to_none=True)
    for _ in range(2 if rank == 0 else 1):
        if rank == 0:
            lp = team.logprobs([0, 1, 0], prompts, tokens)
            torch.stack([x.sum() for x in lp]).sum().backward()
        else:
            with torch.no_grad():
                lp = team.logprobs([1], prompts, tokens)
        result["logprobs"].append([x.detach().clone() for x in lp])
    if rank == 0:
        result["grads"] = {n: p.grad.clone() for n, p in team.named_parameters() if p.grad is not None}
    return result


def checkpointing(team, on: bool) -> None:
    """Gradient checkpointing on or off, as ``BaseConfig(gradient_checkpointing=...)`` builds the team."""
    from dataclasses import replace

    from collab.policy.adapters import recompute_with_forward_adapters

    team.base_config = replace(team.base_config, gradient_checkpointing=on)
    for model in team.models.values():
        if on:
            recompute_with_forward_adapters(model)
        else:
            model.base_model.model.gradient_checkpointing_disable()
    team.train()


def _worker(rank: int, folder: str) -> None:
    from datetime import timedelta

    torch.set_num_threads(1)  # a file rendezvous: no port to race for; a stuck collective fails within 2 minutes
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=2, timeout=timedelta(seconds=120)
    )
    try:
        from collab.runtime import sharded

        team = _team()
        whole = _work(team, rank)
        checkpointing(team, True)
        whole["checkpointed"] = _work(team, rank)["grads"]
        checkpointing(team, False)
        gatherer = sharded.shard_frozen(team, dist.new_group(backend="gloo"), rank, 2)
        assert not any(p.numel() > 10_000 for p in team.parameters()), "a large weight is still a parameter"
        split = _work(team, rank)
        plain = gatherer.rounds
        checkpointing(team, True)  # rank 0's backward again, recomputing each layer's forward inside it
        split["checkpointed"] = _work(team, rank)["grads"]
        split["rounds"] = (plain, gatherer.rounds - plain)  # the second pass recomputes forwards: more rounds
        sharded.settle()
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total)  # an ordinary collective after settling: both processes reach it
        torch.save(
            {
                "whole": whole,
                "split": split,
                "local": gatherer.local_bytes(),
                "all": gatherer.whole_bytes(),
                "units": len(gatherer.shards),
                "rounds": gatherer.rounds,
                "sum": float(total),
            },
            os.path.join(folder, f"rank{rank}.pt"),
        )
        sharded.release()
        dist.barrier()
    finally:
        try:  # teardown, after the results are saved: a peer whose process ended first is no failure here
            dist.destroy_process_group()
        except Exception:
            pass


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, tiny_tokenizer):
    folder = tmp_path_factory.mktemp("sharded")
    mp.start_processes(_worker, args=(str(folder),), nprocs=2, join=True, start_method="spawn")
    return [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def test_each_process_keeps_half_of_the_base(ranks):
    for r in ranks:
        assert r["all"] > 1_000_000 and abs(r["local"] - r["all"] / 2) <= 0.01 * r["all"]
    assert ranks[0]["rounds"] == ranks[1]["rounds"] > 0  # every process took part in every round
    assert ranks[0]["units"] == 3  # the tiny Llama's 2 decoder layers and its embedding (tied to the output head)
    assert ranks[0]["sum"] == ranks[1]["sum"] == 3.0


def test_unequal_work_gives_the_whole_base_results(ranks):
    for r in ranks:
        assert r["split"]["tokens"] == r["whole"]["tokens"]
        for split, whole in zip(r["split"]["logprobs"], r["whole"]["logprobs"]):
            for a, b in zip(split, whole):
                assert torch.allclose(a, b, rtol=1e-6, atol=1e-6 * float(b.abs().max()))
    assert [len(t) for t in ranks[0]["whole"]["tokens"]] != [len(ranks[1]["whole"]["tokens"][0])] * 3
    plain, checkpointed = ranks[0]["split"]["rounds"]
    assert checkpointed > plain  # checkpointing did recompute layers' forwards (their units gathered again)
    split, whole = ranks[0]["split"], ranks[0]["whole"]
    for grads, reference in ((split["grads"], whole["grads"]), (split["checkpointed"], whole["checkpointed"])):
        assert sorted(grads) == sorted(reference) and len(grads) > 0
        for name, g in reference.items():
            scale = float(g.abs().max())
            assert float((grads[name] - g).abs().max()) <= 1e-6 * scale + 1e-12, name
        assert sum(float(g.abs().sum()) for g in reference.values()) > 0
