"""Token sampling: nucleus/top-k truncation, the candidate fast path and the inverse-CDF draws."""

import pytest
import torch

from collab.policy.draw import inverse_cdf, kept, rejection_sample, sample_tokens, truncate
from collab.policy.sampling import action_mask, policy_logits


def nucleus(logits, p, k):
    rows = logits.shape[0]
    return truncate(logits, torch.full((rows,), p), torch.full((rows,), k, dtype=torch.long)).softmax(-1)


def empirical(logits, p, k, draws=40000, candidates=256):
    torch.manual_seed(0)
    batch = logits.expand(draws, -1)
    tokens = sample_tokens(batch, torch.full((draws,), p), torch.full((draws,), k, dtype=torch.long), candidates)
    return torch.bincount(tokens, minlength=logits.shape[-1]).float() / draws


def test_truncate_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    # top-p 0.7: mass before each token is 0, .5, .8, .95 -> keep the first two
    assert torch.allclose(nucleus(logits, 0.7, 0), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    # top-k 3
    assert torch.allclose(nucleus(logits, 1.0, 3), torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    # p = 1 and k = 0 keep every token, even where float rounding makes the cumulative mass reach 1 early
    assert torch.allclose(nucleus(logits, 1.0, 0), logits.softmax(-1))


def test_fast_path_matches_the_truncated_distribution():
    torch.manual_seed(1)
    logits = torch.randn(1, 5000) * 4  # peaked: the 0.9-nucleus lies within the top 256
    target = nucleus(logits, 0.9, 0)[0]
    freq = empirical(logits, 0.9, 0)
    assert freq[target == 0].sum() == 0  # never outside the nucleus
    assert (freq - target).abs().max() < 0.01


def test_a_wide_nucleus_is_drawn_by_inverse_cdf_without_the_full_sort(monkeypatch):
    """A flat distribution: the 0.9-nucleus holds 4500 of 5000 tokens, beyond every candidate size. The draw is made
    by rejection, with no sort and no topk (2048 tokens of a flat row cannot hold 0.9 of its mass)."""
    import collab.policy.draw as draw

    logits = torch.zeros(1, 5000)
    assert abs(int((nucleus(logits, 0.9, 0)[0] > 0).sum()) - 4500) <= 1
    calls = []
    monkeypatch.setattr(draw, "truncate", lambda *a: calls.append("sort") or truncate(*a))
    monkeypatch.setattr(torch.Tensor, "topk", lambda *a, **k: calls.append("topk") or torch.topk(*a, **k))
    torch.manual_seed(0)
    rows = 4000
    tokens = sample_tokens(logits.expand(rows, -1), torch.full((rows,), 0.9), torch.zeros(rows, dtype=torch.long))
    assert calls == []
    # ties: every token of the flat row is equally likely, and the tokens of equal probability are kept together
    assert kept(logits.softmax(-1), torch.tensor([4999]), torch.tensor([0.9]), torch.tensor([0])).item()
    assert tokens.unique().numel() > 2500


def test_inverse_cdf_by_hand():
    """Blocks of 256: a row of 600 tokens whose mass lies on tokens 3, 300 and 599 (1/4, 1/4, 1/2); points at
    the edges of the cumulative mass pick the token whose interval holds them, never a token of probability 0."""
    probs = torch.zeros(1, 600)
    probs[0, [3, 300, 599]] = torch.tensor([0.25, 0.25, 0.5])
    got = [int(inverse_cdf(probs, torch.tensor([u], dtype=torch.float64))) for u in (0.0, 0.2499, 0.25, 0.5, 0.9999)]
    assert got == [3, 3, 300, 599, 599]
    assert int(inverse_cdf(probs, torch.tensor([1 - 2**-53], dtype=torch.float64))) == 599  # the last point
    # a row whose mass is not 1 (a float32 softmax) is scaled by its total
    assert int(inverse_cdf(probs * 0.5, torch.tensor([0.3], dtype=torch.float64))) == 300


def test_a_row_of_nan_probabilities_is_named_not_drawn_past_the_vocabulary():
    # a NaN total puts the point past every block: the token would index past the vocabulary (on CUDA, a device
    # assert that leaves the process's CUDA context unusable)
    probs = torch.full((3, 600), 1 / 600)
    probs[1, 7] = float("nan")
    with pytest.raises(FloatingPointError, match=r"row\(s\) \[1\] are NaN or infinite"):
        inverse_cdf(probs, torch.full((3,), 0.5, dtype=torch.float64))
    with pytest.raises(FloatingPointError, match="not finite"):
        sample_tokens(torch.log(probs), torch.full((3,), 0.9), torch.zeros(3, dtype=torch.long))


@pytest.mark.parametrize("p, k", [(0.7, 0), (1.0, 5), (0.95, 3), (1.0, 0)])
def test_rejection_follows_the_truncated_distribution(p, k):
    """A random row of 1000 tokens, a third of them outside a closed vocabulary (probability 0): the draws stay in
    the nucleus / top-k and follow the truncated distribution (4 sigma of 20,000 draws)."""
    torch.manual_seed(3)
    logits = torch.randn(1, 1000) * 2
    logits[0, ::3] = float("-inf")
    target = nucleus(logits, p, k)[0]
    rows = 20_000
    tokens = rejection_sample(
        logits.softmax(-1).expand(rows, -1), torch.full((rows,), p), torch.full((rows,), k, dtype=torch.long)
    )
    freq = torch.bincount(tokens, minlength=1000).float() / rows
    assert freq[target == 0].sum() == 0
    assert ((freq - target).abs() <= 4 * (target * (1 - target) / rows).sqrt() + 1e-4).all()


def test_rows_left_after_every_round_take_the_full_sort(monkeypatch):
    """A top-k of 2 over a flat row of 5000 tokens keeps a draw once in 2500: after its rounds the row is drawn
    from the sorted truncation, still among its two most likely tokens."""
    import collab.policy.draw as draw

    sorts = []
    monkeypatch.setattr(draw, "truncate", lambda *a: sorts.append(1) or truncate(*a))
    torch.manual_seed(0)
    logits = torch.randn(1, 5000) * 0.01
    top2 = set(logits[0].topk(2).indices.tolist())
    got = rejection_sample(logits.softmax(-1), torch.ones(1), torch.tensor([2]), rounds=2)
    assert sorts == [1] and int(got) in top2


def test_a_rows_draw_does_not_depend_on_the_other_rows():
    """With ``slots``, row i draws from the uniforms of its place in the whole batch: the same token whether the
    other rows are still there or not (a finished response leaves the batch, :func:`decode`), and the random
    stream after the step is the same too, however many rounds the rows took (top-p 0.3: about 3 a row)."""
    torch.manual_seed(4)
    probs = (torch.randn(6, 3000) * 0.1).softmax(-1)
    top_p, top_k = torch.full((6,), 0.3), torch.zeros(6, dtype=torch.long)
    torch.manual_seed(5)
    whole = rejection_sample(probs, top_p, top_k, slots=torch.arange(6), width=6)
    after_whole = torch.rand(3)
    torch.manual_seed(5)
    part = rejection_sample(probs[[1, 4]], top_p[[1, 4]], top_k[[1, 4]], slots=torch.tensor([1, 4]), width=6)
    assert part.tolist() == whole[[1, 4]].tolist()
    assert torch.equal(torch.rand(3), after_whole)


def test_untruncated_rows_sample_the_full_softmax():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    freq = empirical(logits, 1.0, 0)
    assert (freq - logits.softmax(-1)[0]).abs().max() < 0.01


def test_policy_logits_batched_rows_match_single_rows():
    torch.manual_seed(0)
    logits = torch.randn(3, 10)
    temps = [0.7, 0.0, 1.3]  # 0: greedy, log-probs at temperature 1
    choices = [torch.tensor([2, 5]), None, torch.tensor([0, 9, 4])]
    masks = [action_mask(c, 10) for c in choices]
    assert masks[1] is None and masks[0].tolist() == [i in (2, 5) for i in range(10)]
    allowed = torch.stack([m if m is not None else torch.ones(10, dtype=torch.bool) for m in masks])
    batched = policy_logits(logits, torch.tensor(temps), allowed)
    for b in range(3):
        single = policy_logits(logits[b], temps[b], masks[b])
        assert torch.equal(batched[b], single)
        if masks[b] is not None:
            assert torch.isinf(single[~masks[b]]).all() and torch.equal(
                single[masks[b]], logits[b][masks[b]] / temps[b]
            )
    assert torch.equal(batched[1], logits[1])
    # a single row's steps (teacher forcing): float temperature, one mask for every step
    steps = torch.randn(4, 10)
    assert torch.equal(policy_logits(steps, 0.5, masks[0]), steps.masked_fill(~masks[0], float("-inf")) / 0.5)


def test_reserved_cache_layer_matches_concatenation():
    """The decode's reserved KV layer holds exactly what transformers' dynamic layer would (concatenation),
    inside its reservation and past it."""
    from transformers.cache_utils import DynamicLayer

    from collab.policy.kv_cache import ReservedLayer

    torch.manual_seed(0)
    dynamic = DynamicLayer()
    dynamic.update(torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4))
    reserved = ReservedLayer(dynamic, extra=2)
    assert reserved.get_seq_length() == 5
    for _ in range(4):  # two steps inside the reservation, two past it
        k, v = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
        expected = (torch.cat([dynamic.keys, k], -2), torch.cat([dynamic.values, v], -2))
        dynamic.update(k, v)
        got = reserved.update(k, v)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert reserved.get_seq_length() == 9


def test_a_layer_reserved_ahead_fills_in_place():
    """``ReservedLayer(capacity=n)`` (a prefill in pieces): its buffer is allocated at the first update and the
    pieces after it are written into it, no copy of the cache (its data pointer stays), equal to concatenation;
    past the capacity it grows."""
    from transformers.cache_utils import DynamicLayer

    from collab.policy.kv_cache import ReservedLayer, reserved_cache

    torch.manual_seed(0)
    dynamic, reserved = DynamicLayer(), ReservedLayer(capacity=10)
    assert not reserved.is_initialized
    pointers = []
    for width in (4, 4, 2, 1):  # 10 columns fill the capacity, the 11th grows it
        k, v = torch.randn(2, 3, width, 4), torch.randn(2, 3, width, 4)
        expected = dynamic.update(k, v)
        got = reserved.update(k, v)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
        pointers.append(reserved._keys.data_ptr())
    assert pointers[0] == pointers[1] == pointers[2] != pointers[3] and reserved.get_seq_length() == 11
    cache = reserved_cache(7)
    cache.update(torch.randn(1, 3, 2, 4), torch.randn(1, 3, 2, 4), 0)
    assert type(cache.layers[0]) is ReservedLayer and cache.layers[0]._keys.shape[-2] == 7


def test_shared_prefixes_by_hand():
    from collab.policy.prefixes import shared_prefixes

    prompts = [[1, 2, 3, 4, 5], [1, 2, 3, 9, 9, 9], [1, 2, 3, 4], [1, 2, 7], [8]]
    adapters = ["a", "a", "b", "a", "a"]
    # Under "a", rows 0 and 1 share [1, 2, 3] (saving 3 tokens), rows 0, 1, 3 share [1, 2] (saving 2 x 2 = 4):
    # the latter. Row 2 is "b"'s own (its prefix: all but its last token); row 4 is alone.
    group_of, lengths = shared_prefixes(prompts, adapters, min_prefix=2)
    assert group_of == [0, 0, 1, 0, 2]
    assert lengths == [2, 3, 0]
    # Identical prompts keep one token of their own.
    assert shared_prefixes([[5, 6, 7, 8]] * 3, ["a"] * 3, min_prefix=2) == ([0, 0, 0], [3])
    # Two houses behind a common intro: a prefix per house saves 6 + 6 tokens, one for all only 3 x 2.
    houses = [[1, 2, 3, 3, 3, 3, 5], [1, 2, 4, 4, 4, 4, 5], [1, 2, 3, 3, 3, 3, 6], [1, 2, 4, 4, 4, 4, 6]]
    assert shared_prefixes(houses, ["a"] * 4, min_prefix=2) == ([0, 1, 0, 1], [6, 6])
    # A common start shorter than min_prefix shares nothing: each row is a group of its own.
    assert shared_prefixes([[1, 2, 3, 4], [1, 2, 9, 9]], ["a", "a"], min_prefix=3) == ([0, 1], [3, 3])
    # One prompt repeated (a group's K samples) shares from min_repeated tokens, a common start only from min_prefix:
    # 8 copies of a 37-token prompt are one group of 36, two prompts alike in their first 36 tokens are not.
    prompt = list(range(100, 137))
    assert shared_prefixes([prompt] * 8, ["a"] * 8) == ([0] * 8, [36])
    assert shared_prefixes([prompt, prompt[:36] + [7]], ["a"] * 2) == ([0, 1], [36, 36])
    assert shared_prefixes([prompt[:16]] * 2, ["a"] * 2) == ([0, 1], [15, 15])  # 15 tokens < 16


def greedy_team(max_new_tokens: int):
    """Two greedy agents on the tiny model with distinct, non-zero adapters (LoRA B drawn from seed 0)."""
    from collab.policy.models import BaseConfig
    from collab.policy.team import AgentSpec, AgentTeam, SamplingSpec

    torch.manual_seed(0)
    team = AgentTeam(
        [AgentSpec(sampling=SamplingSpec(temperature=0.0, max_new_tokens=max_new_tokens)) for _ in range(2)],
        BaseConfig(name="tiny"),
    )
    with torch.no_grad():
        for name, p in team.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return team


def test_shared_prefix_prefill_gives_the_one_pass_logits_and_tokens(monkeypatch):
    """Tree-like prompts (two agents, each with three histories opening with the same long prompt): the
    prefill that shares each agent's prefix gives the next-token logits of one left-padded pass, and greedy
    decoding the same tokens."""
    import collab.policy.prefixes as sharing
    from collab.policy.kv_cache import cache_key
    from collab.policy.lora_batch import per_row_forward
    from collab.policy.prefill import prefill
    from collab.policy.prefixes import pad_left
    from collab.policy.sampling import GenerationRequest

    team = greedy_team(6)
    vocab = team.tokenizer_of(0).vocab_size
    g = torch.Generator().manual_seed(1)
    ids = lambda n: torch.randint(5, min(vocab, 500), (n,), generator=g).tolist()  # noqa: E731
    heads = [ids(80), ids(90)]
    prompts = [heads[a] + ids(n) for a in (0, 1) for n in (3, 17, 9)]
    agents = [0, 0, 0, 1, 1, 1]
    model, pad = team.model_of(0), team.tokenizer_of(0).pad_token_id
    names = [team.names[a] for a in agents]
    model.eval()
    with torch.no_grad():
        shared, _, _ = prefill(model, prompts, names, pad, team.device)
        ids_, mask, positions = pad_left(prompts, pad, team.device)
        from transformers import DynamicCache

        one = per_row_forward(model)(
            names,
            input_ids=ids_,
            attention_mask=mask,
            position_ids=positions,
            **{cache_key(): DynamicCache()},
            use_cache=True,
            logits_to_keep=1,
        )
    assert sharing.shared_prefixes(prompts, names)[1] == [80, 90]  # each agent's head is prefilled once
    assert torch.allclose(shared.logits[:, -1], one.logits[:, -1], atol=1e-4, rtol=1e-4)
    requests = [GenerationRequest(a, p, 2) for a, p in zip(agents, prompts)]
    with_sharing = [[c.completion_ids for c in out] for out in team.generate(requests)]
    monkeypatch.setattr(sharing, "MIN_PREFIX_SAVING", 2.0)  # never share
    without = [[c.completion_ids for c in out] for out in team.generate(requests)]
    assert with_sharing == without and all(len(c) == 6 for out in without for c in out)


@pytest.mark.parametrize("shared", [False, True])
def test_a_wide_prefill_in_pieces_gives_the_one_pass_logits_cache_and_tokens(monkeypatch, shared):
    """Prompts of 3 to 95 tokens, left-padded, two agents: a prefill fed 16 columns at a time (PREFILL_CHUNK; 512
    by default) gives the next-token logits and the KV cache of one pass, up to float rounding relative to their
    size, and greedy decoding the same tokens; the pieces are real (counted). ``shared``: three prompts open with
    the same 70 tokens, prefilled once: the head in pieces, then the remainders in pieces after it."""
    import collab.policy.prefill as prefill_module
    from collab.policy.kv_cache import cache_key
    from collab.policy.prefill import prefill
    from collab.policy.sampling import GenerationRequest

    team = greedy_team(5)
    g = torch.Generator().manual_seed(2)
    ids = lambda n: torch.randint(5, 500, (n,), generator=g).tolist()  # noqa: E731
    if shared:
        head = ids(70)
        prompts, agents = [head + ids(5), head + ids(30), head + ids(12)], [0, 0, 0]
    else:
        prompts, agents = [ids(3), ids(95), ids(40), ids(52), ids(57), ids(20)], [0, 1, 0, 0, 1, 0]
    model, pad = team.model_of(0), team.tokenizer_of(0).pad_token_id
    names = [team.names[a] for a in agents]
    model.eval()
    calls = []
    forward = prefill_module.per_row_forward

    def counting(m):
        inner = forward(m)

        def call(row_adapters, **inputs):
            calls.append(inputs["input_ids"].shape[1])
            return inner(row_adapters, **inputs)

        return call

    monkeypatch.setattr(prefill_module, "per_row_forward", counting)
    key = cache_key()
    with torch.no_grad():
        one, mask, _ = prefill(model, prompts, names, pad, team.device)
        assert calls == ([70, 30] if shared else [95])  # whole: the shared head, then the remainders; one pass
        calls.clear()
        monkeypatch.setattr(prefill_module, "PREFILL_CHUNK", 16)
        pieces, pieces_mask, _ = prefill(model, prompts, names, pad, team.device)
    assert torch.equal(mask, pieces_mask)
    # shared: the 70-token head in 5 pieces, then the remainders (30 columns, after the cached 70) in 2; else the
    # 95 columns in 6
    assert calls == ([16, 16, 16, 16, 6, 16, 14] if shared else [16, 16, 16, 16, 16, 15]), calls
    # pieces write into a cache reserved for the prompts (and the decode's room); one pass keeps dynamic layers
    assert {type(layer).__name__ for layer in pieces[key].layers} == {"ReservedLayer"}
    assert {type(layer).__name__ for layer in one[key].layers} == {"DynamicLayer"}
    a, b = one.logits[:, -1], pieces.logits[:, -1]
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(a.abs().max()))
    # the prompts' columns; a pad's column holds whatever its query row saw (it may attend to every column:
    # collab.policy.attention), which no row reads
    real = mask.bool()[:, None, :, None]
    for layer_a, layer_b in zip(one[key].layers, pieces[key].layers):
        keys_a, keys_b = layer_a.keys * real, layer_b.keys * real
        assert torch.allclose(keys_a, keys_b, rtol=1e-4, atol=1e-5 * float(keys_a.abs().max()))
    requests = [GenerationRequest(a, p, 1) for a, p in zip(agents, prompts)]
    chunked = [[c.completion_ids for c in out] for out in team.generate(requests)]
    monkeypatch.setattr(prefill_module, "PREFILL_CHUNK", 512)
    whole = [[c.completion_ids for c in out] for out in team.generate(requests)]
    assert chunked == whole and all(len(c) == 5 for out in whole for c in out)


def test_a_stop_text_ends_a_response_where_its_text_first_ends_with_it(one_thread):
    """Greedy rows: a response decoded with ``stop`` is the unstopped response cut at the first token whose text so
    far ends with the stop text (a tool call's closing tag ends a turn's round so), and counts as finished."""
    from collab.policy.sampling import GenerationRequest
    from tests.policy.test_team import make_team, prompt

    team = make_team(0.0)
    team.specs[0].sampling.max_new_tokens = 24
    request = GenerationRequest(0, prompt(team, 0, "Count to ten."), n=1)
    full = team.generate([request])[0][0]
    tokenizer = team.tokenizer_of(0)
    text = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    stop = text(full.completion_ids[:6])[-3:]  # the last characters of the first 6 tokens' text
    cut = next(k for k in range(1, len(full.completion_ids) + 1) if text(full.completion_ids[:k]).endswith(stop))
    assert cut < len(full.completion_ids)  # the stop cuts the response short
    stopped = team.generate([request], stop=stop)[0][0]
    assert stopped.completion_ids == full.completion_ids[:cut] and stopped.finished
    assert stopped.logprobs == full.logprobs[:cut]


def test_a_kept_cache_resumes_with_the_whole_prompts_logits_and_tokens(one_thread):
    """A tool round's rows go on from the KV cache their last round kept: rows of 12 to 61 tokens under two
    adapters, each row's cache cut out of one left-padded batch (``row_cache``: its real columns only), then
    resumed with 1 to 7 new tokens (a result inserted into the turn): the next-token logits of prefilling the
    whole prompts, up to float rounding relative to their size, positions continuing each row's own; decoding
    from the kept caches gives the greedy tokens of decoding from the whole prompts; a row's own round keeps its
    cache when it ends at the stop text, with the length of what was fed (the prompt and all tokens but the last)."""
    from collab.policy.kv_cache import cache_key, row_cache
    from collab.policy.prefill import prefill, resume_prefill
    from collab.policy.sampling import GenerationRequest

    team = greedy_team(6)
    g = torch.Generator().manual_seed(3)
    ids = lambda n: torch.randint(5, 500, (n,), generator=g).tolist()  # noqa: E731
    heads, tails, agents = [ids(12), ids(61), ids(30)], [ids(1), ids(7), ids(4)], [0, 1, 1]
    model, pad = team.model_of(0), team.tokenizer_of(0).pad_token_id
    names = [team.names[a] for a in agents]
    model.eval()
    with torch.no_grad():
        first, mask, _ = prefill(model, heads, names, pad, team.device)
        pasts = [row_cache(first[cache_key()], mask[r], r) for r in range(3)]
        assert [p.length for p in pasts] == [12, 61, 30]
        resumed, rmask, positions = resume_prefill(model, pasts, tails, names, pad, team.device)
        whole, _, _ = prefill(model, [h + t for h, t in zip(heads, tails)], names, pad, team.device)
    assert positions[:, -1].tolist() == [12, 67, 33] and rmask.sum(-1).tolist() == [13, 68, 34]
    a, b = whole.logits[:, -1], resumed.logits[:, -1]
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(a.abs().max()))

    never = "\x00never\x00"  # a stop text (a tool round's) that no row writes
    kept = [GenerationRequest(a, h + t, 1, past=p) for a, h, t, p in zip(agents, heads, tails, pasts)]
    fresh = [GenerationRequest(a, h + t, 1) for a, h, t in zip(agents, heads, tails)]
    from_cache = [out[0].completion_ids for out in team.generate(kept, stop=never)]
    assert from_cache == [out[0].completion_ids for out in team.generate(fresh)]

    stop = team.tokenizer_of(0).decode(from_cache[1][:3], skip_special_tokens=True)
    (row,) = team.generate([fresh[1]], stop=stop)[0]
    assert row.past is not None and row.past.length == len(fresh[1].prompt_ids) + len(row.completion_ids) - 1
    assert all(out[0].past is None for out in team.generate(fresh))  # no stop text: nothing kept


def test_a_shared_prefix_gradient_adds_its_rows_in_a_fixed_order():
    """The update scores K samples after their prompt computed once (the prefix's cache given to each of its rows):
    the prefix's gradient is the sum of its rows'. Indexing's backward would add them with atomic adds from every
    thread (``index_put_`` with accumulate), in an order that changed from run to run at 2 threads (a full agent's
    weights after one step differed in their last bits); the rows are selected by ``index_select``, whose backward
    adds them in order. Checked on the ops the backward runs, whatever the thread count, and on the gradient: the
    one of the prompts scored whole, up to float rounding."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import collab.policy.prefixes as prefixes
    from tests.policy.test_team import lora_b_params, make_team, perturb_lora_b, prompt

    team = make_team(1.0, 1.0)
    perturb_lora_b(team)
    head = prompt(team, 0, "Say a long sentence about the colour of the sea on a grey morning.")
    prompts, completions = [head] * 3 + [prompt(team, 1, "Name a colour.")], [[5, 6, 7], [8, 9], [10], [11, 12]]
    agents = [0, 0, 0, 1]

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.accumulating = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if "index_put" in str(func) and (kwargs.get("accumulate") or (len(args) > 3 and args[3])):
                self.accumulating.append(str(func))
            return func(*args, **kwargs)

    def gradient(share: bool) -> list[torch.Tensor]:
        params = lora_b_params(team, 0) + lora_b_params(team, 1)
        for p in params:
            p.grad = None
        saving = prefixes.MIN_PREFIX_SAVING
        prefixes.MIN_PREFIX_SAVING = saving if share else 2.0  # 2.0: never share
        try:
            with Ops() as ops:
                scores = team.logprobs(agents, prompts, completions)
                torch.stack([s.sum() for s in scores]).sum().backward()
        finally:
            prefixes.MIN_PREFIX_SAVING = saving
        assert ops.accumulating == []
        return [p.grad.clone() for p in params]

    assert prefixes.shared_prefixes(prompts, [team.names[a] for a in agents])[1][0] >= len(head) - 1
    shared, whole = gradient(True), gradient(False)
    for a, b in zip(shared, whole):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))
