"""The training step every algorithm shares (``CollabModule.update``).

Micro-batching is done once, in the skeleton, for every algorithm: a minibatch split into parts of at
most ``micro_batch_tokens`` padded tokens (here 1: every item alone) must give the gradient and the loss
of one pass over it, which holds only when each algorithm's loss divides by the whole minibatch's
normalisers (``normalizers``), not by the part's. MAPoRL's case is in tests/algos/test_maporl.py.
"""

import itertools
from dataclasses import replace

import pytest
import torch

from tests.algos.test_known_optimum import make
from tests.support import EarlySolveEnv, backward_passes, minibatch_gradient
from tests.support.algos import algos, settings

ALGOS = [algo for algo in algos() if settings(algo).micro_batches]


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
    if algo in ("magrpo", "at_grpo"):  # mixed signs and zeros, unequal counts per agent
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
    module.ppo.num_epochs, module.ppo.minibatch_size = 3, 2
    module.target_kl = 1e-3
    calls = []
    accept = module.accept
    module.accept = lambda stats, count, scale: calls.append(stats["train/approx_kl"]) or accept(stats, count, scale)
    module.build(env)
    before = {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}
    quiet_fit(module, datamodule_for(env, batch_size=2, seed=0), rollouts=1)
    # the first minibatch is on-policy (KL ~0: accepted); after that step the second one's is above the target
    assert calls[0] <= 1e-3 and len(calls) == 2 and calls[1] > 1e-3  # measured: 0.0 and 0.12
    moved = [n for n, p in module.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert moved  # the first update was applied


def test_every_algorithm_has_the_one_contract():
    """rollout(tasks) -> Experience, prepare(experience) -> Batch, normalizers(minibatch, batch, index) ->
    Normalizers, terms(micro, scale) -> [Term]: the same signatures in every algorithm, none of the old second
    names, and no algorithm's own ``loss``: a micro-batch's loss is the sum of its terms, in the base class alone."""
    import inspect

    from collab.algos import algo_registry
    from collab.algos.base import CollabModule

    hooks = ("rollout", "prepare", "normalizers", "terms", "accept")
    for name, cls in algo_registry().items():
        for hook in hooks:
            ours = list(inspect.signature(getattr(cls, hook)).parameters)
            assert ours == list(inspect.signature(getattr(CollabModule, hook)).parameters), (name, hook, ours)
        assert not any(hasattr(cls, old) for old in ("losses", "begin_update", "accumulate", "parts")), name
        assert cls.loss is CollabModule.loss and cls.update is CollabModule.update, name


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


# -- a micro-batch's loss is the sum of its terms ------------------------------------------------------------
def surrogate(logprobs, old_logprobs, advantages):
    """-rho A with rho = pi / pi_old: PPO's clipped surrogate where no clip is active (rho ~ 1 before an update)."""
    return -(torch.exp(logprobs - old_logprobs.to(logprobs)) * advantages.to(logprobs))


def one_pass(module, micro, scale):
    """The micro-batch's loss as one expression, from each paper's definition (its share of the minibatch:
    ``len(micro) / scale.count``, MAPoRL's of its tokens). MARFT: value_head.coef L_critic + L_actor - entropy_coef H,
    the actor loss and entropy means over every trained agent's samples at once; CoLLM and IPPO: the critics' mean
    value loss plus every agent's policy loss, weighted by its critic's advantages; MAGRPO: each agent's mean of
    -rho A over its samples, summed; MAPoRL: Section 3.2's token means, -rho A + value_head.coef (V - V_target)^2;
    MADPO: the mean over pairs of -log sigmoid(beta sum_i (log pi_i(y_w^i) - log pi_i(y_l^i))), a pair at a time;
    MARLHF's reward-model phase: the mean over pairs of -log sigmoid(r(h, a_w) - r(h, a_l)), a joint action at a time;
    AT-GRPO: each agent's mean of -rho_t A over its response tokens, summed."""
    from collab.algos.actor_critic import ActorCritic
    from collab.algos.at_grpo import ATGRPO
    from collab.algos.madpo import MADPO
    from collab.algos.maporl import MAPoRL
    from collab.algos.marft import MARFT
    from collab.algos.marlhf import MARLHF

    team, weight = module.team, len(micro) / scale.count
    if isinstance(module, MARFT):
        critic, _ = module.critic.loss(micro)
        advantages = torch.cat([a for per_agent in scale.advantages for a in per_agent])  # transition by transition
        actor, entropy, _ = module.actor_loss(micro, scale.agents, advantages)
        return (module.value_head.coef * critic + actor - module.entropy_coef * entropy) * weight
    if isinstance(module, ActorCritic):
        loss = 0.0
        for j in range(len(module.critics)):
            critic, advantages, _ = module.critic_loss(micro, scale, j)  # already divided by the number of critics
            loss = loss + critic
            for k, agent in enumerate(module.advised(j)):
                actions = [tr.actions[agent] for tr in micro]
                logprobs = torch.stack(
                    [
                        t.sum()
                        for t in team.logprobs(
                            [agent] * len(micro), [c.prompt_ids for c in actions], [c.completion_ids for c in actions]
                        )
                    ]
                )
                loss = loss + surrogate(logprobs, torch.tensor([c.logprob for c in actions]), advantages[:, k]).mean()
        return loss * weight
    if isinstance(module, MARLHF) and module.fitting_rewards():
        scores = [
            [module.reward_model.values([0], [module.reward_model.inputs(pair.state, side)[0][1]])[0] for side in sides]
            for pair in micro
            for sides in [(pair.winners, pair.losers)]
        ]
        return sum(torch.log1p(torch.exp(-(w - lo))) for w, lo in scores) / scale.count
    if isinstance(module, MADPO):
        losses = []
        for pair in micro:
            margin = 0.0
            for w, lo in zip(pair.winners, pair.losers):
                lw, ll = team.logprobs(w.member, [w.prompt_ids, lo.prompt_ids], [w.completion_ids, lo.completion_ids])
                margin = margin + lw.sum() - ll.sum()
            losses.append(torch.log1p(torch.exp(-module.beta * margin)))  # -log sigmoid(beta m)
        return sum(losses) / scale.count
    rows = ([s.member for s in micro], [s.prompt_ids for s in micro], [s.completion_ids for s in micro])
    if isinstance(module, MAPoRL):
        assert module.entropy_coef == 0
        advantages = torch.cat(scale.advantages)
        actor = surrogate(torch.cat(team.logprobs(*rows)), torch.cat([r.old_logprobs for r in micro]), advantages)
        values = torch.cat([module.value_heads[r.member](r.features) for r in micro])
        returns = torch.cat([r.returns for r in micro]).to(values)
        return (
            advantages.numel()
            / scale.count
            * (actor.mean() + module.value_head.coef * ((values - returns) ** 2).mean())
        )
    if isinstance(module, ATGRPO):  # token-level: each agent's mean over its tokens of -rho_t A
        return sum(
            (surrogate(t, s.old_logprobs, torch.full_like(t, s.advantages)) / scale.per_agent[s.agent]).sum()
            for t, s in zip(team.logprobs(*rows), micro)
        )
    logprobs = torch.stack([t.sum() for t in team.logprobs(*rows)])
    per_agent = torch.tensor([scale.per_agent[s.agent] for s in micro])
    return (
        surrogate(logprobs, torch.tensor([s.old_logprob for s in micro]), torch.tensor([s.advantages for s in micro]))
        / per_agent.to(logprobs)
    ).sum()


@pytest.mark.parametrize("algo", algos())
def test_an_algorithms_terms_sum_to_its_one_pass_loss(algo, one_thread, tmp_path):
    """Each algorithm's terms, run as the update runs them (a backward pass each), give the loss, the gradient and
    ``train/loss`` of the paper's loss written as one expression (:func:`one_pass`), one term per forward and in
    order: one for MAGRPO and MAPoRL (every agent at once), else critic j's, then the actor terms of the agents it
    advises, each moving only its own parameters. MAPoRL and MARFT-T answer a debate in up to 3 and 5 free tokens,
    so that MARFT-T's agents have unequal numbers of tokens (an agent's term is weighted by its share of them)."""
    import json

    from collab.algos import from_config
    from collab.envs.debate.env import DebateEnv
    from collab.policy.models import BaseConfig
    from collab.policy.team import AgentSpec, SamplingSpec

    torch.manual_seed(0)  # the adapters' initialisation
    if algo in ("maporl", "marft_t"):
        dataset = tmp_path / "seven.json"
        dataset.write_text(json.dumps([{"problem": f"Question {i}: say 7.", "answer": "7"} for i in range(4)]))
        env = DebateEnv(dataset=str(dataset), agents=2, horizon=2, train_split="[0:4]", eval_split="[0:4]")
        options = dict(train_from_turn=1, normalize_advantages=False) if algo == "maporl" else dict(entropy_coef=0.01)
        module = from_config(
            algo,
            base=BaseConfig(name="tiny", device="cpu", seed=0),
            agents=[AgentSpec(sampling=SamplingSpec(max_new_tokens=n)) for n in (3, 5)],
            **options,
        )
    elif algo in ("collm_cc", "collm_dc", "ippo"):  # each agent's own rewards: each critic's advantages its own
        from tests.algos.test_actor_critic import FixedRewardEnv

        env, module = FixedRewardEnv(), make(algo, seed=0)
    else:
        env, module = EarlySolveEnv(n_agents=2, horizon=2), make(algo, seed=0)
    module.build(env)
    module.rollouts, module.micro_batch_tokens, module.critic_warmup = 1, None, 0  # one micro-batch; actors train
    torch.manual_seed(0)
    experience = module.rollout(env.tasks("train")[:2] * (1 if algo in ("maporl", "marft_t") else 2))
    batch = module.prepare(experience)
    if algo in ("magrpo", "at_grpo"):  # mixed signs and zeros, unequal counts per agent (AT-GRPO's one-token
        # answers of two choices: -1, 0, 1 in turn would cancel per token in its one-path tree)
        for j, s in enumerate(experience.items):
            s.advantages = float(j % 3) - 1.0 if algo == "magrpo" else float(j % 4) - 1.0
        batch = replace(batch, items=experience.items[:-1])
    if algo in ("maporl", "marft_t"):  # the debate's rewards are 0 here, so the advantages are float noise (whether
        # an agent moves at all would depend on the instruction set's sums): advantages and returns of both signs
        for tr in batch.items:
            tr.advantages, tr.returns = torch.randn_like(tr.advantages), torch.randn_like(tr.returns)
    items = batch.items
    scale = module.normalizers(items, batch, 0)
    if algo == "marft_t":
        tokens = [sum(len(tr.actions[i].completion_ids) for tr in items) for i in range(2)]
        assert tokens[0] != tokens[1], tokens
    groups = module.param_groups()
    params = [p for group in groups for p in group["params"]]

    def grads():
        out = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]
        for p in params:
            p.grad = None
        return out

    stats: dict[str, float] = {}
    split, order = [torch.zeros_like(p) for p in params], []
    for part in backward_passes(module, items, scale, stats):  # as the update runs them: what each backward pass moves
        part().backward()
        order.append(
            [g["name"] for g in groups if any(p.grad is not None and p.grad.abs().sum() > 0 for p in g["params"])]
        )
        split = [total + g for total, g in zip(split, grads())]
    a0, a1 = module.team.names[:2]
    expected = {
        "collm_cc": [["critic0"], [a0], [a1]],
        "marft_a": [["critic"], [a0], [a1]],  # critic j, then its agents
        "collm_dc": [["critic0"], [a0], ["critic1"], [a1]],
        "marft_t": [["critic"], [a0], [a1]],
        "marlhf": [["reward_model"]],  # its first rollouts fit the reward model alone
    }
    expected["ippo"] = expected["collm_dc"]
    assert order == expected.get(algo, [[g["name"] for g in groups]])  # one term: every agent (and head) at once
    assert len(order) == settings(algo).terms  # one, or each critic's and each agent's actor term
    whole = one_pass(module, items, scale)
    whole.backward()
    expected = grads()
    assert stats["train/loss"] == pytest.approx(float(whole.detach()), rel=1e-5, abs=1e-6)
    assert any(g.abs().sum() > 0 for g in expected)
    for a, b in zip(expected, split):  # another summation order: float32 noise relative to each tensor's scale
        assert torch.allclose(a, b, atol=1e-5 * float(a.abs().max()) + 1e-12, rtol=1e-5)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_update_gives_the_heap_back_after_a_backward_that_left_more_than_a_micro_batchs_budget(
    checkpointing, monkeypatch, one_thread
):
    """After each micro-batch's backward pass the update compares the process's resident memory with what it held
    at the update's start plus the micro-batch budget (``--model.micro_batch_memory_gb``) and gives glibc's free
    heap back (``runtime.memory.release``) only above it: the freed activations of micro-batches of other shapes
    fragment the heap (team_scaling's MAGRPO at 8 agents: a peak of 3.61 GiB without, 1.35x its 2 agents'), and
    giving it back after every pass costs the page faults of the memory used again. Under gradient checkpointing
    (each pass runs the layers again at its shape: ``benchmarks/checkpoint_memory.py --micro-batches``, 1.89 ->
    2.76 GiB resident over 16 passes for 0.66 -> 0.82 GiB in use) it gives the heap back after every pass that
    left more than at the start."""
    import collab.algos.base as base
    import collab.runtime.memory as memory
    from collab.algos import from_config
    from collab.policy.models import BaseConfig

    events = []
    mib = 2**20
    monkeypatch.setattr(base, "resident_bytes", lambda: 10 * mib)  # at the update's start
    held = itertools.cycle([10.5, 11.5, 10.9, 12.0, 11.0])  # after each pass, MiB: above 10 + 1 on the 2nd, 4th
    monkeypatch.setattr(memory, "resident_bytes", lambda: int(next(held) * mib))
    monkeypatch.setattr(memory, "release", lambda: events.append("release") or True)
    env = EarlySolveEnv(n_agents=2, horizon=2)
    module = from_config(
        "magrpo",
        agents=None,
        base=BaseConfig(name="tiny", seed=0, gradient_checkpointing=checkpointing),
        agent_lr=1e-2,
        num_generations=4,
        ppo={"num_epochs": 1},
        log_kl_every=0,
        micro_batch_memory_gb=1 / 1024,  # a budget of 1 MiB
    )
    module.build(env)
    module.micro_batch_tokens = 1  # every item a micro-batch of its own
    module.manual_backward = lambda loss: events.append("backward") or loss.backward()
    monkeypatch.setattr(module, "optimizers", lambda: torch.optim.SGD(module.parameters(), lr=0.0))
    monkeypatch.setattr(module, "optimizer_step", lambda: events.append("step"))
    torch.manual_seed(0)
    experience = module.rollout(env.tasks("train") * 2)
    batch = module.prepare(experience)
    for j, s in enumerate(experience.items):  # a signal in every item, so that each is a backward pass
        s.advantages = float(j % 2) * 2 - 1.0
    module.update(replace(batch, items=experience.items))
    passes = events.count("backward")
    assert passes == len(experience.items) >= 5 and events[-1] == "step"
    above = [True] * passes if checkpointing else [j % 5 in (1, 3) for j in range(passes)]
    assert events[:-1] == [e for a in above for e in (["backward", "release"] if a else ["backward"])]
