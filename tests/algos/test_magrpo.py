"""MAGRPO's update: the minibatch loss accumulated in token-budget parts equals one pass."""

from dataclasses import replace

import pytest
import torch

from collab.algos import from_config
from collab.errors import UserError
from collab.policy.models import BaseConfig
from collab.policy.team import AgentSpec, SamplingSpec
from collab.rollout.experience import Batch
from collab.runtime.memory import shared_prompt_chunks, token_budget_chunks
from tests.support import CountingEnv, minibatch_gradient


def test_token_budget_chunks_by_hand():
    assert token_budget_chunks([3, 5, 2, 9, 1], None) == [[0, 1, 2, 3, 4]]
    # 3+5 -> 2 rows x 5 = 10 <= 10; adding 2 gives 3 x 5 = 15 > 10; 2 with 9 is 2 x 9 = 18 > 10; 9 alone;
    # 9 with 1 is 18 > 10.
    assert token_budget_chunks([3, 5, 2, 9, 1], 10) == [[0, 1], [2], [3], [4]]
    assert token_budget_chunks([4, 4, 4, 4], 12) == [[0, 1, 2], [3]]
    assert token_budget_chunks([20, 1], 8) == [[0], [1]]  # a row over the budget goes alone
    assert token_budget_chunks([], 8) == []
    # items of several rows (a decoding request's n samples): rows x longest item within the budget
    assert token_budget_chunks([3, 5, 2, 4], 20, rows=[2, 2, 4, 1]) == [[0, 1], [2, 3]]  # 4 x 5, then 5 x 4
    assert token_budget_chunks([3, 5, 2, 4], 19, rows=[2, 2, 4, 1]) == [[0], [1], [2], [3]]
    assert token_budget_chunks([3, 3, 3], 18, rows=[2, 2, 2]) == [[0, 1, 2]]


def test_shared_prompt_chunks_by_hand():
    """Rows of one prompt (a node's K samples) go together and count the prompt once: a part costs its distinct
    prompts at the longest prompt's length plus its rows at the longest tail's (completion + 1)."""
    keys, prompts = ["a", "b", "a", "b", "a"], [10, 8, 10, 8, 10]
    completions = [4, 6, 2, 6, 4]
    assert shared_prompt_chunks(keys, prompts, completions, None) == [[0, 1, 2, 3, 4]]
    # "a"'s three rows: 1 x 10 + 3 x 5 = 25 <= 25; "b"'s first then costs 2 x 10 + 4 x 7 = 48 > 25: a part of its
    # own, 8 + 7; with its second, 8 + 2 x 7 = 22
    assert shared_prompt_chunks(keys, prompts, completions, 25) == [[0, 2, 4], [1, 3]]
    # a budget of 48 holds both prompts: 2 x 10 + 5 x 7 = 55 > 48 stops at the fifth row
    assert shared_prompt_chunks(keys, prompts, completions, 48) == [[0, 2, 4, 1], [3]]
    # counted per row, the same budget of 25 holds one row of "a" (11 + 5) at a time
    assert token_budget_chunks([p + c for p, c in zip(prompts, completions)], 25) == [[0], [1], [2], [3], [4]]
    assert shared_prompt_chunks(["a", "a"], [30, 30], [5, 5], 20) == [[0], [1]]  # a row over the budget alone
    assert shared_prompt_chunks([], [], [], 8) == []


def test_micro_batches_accumulate_the_same_gradient():
    """Parts of one or two samples give the gradient (and loss) of one pass over the whole minibatch."""
    env = CountingEnv(2, 2)
    agents = [AgentSpec(choices=["A", "B"], sampling=SamplingSpec(temperature=1.0)) for _ in range(2)]
    module = from_config("magrpo", base=BaseConfig(name="tiny"), agents=agents, num_generations=2, kl_coef=0.1)
    module.build(env)
    torch.manual_seed(0)
    samples = module.rollout(env.tasks("train")).items
    samples = [replace(s, advantages=float(j % 3) - 1.0) for j, s in enumerate(samples)]  # mixed signs and zeros
    samples = samples[:-1]  # agents with unequal counts
    assert {s.agent for s in samples} == {0, 1}
    longest = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    params = [p for group in module.param_groups() for p in group["params"]]
    grads, losses = [], []
    for budget in (None, longest, 2 * longest):
        module.micro_batch_tokens = budget
        for p in params:
            p.grad = None
        stats = minibatch_gradient(module, Batch(samples))
        loss = stats["train/loss"]
        grads.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params])
        losses.append(loss)
    assert any(g.abs().sum() > 0 for g in grads[0])
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            assert torch.allclose(a, b, atol=1e-4 * float(a.abs().max()), rtol=1e-4)
    assert abs(losses[1] - losses[0]) < 1e-5 and abs(losses[2] - losses[0]) < 1e-5
    assert set(stats) == {"train/kl_ref", "train/ratio", "train/clip_frac", "train/approx_kl", "train/loss"}


@pytest.mark.parametrize(
    "options,message",
    [
        ({"rollout_mode": "chains"}, "unknown model.rollout_mode .chains.; valid: tree, episodes"),
        ({"rollout_mode": "episodes", "joint_mode": "cross"}, "needs model.joint_mode aligned"),
        ({"rollout_mode": "episodes", "termination_threshold": 0.5}, "model.termination_threshold null"),
        ({"dependency": "chain"}, "needs model.rollout_mode episodes, got tree"),
        ({"invalid_penalty": 0.1}, "model.invalid_penalty scores whole episodes' responses"),
        ({"rollout_mode": "episodes", "invalid_penalty": -0.1}, "invalid_penalty"),
    ],
)
def test_a_rollout_mode_that_cannot_run_is_one_line(options, message):
    with pytest.raises(UserError, match=message) as e:
        from_config("magrpo", base=BaseConfig(name="tiny"), **options)
    assert "\n" not in str(e.value)
