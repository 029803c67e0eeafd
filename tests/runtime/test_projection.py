"""The start-of-run check's counts (collab.runtime.projection): each a pure function of a base's shape and a step's
workload, checked against numbers worked out by hand here (and, for the built-in bases, against what peft and the
team measure: the adapter's parameters, the KV cache and the activations a token takes)."""

import pytest

from collab.envs import make_env
from collab.policy.models import KNOWN_CONFIGS
from collab.runtime.projection import (
    FULL_COPIES,
    Model,
    Projection,
    Shape,
    Workload,
    activation_bytes_per_token,
    decode_part,
    experience_bytes,
    kv_bytes_per_token,
    lora_parameters,
    most_agents,
    rollout_bytes,
    shape_from_config,
    sharded_bytes,
    step_flops,
    update_bytes,
)

TINY = Shape(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=49152)
WORK = Workload(tasks=2, agents=3, new_tokens=10, prompts=(20, 50), samples=4, branching=4)
"""A MAGRPO-like step: 2 tasks, 3 agents, K = 4 aligned, 2 turns of 20- and 50-token prompts, 10 new tokens."""


def test_the_built_in_bases_shapes_come_from_their_configs():
    assert shape_from_config(KNOWN_CONFIGS["tiny"]) == TINY
    smol = shape_from_config(KNOWN_CONFIGS["smollm2-135m-instruct"])
    assert (smol.layers, smol.hidden, smol.q_width, smol.kv_width, smol.intermediate) == (30, 576, 576, 192, 1536)
    # the decoder's products and the head: tiny's 3,219,776 parameters less its norms (2 x 128 + 64) and its tied
    # embedding, counted once as the head
    assert TINY.body == 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) == 73_728
    assert TINY.body + TINY.head + 2 * 128 + 64 == 3_219_776


def test_other_architectures_names_and_missing_sizes():
    gpt2 = shape_from_config({"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_inner": None})
    assert gpt2 == Shape(layers=12, hidden=768, intermediate=3072, heads=12, kv_heads=12, head_dim=64, vocab=50257)
    nested = {"text_config": {**KNOWN_CONFIGS["tiny"]}, "vision_config": {"hidden_size": 1}}
    assert shape_from_config(nested) == TINY
    assert shape_from_config({"hidden_size": 64}) is None


def test_an_adapter_is_rank_times_in_and_out_of_each_adapted_layer():
    """all-linear on tiny at r = 8: 8 x 2 layers x (7 x 64 + 2 x 64 + 2 x 32 + 3 x 128); SmolLM2's likewise. Both are
    the parameter counts of the adapters peft builds on these bases (16,384 and 2,442,240)."""
    assert lora_parameters(TINY, 8, ["all-linear"]) == 8 * 2 * 1024 == 16_384
    smol = shape_from_config(KNOWN_CONFIGS["smollm2-135m-instruct"])
    assert lora_parameters(smol, 8, ["all-linear"]) == 2_442_240
    assert lora_parameters(TINY, 8, ["q_proj", "v_proj"]) == 8 * 2 * ((64 + 64) + (64 + 32)) == 3_584
    assert lora_parameters(TINY, 8, ["c_attn"]) == lora_parameters(TINY, 8, []) == 16_384  # unknown: the most


def test_a_tokens_cache_and_activations():
    """KV: 2 x layers x kv heads x head size x bytes (tiny in float32: 512, as the team measures; SmolLM2: 45 KiB).
    Activations: layers x (4 x 128 + 6 x 64 + 2 x 64 + 2 x 32 + 14 x 8) values (the probe measures 9,362 bytes)."""
    assert kv_bytes_per_token(TINY, 4) == 2 * 2 * 32 * 4 == 512
    assert kv_bytes_per_token(TINY, 2) == 256
    assert kv_bytes_per_token(shape_from_config(KNOWN_CONFIGS["smollm2-135m-instruct"]), 4) == 46_080
    assert activation_bytes_per_token(TINY, 4, 8, False, 2.0) == 2 * 1200 * 4 == 9_600
    # checkpointed: each layer's input, and 2 layers' worth for the one run again
    assert activation_bytes_per_token(TINY, 4, 8, True, 2.0) == 2 * 64 * 4 + 2 * 1200 * 4 == 10_112


def test_a_workloads_nodes_rows_and_lengths():
    assert (WORK.turns, WORK.nodes(0), WORK.nodes(1)) == (2, 2, 8)  # the tasks, then each branched 4 ways
    assert (WORK.rows(0), WORK.rows(1)) == (3 * 2 * 4, 3 * 8 * 4) == (24, 96)
    assert (WORK.length(0), WORK.length(1)) == (30, 60)


def test_the_experience_is_its_token_lists_texts_and_joint_actions():
    """Turn 0: 6 requests x 20 tokens x (28 + 4), 24 samples x (20 x 8 + 10 x 36), 2 nodes x 4 joints x (56 + 3 x 8);
    turn 1: 24 x 50 x 32, 96 x (50 x 8 + 360), 8 x 4 x 80."""
    assert experience_bytes(WORK) == (3840 + 12480 + 640) + (38400 + 72960 + 2560) == 130_880
    crossed = Workload(tasks=1, agents=20, new_tokens=1, prompts=(1,), samples=4, branching=4**20)
    assert experience_bytes(crossed) > 4**20 * 20 * 8  # a crossed tree's joint actions alone: 2**40 tuples


def test_decoding_holds_its_largest_part():
    assert decode_part(24, 4, 100, 10_000) == 24  # all fit
    assert decode_part(96, 4, 100, 1_000) == 8  # 10 rows fit: 2 whole requests of 4
    assert decode_part(96, 4, 500, 1_000) == 4  # not one request fits: one all the same
    # kv 10 bytes a token, a vocabulary of 100 (6 x 4 x 100 bytes of sampling a row), parts of 3,000 bytes of cache:
    # turn 0, rows of 300 bytes, parts of 8 rows; turn 1, rows of 600, parts of 4
    assert rollout_bytes(WORK, 10, 100, 3_000) == max(8 * (300 + 2400), 4 * (600 + 2400)) == 21_600
    assert rollout_bytes(WORK, 10, 100, 10**9) == 96 * (600 + 2400)  # one batch a turn


@pytest.mark.parametrize(
    "micro, budget, minibatch, tokens",
    [
        ("auto", 1_000, None, 500),  # 1,000 bytes at 2 a token
        ("auto", 50, None, 60),  # one sequence at least
        (None, 0, None, 120 * 60),  # one pass: every item padded to the longest
        (None, 0, 10, 10 * 60),  # one pass over a minibatch of 10
        (100, 0, None, 100),
        (10**6, 0, None, 120 * 60),  # never more than the minibatch
    ],
)
def test_an_update_holds_a_micro_batchs_activations_and_the_heads_chunk(micro, budget, minibatch, tokens):
    assert update_bytes(WORK, 2.0, micro, budget, minibatch, head=1_000) == 2 * tokens + 1_000


def test_a_steps_flops():
    """A 1-layer model (width 4, MLP 8, 2 query heads and 1 key-value head of 2, vocabulary 10: 144 parameters in its
    layer, 40 in its head), one request of a 3-token prompt, 2 samples of 2 tokens: the prefill 2 x 144 x 3 + the
    head once + attention 8 x 3^2; the decoded tokens 2 x 2 x (2 x 184 + 4 x 4 x (3 + 1)); the update
    2 x (6 x 144 x 5 + 6 x 40 x 2 + 3 x 8 x 5^2) for full agents, 4 x instead of 6 x for LoRA agents."""
    shape = Shape(layers=1, hidden=4, intermediate=8, heads=2, kv_heads=1, head_dim=2, vocab=10)
    assert (shape.body, shape.head) == (144, 40)
    work = Workload(tasks=1, agents=1, new_tokens=2, prompts=(3,), samples=2)
    assert step_flops(work, shape, 6) == (864 + 80 + 72) + 4 * (368 + 64) + 2 * (4320 + 480 + 600) == 13_544
    assert step_flops(work, shape) == (864 + 80 + 72) + 4 * (368 + 64) + 2 * (2880 + 320 + 600) == 10_344


def test_a_projection_holds_the_larger_of_a_rollout_and_an_update():
    p = Projection(bases=1, adapters=2, experience=3, rollout=10, update=5, fixed=100)
    assert (p.total, p.device, p.host) == (116, 13, 103)


def test_fsdp_keeps_a_share_of_each_model_and_a_backward_gathers_them_whole():
    """Two full agents of 1,000 parameters in bfloat16 (4 x 2 bytes each: 8,000) and a frozen float32 base of 600
    (2,400): one process holds 18,400. Over 2 processes each keeps half of each (9,200) and a pass using all three
    gathers the agents' weights and gradients (2 x 2,000 each) and the base's weights (2,400): 10,400; over 4, a
    quarter (4,600) and the same 10,400. Passes using one agent and the base, then the other agent alone, gather
    at most 6,400. A model fsdp does not shard (the frozen reference) stays whole and gathers nothing."""
    agent, base = Model(1000, 2, trains=True), Model(600, 4)
    assert FULL_COPIES == 4 and agent.whole == 8000 and base.whole == 2400
    assert sharded_bytes([agent, agent, base], 1) == (18_400, 0)
    assert sharded_bytes([agent, agent, base], 2) == (9_200, 10_400)
    assert sharded_bytes([agent, agent, base], 4) == (4_600, 10_400)
    assert sharded_bytes([agent, agent, base], 4, passes=[[0, 2], [1]]) == (4_600, 6_400)
    assert sharded_bytes([agent, Model(600, 4, shardable=False)], 4) == (2_000 + 2_400, 4_000)
    assert sharded_bytes([Model(1001, 1)], 2) == (501, 1001)  # a share rounds up (FSDP2 pads the first dimension)
    # the gathered models live with the update's activations, not with a rollout's KV cache
    p = Projection(bases=1, adapters=2, experience=3, rollout=10, update=5, fixed=100, gathered=7)
    assert (p.device, p.total) == (1 + 2 + 12, 100 + 3 + 15)
    assert Projection(bases=1, adapters=2, experience=3, rollout=20, update=5, fixed=100, gathered=7).device == 23


def test_the_most_agents_that_fit():
    assert most_agents(lambda m: m <= 7, 10) == 7
    assert most_agents(lambda m: True, 10) == 9
    assert most_agents(lambda m: False, 10) == 0
    assert most_agents(lambda m: True, 1) == 0


def test_prompts_grow_as_the_env_says():
    """A debate's prompt holds every agent's responses of every turn before, each with its header (12 tokens); the
    default history its own responses and a feedback of 64 tokens a turn, within the history window."""
    debate = make_env("debate", agents=3)
    assert [debate.prompt_tokens(80, t, [10, 20, 30]) for t in range(3)] == [80, 80 + 96, 80 + 2 * 96]
    math = make_env("math")
    assert math.prompt_tokens(100, 2, [10, 30]) == 100 + 2 * (30 + 64)
    math.history_window = 1
    assert math.prompt_tokens(100, 2, [10, 30]) == 100 + 94
