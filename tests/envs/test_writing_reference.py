"""``reward_mode="reference"`` of the writing env, checked against hand computations.

Every expected value below was worked out by hand from the reference implementation's rules
(OpenMLRL/LLM_Collab_Writing, rewards/tldr_rewards.py), not by running collab; the arithmetic is in the
comment of each case. ``ref`` is the reference mode, ``paper`` the default mode, each as (total, terminated).

Reference rules used: L1 whitespace tokens 8-256 -> 0.5 else stop at 0; L2 raw len(detailed)/len(concise)
1.6-3.2 -> 1, [1.1,1.6) -> (r-1.1)/0.5, (3.2,5.0] -> 1-(r-3.2)/1.8, else stop; L3 unique lowercase \\w+ words
(stopwords kept) detailed/concise >= 2 -> 0.5, [1.3,2) -> 0.5(u-1.3)/0.7, else stop; L4 0.4 T + 0.6 J with
T = 0 (no category) or 0.4 + 0.05 (k-1) (k categories, substring search in the detailed text only) and
J = min(Jaccard of \\w+ sets without its stopwords, 0.03)/0.03, Jaccard of two empty sets = 1.
"""

from __future__ import annotations

import math

import pytest

from collab.envs import make_env
from collab.envs.writing import WritingEnv
from collab.envs.writing import env as w
from collab.errors import UserError

# 4-letter filler words without vowels: no stopword of either list, no transition word, no substring of one.
FILL = [f"zq{a}{b}" for a in "bcdfghjklm" for b in "bcdfghjklm"]
# 3-letter filler words, likewise.
SHORT = [f"x{a}{b}" for a in "bcdfg" for b in "bcdfghjklm"]


def fill(n: int, start: int = 0) -> str:
    """FILL[start : start+n]: n tokens, n distinct words, 5n - 1 characters."""
    return " ".join(FILL[start : start + n])


def short(n: int) -> str:
    """n distinct 3-letter words: 4n - 1 characters."""
    return " ".join(SHORT[:n])


C50 = "zqzzz " + fill(9, 1)  # 10 tokens, 10 distinct words, 5 + 1 + 44 = 50 characters
LN2 = math.log(2)

CASES = [
    # (id, concise, detailed, ref (total, terminated), paper (total, terminated))
    # L1: concise 7 tokens < 8 -> 0. Paper: 7 words -> 0.
    ("tokens-7", fill(7), fill(20, 7), (0.0, True), (0.0, True)),
    # L1: 8 and 256 tokens pass (0.5); L2 ratio (256*5-1)/39 = 1279/39 = 32.8 > 5 -> stop at 0.5. Paper alike.
    ("tokens-256", fill(8), " ".join(["zqbb"] * 256), (0.5, True), (0.5, True)),
    # L1: 257 tokens > 256 -> 0. Paper alike.
    ("tokens-257", fill(8), " ".join(["zqbb"] * 257), (0.0, True), (0.0, True)),
    # Ref: "--" is a token: 8 and 16 tokens -> 0.5; 79/35 = 2.26 -> 1; unique 16/6 = 2.67 -> 0.5 (dashes no \w);
    # no transitions, disjoint -> J 0: 2.0. Paper: 6 words -> 0.
    ("dash-tokens", fill(6) + " -- --", fill(16, 6), (2.0, False), (0.0, True)),
    # Ref: "zqbb-zqbc" is one token: 7 tokens -> 0. Paper: 8 words -> 0.5; 79/39 = 2.03 -> 1; vocab 16/8 = 2 -> 0.5;
    # style 0: 2.0.
    ("hyphen-token", "zqbb-zqbc " + fill(6, 2), fill(16, 10), (0.0, True), (2.0, False)),
    # Ref: 11 trailing spaces count: 79/60 = 1.31667 -> (0.21667)/0.5 = 13/30; unique 16/10 = 1.6 -> 0.5*0.3/0.7 = 3/14;
    # style 0: 0.5 + 13/30 + 3/14 = 241/210. Paper strips: 79/49 = 1.61 -> 1: 0.5 + 1 + 3/14 = 12/7.
    ("untrimmed-length", fill(10) + " " * 11, fill(16, 10), (241 / 210, False), (12 / 7, False)),
    # Ref: 59/33 = 1.79 -> 1; unique keeps the/and/of/to: 12/8 = 1.5 -> 0.5*0.2/0.7 = 1/7; J: {zqbb..zqbf} vs 12 others
    # -> 0: 1.5 + 1/7. Paper: vocab 12/4 = 3 -> 0.5: 2.0.
    ("stopwords-kept-partial", "the zqbb and zqbc of zqbd to zqbf", fill(12, 4), (1.5 + 1 / 7, False), (2.0, False)),
    # Ref: 49/33 = 1.4848 -> (49/33 - 1.1)/0.5 = 98/33 - 2.2; unique 10/8 = 1.25 < 1.3 -> stop:
    # 0.5 + 98/33 - 2.2 = 419/330. Paper: vocab 10/4 = 2.5 -> 0.5, style 0: 419/330 + 0.5.
    (
        "stopwords-kept-stop",
        "the zqbb and zqbc of zqbd to zqbf",
        fill(10, 4),
        (419 / 330, True),
        (419 / 330 + 0.5, False),
    ),
    # Ref: 99/49 = 2.02 -> 1; unique 20/10 = 2 -> 0.5; "also" gives elaboration + cause_effect ("so" inside): T = 0.45;
    # J: "also" is its stopword: 1/(10+19-1) = 1/28 > 0.03 -> 1; style 0.18 + 0.6: 2.78.
    # Paper: addition only, T = 0.6 ln 2; J 1/29 -> 1: 2.6 + 0.24 ln 2.
    ("also-contains-so", fill(10), "also " + fill(19, 9), (2.78, False), (2.6 + 0.24 * LN2, False)),
    # Ref: transitions are searched in the detailed text only: T 0; 99/52 = 1.90 -> 1; 20/10 -> 0.5; J 1/29 -> 1: 2.6.
    # Paper: combined text has "however" (contrast): 2.6 + 0.24 ln 2.
    ("transition-in-concise", "however " + fill(9), fill(20, 8), (2.6, False), (2.6 + 0.24 * LN2, False)),
    # Ref: 12 categories (also, namely, actually, thus, however, next, certainly, overall, similarly, although, unless,
    # when): T = 0.4 + 0.05*11 = 0.95; 137/49 = 2.80 -> 1; 22/10 -> 0.5; J 1/(10+20-1) (also, when dropped) -> 1;
    # style 0.38 + 0.6: 2.98. Paper: 10 categories >= 5 -> T 1; vocab 21/10 -> 0.5; J 1/30 -> 1: 3.0.
    (
        "twelve-categories",
        fill(10),
        "also namely actually thus however next certainly overall similarly although unless when " + fill(10, 9),
        (2.98, False),
        (3.0, False),
    ),
    # Ref: 34/15 = 2.27 -> 1; unique {the, of}/{a} = 2 -> 0.5; no transition substring; both content sets empty:
    # Jaccard 1 -> J 1: 2.6. Paper: concise vocabulary empty -> unique ratio 0 -> stop at 1.5.
    ("empty-vocabularies", "a a a a a a a a", "the of the of the of the of the of", (2.6, False), (1.5, True)),
    # Ref: 8 and 10 tokens; 29/15 = 1.93 -> 1; concise has no \w word -> stop at 1.5. Paper: 0 words -> 0.
    ("no-word-concise", "- - - - - - - -", "-- -- -- -- -- -- -- -- -- --", (1.5, True), (0.0, True)),
    # Both: 204/99 = 2.06 -> 1; 41/20 = 2.05 -> 0.5; Jaccard 1/60 -> J = (1/60)/0.03 = 5/9; style 0.6*5/9 = 1/3: 7/3.
    ("jaccard-partial", fill(20), fill(41, 19), (7 / 3, False), (7 / 3, False)),
    # Both: 80/50 = 1.6 exactly -> 1; unique 16/10 = 1.6 -> 3/14; disjoint: 0.5 + 1 + 3/14 = 12/7.
    ("length-1.6", C50, "zqzzy " + fill(15, 11), (12 / 7, False), (12 / 7, False)),
    # Both: 55/50 = 1.1 exactly -> 0 and go on; unique 14/10 = 1.4 -> 0.5*0.1/0.7 = 1/14: 0.5 + 1/14.
    ("length-1.1", C50, short(14), (0.5 + 1 / 14, False), (0.5 + 1 / 14, False)),
    # Both: 54/50 = 1.08 < 1.1 -> stop at 0.5.
    ("length-below-1.1", C50, short(13) + " zq", (0.5, True), (0.5, True)),
    # Both: 160/50 = 3.2 exactly -> 1; unique 32/10 -> 0.5; disjoint: 2.0.
    ("length-3.2", C50, "zqzzy " + fill(31, 10), (2.0, False), (2.0, False)),
    # Both: 161/50 = 3.22 -> 1 - 0.02/1.8 = 89/90; unique 3.2 -> 0.5: 1 + 89/90.
    ("length-3.22", C50, "zqzzyy " + fill(31, 10), (1 + 89 / 90, False), (1 + 89 / 90, False)),
    # Both: 250/50 = 5.0 exactly -> 1 - 1.8/1.8 = 0 and go on; unique 50/10 -> 0.5: 1.0.
    ("length-5.0", C50, "zqzzy " + fill(49, 10), (1.0, False), (1.0, False)),
    # Both: 251/50 = 5.02 > 5 -> stop at 0.5.
    ("length-5.02", C50, "zqzzyy " + fill(49, 10), (0.5, True), (0.5, True)),
    # Both: 79/49 = 1.61 -> 1; unique 13/10 = 1.3 exactly -> 0 and go on; J 1/22 -> 1: 0.5 + 1 + 0 + 0.6 = 2.1.
    ("unique-1.3", fill(10), fill(13, 9) + " " + fill(3, 9), (2.1, False), (2.1, False)),
    # Both: 79/49 -> 1; unique 12/10 = 1.2 < 1.3 -> stop at 1.5.
    ("unique-1.2", fill(10), fill(12, 9) + " " + fill(4, 9), (1.5, True), (1.5, True)),
    # Ref: digits are \w words: 71/39 = 1.82 -> 1; unique 16/8 = 2 -> 0.5; disjoint: 2.0.
    # Paper: 8 words in detailed; vocab 8/8 = 1 -> stop at 1.5.
    ("digits", fill(8), fill(8, 8) + " 100 101 102 103 104 105 106 107", (2.0, False), (1.5, True)),
    # Ref: don't/won't/can't -> don, t, won, t, can, t: unique 12+4 = 16 / 8 = 2 -> 0.5; 77/39 = 1.97 -> 1;
    # J: disjoint -> 0: 2.0. Paper: the contractions are stopwords: vocab 12/8 = 1.5 -> 1/7: 1.5 + 1/7.
    ("apostrophes", fill(8), fill(12, 8) + " don't won't can't", (2.0, False), (1.5 + 1 / 7, False)),
    # Ref: "good" is its stopword: content sets disjoint -> J 0; 99/49 -> 1; unique 20/10 -> 0.5: 2.0.
    # Paper: "good" shared: Jaccard 1/29 -> J 1: 2.6.
    ("good-is-stopword", "good " + fill(9), "good " + fill(19, 9), (2.0, False), (2.6, False)),
    # Ref: "as" inside "was" (time): T 0.4; 98/49 = 2 -> 1; unique 20/10 -> 0.5; J 1/28 -> 1: 2.0 + 0.16 + 0.6 = 2.76.
    # Paper: "was" is a stopword: vocab 19/10 = 1.9 -> 0.5*0.6/0.7 = 3/7; T 0; J 1/28 -> 1: 2.1 + 3/7.
    ("as-inside-was", fill(10), "was " + fill(19, 9), (2.76, False), (2.1 + 3 / 7, False)),
    # Ref: "for\nexample" is no "for example": T 0; 101/49 = 2.06 -> 1; unique 20/10 -> 0.5; J 1/28 -> 1: 2.6.
    # Paper: matched across the line break (example): vocab 19/10 -> 3/7: 2.1 + 3/7 + 0.24 ln 2.
    ("phrase-line-break", fill(10), "for\nexample " + fill(18, 9), (2.6, False), (2.1 + 3 / 7 + 0.24 * LN2, False)),
    # Ref: "however" is both contrast and concession: T 0.45; 102/49 -> 1; 20/10 -> 0.5; J 1/29 -> 1: 2.78.
    # Paper: contrast only: 2.6 + 0.24 ln 2.
    ("however-two-categories", fill(10), "however " + fill(19, 9), (2.78, False), (2.6 + 0.24 * LN2, False)),
]


@pytest.mark.parametrize("concise,detailed,ref,paper", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hand_computed_rewards(concise, detailed, ref, paper):
    for mode, (expected, stopped) in (("reference", ref), ("paper", paper)):
        total, terminated, info = w.writing_reward(concise, detailed, mode)
        assert total == pytest.approx(expected, rel=1e-9, abs=1e-12), mode
        assert terminated is stopped, mode
        assert info["total"] == total
        assert sum(v for k, v in info.items() if k != "total") == pytest.approx(total, rel=1e-9, abs=1e-12)


def test_enough_cases_and_some_differ():
    assert len(CASES) >= 20
    assert sum(ref != paper for *_, ref, paper in CASES) >= 12


def test_reference_measurements():
    m = w.measure("zqbb-zqbc zqbd  ", "also was 100 don't", "reference")
    assert m["concise_words"] == 2 and m["detailed_words"] == 4
    assert m["length_ratio"] == pytest.approx(18 / 16, rel=1e-9)  # 16 characters, trailing spaces included
    # concise words {zqbb, zqbc, zqbd} = 3; detailed {also, was, 100, don, t} = 5
    assert m["unique_ratio"] == pytest.approx(5 / 3, rel=1e-9)
    # also: elaboration, cause_effect (so); was: time (as)
    assert w.reference_transition_categories("also was") == {"elaboration", "cause_effect", "time"}
    assert w.reference_transition_categories("ALSO") == {"elaboration", "cause_effect"}
    assert w.reference_transition_categories("for\nexample") == set()
    assert w.reference_words("Don't 42_x!") == ["don", "t", "42_x"]
    assert w.reference_jaccard(set(), set()) == 1.0 and w.jaccard(set(), set()) == 0.0
    assert len(w.REFERENCE_TRANSITIONS) == 12 and len(w.REFERENCE_STOPWORDS) == 106


@pytest.mark.parametrize("k,expected", [(0, 0.0), (1, 0.4), (2, 0.45), (5, 0.6), (12, 0.95)])
def test_reference_transition_score(k, expected):
    # 0 without a category, else 0.4 + 0.05 (k - 1): k=5 -> 0.6, k=12 -> 0.95 (cap 0.6 on the extra never binds)
    assert w.reference_transition_score(k) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_default_mode_is_paper():
    concise, detailed = fill(10), "also " + fill(19, 9)
    assert w.writing_reward(concise, detailed) == w.writing_reward(concise, detailed, "paper")
    assert WritingEnv().reward_mode == "paper"


def test_env_reference_mode():
    env = make_env("writing", reward_mode="reference")
    state = env.reset(env.tasks("train")[0])
    concise, detailed = fill(10), "also " + fill(19, 9)
    score = env.score(state, [concise, detailed])
    assert score.rewards == pytest.approx((2.78, 2.78), rel=1e-9)  # case "also-contains-so"
    assert WritingEnv().score(state, [concise, detailed]).rewards[0] == pytest.approx(2.6 + 0.24 * LN2, rel=1e-9)
    replies = env.feedback(state, [concise, detailed], score)
    assert all("Transition categories in the detailed summary 2 of 12" in r for r in replies)


@pytest.mark.parametrize("bad", ["Reference", "exact", ""])
def test_bad_reward_mode(bad):
    with pytest.raises(UserError, match="reward_mode.*valid: paper, reference"):
        WritingEnv(reward_mode=bad)
    with pytest.raises(UserError, match="valid: paper, reference"):
        w.writing_reward("a", "b", bad)
