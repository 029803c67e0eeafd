"""Per-token values with a tool's result in a response (MARFT-T): the critic values, GAE runs over and the actor
trains on the agent's own tokens only, the inserted tokens being context."""

from __future__ import annotations

import torch

from collab.algos import from_config
from collab.policy.mlp_head import base_features
from collab.policy.models import BaseConfig
from collab.rollout.episodes import play
from collab.rollout.experience import Experience, transitions
from tests.support import TwoTurnEnv

TINY = BaseConfig(name="tiny", device="cpu")
RESULT = [28, 29, 30]  # tokens a tool's result would insert


def with_results(completion) -> None:
    """Insert RESULT after the completion's first token, marked as not the agent's (in place)."""
    ids = list(completion.completion_ids)
    completion.completion_ids = ids[:1] + RESULT + ids[1:]
    completion.own = [True] + [False] * len(RESULT) + [True] * (len(ids) - 1)


def test_marft_t_values_and_trains_the_agents_own_tokens(one_thread):
    env = TwoTurnEnv()
    module = from_config("marft_t", agents=None, base=TINY, gamma=0.9, gae_lambda=0.7)
    module.build(env)
    torch.manual_seed(0)
    episodes = [eps[0] for eps in play(module.team, env, env.tasks("train") * 2, 1, dependency=module.protocol)]
    items = transitions(episodes)
    for tr in items:
        for c in tr.actions:
            with_results(c)
    with torch.no_grad():
        module.prepare(Experience(items, episodes=episodes))
    for tr in items:
        own = sum(c.own_tokens for c in tr.actions)
        assert len(tr.advantages) == len(tr.values) == len(tr.features) == own
        assert sum(len(module.agent_advantages(tr, i)) for i in range(len(tr.actions))) == own
    # the critic read each own token's state in the sequence that holds the result
    c = items[0].actions[1]
    full = base_features(
        module.critic_model, module.team.tokenizer_of(0).pad_token_id, [c.prompt_ids], [c.completion_ids]
    )
    mask = torch.tensor(c.own)
    start = items[0].actions[0].own_tokens
    torch.testing.assert_close(items[0].features[start : start + c.own_tokens], full[0][mask])
    advantages = torch.cat([module.agent_advantages(tr, i) for tr in items for i in range(2)])
    loss, _, stats = module.actor_loss(items, [0, 1], advantages)
    assert stats["train/tokens"] == sum(c.own_tokens for tr in items for c in tr.actions)
    loss.backward()
    assert torch.isfinite(loss)
