"""WritingEnv and its reward bands, checked against hand computations (no model)."""

from __future__ import annotations

import json
import math
import sys
import types

import pytest

from collab.envs.writing import WritingEnv
from collab.envs.writing import env as w
from collab.errors import UserError

# Content words that are no stopwords and match no transition phrase: "zqbk", "zqbl", ...
VOCAB = [f"zq{a}{b}" for a in "bcdfghjklm" for b in "bcdfghjklm"]


def text(n_words: int, start: int = 0) -> str:
    """``n_words`` distinct content words, all of the same length (4 characters)."""
    return " ".join(VOCAB[start : start + n_words])


# -- measurements ----------------------------------------------------------------------------------------
def test_words_and_vocabulary():
    assert w.words("I'm SO tired, and the dog's 3 bowls!") == ["i'm", "so", "tired", "and", "the", "dog's", "bowls"]
    assert w.vocabulary("The dog and the cat and THE dog") == {"dog", "cat"}


def test_length_ratio_in_characters():
    assert w.length_ratio("abcd", "abcdefgh") == 2.0
    assert w.length_ratio("  abcd\n", "abcdefgh  ") == 2.0  # surrounding whitespace ignored
    assert w.length_ratio("", "abc") == 0.0


def test_unique_word_ratio():
    assert w.unique_word_ratio(text(4), text(10)) == 2.5
    assert w.unique_word_ratio(text(20), text(33)) == pytest.approx(1.65)
    assert w.unique_word_ratio(text(5) + " the and of", text(5) + " " + text(5)) == 1.0  # stopwords, repeats ignored
    assert w.unique_word_ratio("the and of", text(5)) == 0.0


# -- bands -----------------------------------------------------------------------------------------------
def test_structure_band():
    assert w.structure_reward(8, 256) == 0.5
    assert w.structure_reward(7, 100) is None
    assert w.structure_reward(20, 257) is None


@pytest.mark.parametrize(
    "ratio,expected",
    [(2.0, 1.0), (1.6, 1.0), (3.2, 1.0), (1.35, 0.5), (4.1, 0.5), (1.1, 0.0), (5.0, 0.0), (1.0, None), (6.0, None)],
)
def test_length_band(ratio, expected):
    got = w.length_reward(ratio)
    assert got == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize(
    "ratio,expected", [(2.5, 0.5), (2.0, 0.5), (1.65, 0.25), (1.3, 0.0), (1.0, None), (1.29, None)]
)
def test_uniqueness_band(ratio, expected):
    got = w.uniqueness_reward(ratio)
    assert got == (None if expected is None else pytest.approx(expected))


def test_transition_words_match_whole_words_and_phrases():
    assert w.transition_categories("I also went home.") == {"addition"}  # "so" inside "also" does not count
    assert "effect" in w.transition_categories("It rained, so I went home.")
    assert w.transition_categories("For example, the dog barked.") == {"example"}
    assert w.transition_categories("for\n  EXAMPLE") == {"example"}  # case and whitespace are free
    assert w.transition_categories("I asked for the example.") == set()
    assert w.transition_categories("Firstly we ate, nevertheless it was late") == {"sequence", "contrast"}
    assert w.transition_categories("He is thus happy; in fact, very") == {"effect", "emphasis"}
    assert w.transition_categories("zqbk zqbl") == set()
    assert len(w.TRANSITIONS) == 12


def test_transition_score_formula():
    assert w.transition_score(0) == 0.0
    assert w.transition_score(1) == pytest.approx(0.6 * math.log(2))  # 0.416
    assert w.transition_score(3) == pytest.approx(0.6 * math.log(4))  # 0.832
    assert w.transition_score(4) < 1.0
    assert w.transition_score(5) == 1.0
    assert w.transition_score(12) == 1.0


def test_jaccard_and_cap():
    assert w.jaccard({"a", "b"}, {"b", "c"}) == pytest.approx(1 / 3)
    assert w.jaccard(set(), set()) == 0.0
    assert w.jaccard_score(0.015) == pytest.approx(0.5)
    assert w.jaccard_score(0.03) == 1.0
    assert w.jaccard_score(0.5) == 1.0  # capped at 0.03
    assert w.style_reward(0, 0.5) == pytest.approx(0.6)
    assert w.style_reward(5, 0.0) == pytest.approx(0.4)
    assert w.style_reward(1, 0.015) == pytest.approx(0.4 * 0.6 * math.log(2) + 0.3)


# -- the staged reward -----------------------------------------------------------------------------------
KEYS = {"structure", "length", "uniqueness", "style", "total"}


def test_word_count_out_of_band_terminates_with_zero():
    total, terminated, info = w.writing_reward(text(5), text(20))
    assert (total, terminated) == (0.0, True)
    assert set(info) == KEYS and all(v == 0.0 for v in info.values())


def test_length_ratio_out_of_band_terminates_after_structure():
    total, terminated, info = w.writing_reward(text(10), text(10, start=10))  # ratio 1.0
    assert terminated and total == 0.5
    assert info == {"structure": 0.5, "length": 0.0, "uniqueness": 0.0, "style": 0.0, "total": 0.5}
    total, terminated, _ = w.writing_reward(text(10), text(70, start=10))  # ratio (70*5-1)/(10*5-1) = 7.1
    assert terminated and total == 0.5


def test_uniqueness_out_of_band_terminates_after_length():
    concise = text(10)
    total, terminated, info = w.writing_reward(concise, concise + " " + concise)  # ratio 2.02, unique ratio 1.0
    assert terminated and info["length"] == 1.0 and info["uniqueness"] == 0.0
    assert total == pytest.approx(1.5)


def test_partial_bands_add_up():
    # concise 20 words (99 chars), detailed 33 distinct words sharing 3 with it (33*5-1 = 164 chars): ratio 1.657,
    # unique ratio 1.65 -> 0.25, no transitions, Jaccard 3/50 -> capped: style 0.6.
    concise, detailed = text(20), text(33, start=17)
    total, terminated, info = w.writing_reward(concise, detailed)
    assert not terminated
    assert info["length"] == 1.0 and info["uniqueness"] == pytest.approx(0.25) and info["style"] == pytest.approx(0.6)
    assert total == pytest.approx(0.5 + 1.0 + 0.25 + 0.6)


CONCISE = "The writer lost her job two months ago and is ashamed to tell her proud parents."
DETAILED = (
    "First, the writer lost her job in layoffs. However, she hides it from her parents because they paid for "
    "college. For example, on weekly calls she says work is fine. In fact, savings last four months, so she "
    "must eventually confess."
)


def test_full_reward_on_a_hand_built_pair():
    m = w.measure(CONCISE, DETAILED)
    assert 8 <= m["concise_words"] <= 256 and 8 <= m["detailed_words"] <= 256
    assert 1.6 <= m["length_ratio"] <= 3.2
    assert m["unique_ratio"] >= 2.0
    assert m["categories"] >= 5  # sequence, contrast, cause, example, emphasis, effect
    assert m["jaccard"] >= 0.03
    total, terminated, info = w.writing_reward(CONCISE, DETAILED)
    assert not terminated
    assert info == {"structure": 0.5, "length": 1.0, "uniqueness": 0.5, "style": 1.0, "total": 3.0}
    assert total == w.MAX_REWARD == 3.0


# -- the environment -------------------------------------------------------------------------------------
def test_packaged_corpus_and_splits():
    env = WritingEnv()
    train, evals = env.tasks("train"), env.tasks("eval")
    assert len(train) == 40 and len(evals) == 24
    assert {t["id"] for t in train}.isdisjoint(t["id"] for t in evals)
    for t in list(train) + list(evals):
        assert 80 <= len(w.words(t["prompt"])) <= 200
    with pytest.raises(UserError, match="split"):
        env.tasks("test")


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def test_local_file_missing_field_names_it(tmp_path):
    path = write_jsonl(tmp_path / "tldr.jsonl", [{"prompt": "a post"}, {"post": "no prompt here"}])
    with pytest.raises(UserError, match="'prompt'"):
        WritingEnv(dataset=path)


def test_local_file_default_and_clamped_splits(tmp_path):
    big = write_jsonl(tmp_path / "big.jsonl", [{"prompt": f"post {i}"} for i in range(1200)])
    env = WritingEnv(dataset=big)
    assert len(env.tasks("train")) == 1000 and len(env.tasks("eval")) == 100
    assert env.tasks("eval")[0]["prompt"] == "post 1000"
    small = write_jsonl(tmp_path / "small.jsonl", [{"prompt": f"post {i}"} for i in range(30)])
    env = WritingEnv(dataset=small)  # the last tenth is eval
    assert len(env.tasks("train")) == 27 and len(env.tasks("eval")) == 3
    env = WritingEnv(dataset=small, train_split="[0:5]", eval_split="[5:7]")
    assert [t["prompt"] for t in env.tasks("eval")] == ["post 5", "post 6"]
    other = write_jsonl(tmp_path / "other.jsonl", [{"text": "a post"}])
    assert WritingEnv(dataset=other, text_field="text").observe({"text": "my post"})[0].count("my post") == 1


def test_hub_without_datasets_package_is_a_user_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails
    with pytest.raises(UserError, match="datasets.*jsonl"):
        WritingEnv(dataset="trl-lib/tldr")


def test_hub_unreachable_is_a_user_error(monkeypatch):
    def offline(name, split):
        raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(UserError, match="could not load dataset 'someone/posts'"):
        WritingEnv(dataset="hub:someone/posts")


def test_hub_records_are_used(monkeypatch):
    rows = [{"prompt": f"post {i}", "completion": "tl;dr"} for i in range(20)]
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda name, split: rows))
    env = WritingEnv(dataset="trl-lib/tldr")
    assert len(env.tasks("train")) == 18 and len(env.tasks("eval")) == 2


def test_observe_puts_the_post_into_both_prompts():
    env = WritingEnv()
    task = env.tasks("eval")[0]
    concise, detailed = env.observe(task)
    post = task["prompt"].strip()
    assert concise == (
        f"Create a concise summary response to this post.\nQuery: {post}\n"
        "Instructions: Provide a brief and focused summary in a few sentences"
    )
    assert detailed == (
        f"Create a detailed summary response to this post.\nQuery: {post}\n"
        "Instructions: You should use transition words to improve flow"
    )
    assert [r.name for r in env.roles] == ["concise", "detailed"]
    assert [r.max_new_tokens for r in env.roles] == [64, 128]


def test_reset_and_step_at_horizon_one():
    env = WritingEnv()
    state = env.reset(env.tasks("train")[0])
    assert [h[-1]["role"] for h in state.histories] == ["user", "user"]
    result = env.step(state, [CONCISE, DETAILED])
    assert result.done and result.state.done
    assert result.rewards == (3.0, 3.0)
    assert set(result.info) == KEYS
    assert [h[-1] for h in result.state.histories] == [
        {"role": "assistant", "content": CONCISE},
        {"role": "assistant", "content": DETAILED},
    ]


def test_multi_turn_feedback():
    env = WritingEnv(horizon=2)
    state = env.reset(env.tasks("train")[0])
    concise = " ".join(v for v in VOCAB[:5] for _ in range(2))  # 10 words, 5 distinct, 49 characters
    result = env.step(state, [concise, text(13, start=20)])  # 64 characters: length ratio 1.31, unique ratio 2.6
    assert not result.done and result.rewards[0] == pytest.approx(0.5 + (64 / 49 - 1.1) / 0.5 + 0.5)
    to_concise, to_detailed = (h[-1]["content"] for h in result.state.histories)
    assert "concise summary is 10 words; the detailed one is 13 words" in to_concise
    assert "Length ratio 1.31 (target 1.6-3.2): make yours shorter" in to_concise
    assert "make yours longer" in to_detailed and "Unique-word ratio 2.60 (target >= 2.0): met" in to_detailed
    assert "Use more kinds of transition words" in to_detailed
    # an out-of-band pair ends the episode before the horizon
    assert env.step(state, ["too short", DETAILED]).done
    # a pair that meets every band is told so
    score = env.score(state, [CONCISE, DETAILED])
    replies = env.feedback(state, [CONCISE, DETAILED], score)
    assert all("met" in r and "Transition categories used" in r for r in replies)
