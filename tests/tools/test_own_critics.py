"""Per-token values with a tool's result in a response (MARFT-T, MAPoRL): the critic values, GAE runs over and the actor
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
    module = from_config("marft_t", agents=None, base=TINY, ppo={"gamma": 0.9}, gae_lambda=0.7)
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


def test_maporl_values_and_trains_the_agents_own_tokens(one_thread, tmp_path):
    """MAPoRL's per-token rewards, KL to the reference, values and GAE over an answer with a tool's result inside:
    one entry per own token, the features read at the own tokens of the sequence that holds the result, and the
    PPO loss a mean over own tokens."""
    import json

    from collab.algos.maporl import team_features
    from collab.envs.debate.env import DebateEnv
    from collab.policy.team import AgentSpec, SamplingSpec

    path = tmp_path / "seven.json"
    path.write_text(json.dumps([{"problem": f"Question {i}: say 7.", "answer": "7"} for i in range(2)]))
    env = DebateEnv(dataset=str(path), agents=2, horizon=1, train_split="[0:2]", eval_split="[0:2]")
    agents = [AgentSpec(sampling=SamplingSpec(max_new_tokens=4)) for _ in range(2)]
    module = from_config("maporl", base=TINY, agents=agents, train_from_turn=1, kl_coef=0.1)
    module.build(env)
    torch.manual_seed(0)
    experience = module.rollout(env.tasks("train"))
    for r in experience.items:
        with_results(r)
    batch = module.prepare(Experience(experience.items, episodes=experience.episodes))
    for r in batch.items:
        own = sum(r.own)
        assert len(r.advantages) == len(r.returns) == len(r.values) == len(r.features) == own == len(r.old_logprobs)
    r = batch.items[0]
    (full,) = team_features(module.team, [r.member], [r.prompt_ids], [r.completion_ids])
    torch.testing.assert_close(r.features, full[torch.tensor(r.own)])
    scale = module.normalizers(batch.items, batch, 0)
    assert scale.count == sum(sum(r.own) for r in batch.items)
    loss, stats = module.ppo_loss(batch.items, torch.cat(scale.advantages), scale.count)
    loss.backward()
    assert torch.isfinite(loss)
