"""The writing env's arXiv expansion task (MAGRPO): its reward in both modes against hand computations, its
prompts, the publisher's file, and one scripted episode.

Every expected reward below was worked out by hand from the rules (OpenMLRL/LLM_Collab_Writing,
rewards/arxiv_rewards.py for ``reference``; collab.envs.writing.arxiv for ``paper``), not by running
collab; the arithmetic is in the comment of each case. Rules used:
L1 whitespace tokens 128-256 each -> 0.5, else stop at 0.
L2 character ratio methods/background: reference full in [1.3, 1.6], (r - 0.8)/0.5 on [0.8, 1.3),
1 - (r - 1.6)/0.4 on (1.6, 2.0]; paper full in [1.0, 1.3], (r - 0.8)/0.2 on [0.8, 1.0), 1 - (r - 1.3)/0.2 on
(1.3, 1.5], and it strips surrounding whitespace first; else stop.
L3 unique-word ratio methods/background (reference keeps stopwords, paper drops them): 0.5 in [0.7, 1.3],
0.5 (u - 0.5)/0.2 on [0.5, 0.7), 0.5 (1 - (u - 1.3)/0.4) on (1.3, 1.7]; else stop.
L4 0.4 T + 0.6 J: T = 0 without transitions, else 0.4 + 0.05 (k - 1); J = min(Jaccard, 0.23)/0.23.
"""

from __future__ import annotations

import json

import pytest
import yaml

from collab.envs.writing import WritingEnv
from collab.envs.writing import arxiv as a
from tests.envs.test_published import one_line, parquet

# 400 distinct 4-letter filler words without vowels: no stopword, no transition word, no part of one.
CONSONANTS = "bcdfghjklmnpqrstvwxz"
FILL = [f"zq{x}{y}" for x in CONSONANTS for y in CONSONANTS]


def t(n: int, start: int = 0) -> str:
    """FILL[start : start+n]: n tokens, n distinct words, 5n - 1 characters."""
    return " ".join(FILL[start : start + n])


B128 = t(128)  # 128 tokens and words, 639 characters
B130 = t(129) + " zqbbb"  # 130 tokens and words, 516 + 5 + 129 = 650 characters
TWELVE = "also namely actually thus however next certainly overall similarly although unless when because specifically"
# 14 words, 95 letters. Reference: also (elaboration, and cause_effect by "so" inside), namely (examples), actually
# (explanation), however (contrast, concession), next (sequence), certainly (emphasis), overall (summary),
# similarly (comparison), unless (condition), when (time): all 12. Paper: also (addition), namely (example), thus
# (effect), however (contrast), next (sequence), certainly (emphasis), overall (conclusion), similarly (comparison),
# although (concession), unless (condition), because (cause), specifically (clarification): all 12.

CASES = [
    # (id, background, methods, reference (total, terminated), paper (total, terminated))
    # L1: 127 tokens < 128 -> 0.
    ("tokens-127", t(127), t(150), (0.0, True), (0.0, True)),
    # L1: 257 tokens > 256 -> 0.
    ("tokens-257", B128, t(257), (0.0, True), (0.0, True)),
    # L1: 128 and 256 pass (0.5); L2 1279/639 = 2.0016 > 2.0 (and > 1.5) -> stop at 0.5.
    ("tokens-128-256", B128, t(256), (0.5, True), (0.5, True)),
    # L2: 799/1000 = 0.799 < 0.8 -> stop at 0.5.
    ("ratio-0.799", t(199) + " zqbbb", t(160, 200), (0.5, True), (0.5, True)),
    # L2: 800/1000 = 0.8 exactly -> 0 and go on (both); L3 160/200 = 0.8 -> 0.5; disjoint, no transitions: 1.0.
    ("ratio-0.8", t(199) + " zqbbb", t(159, 200) + " zqccc", (1.0, False), (1.0, False)),
    # L2: 845/650 = 1.3 exactly: full in both; L3 169/130 = 1.3 exactly -> 0.5; style 0: 2.0.
    ("ratio-1.3", B130, t(168, 130) + " zqccc", (2.0, False), (2.0, False)),
    # L2: 1040/650 = 1.6: reference full; L3 208/130 = 1.6 -> 0.5 (1 - 0.3/0.4) = 0.125; style 0: 1.625.
    # Paper: 1.6 > 1.5 -> stop at 0.5.
    ("ratio-1.6", B130, t(207, 130) + " zqccc", (1.625, False), (0.5, True)),
    # L2: 989/639 = 1.5477: reference 1; L3 198/128 = 1.546875 -> 0.5 (1 - 0.246875/0.4) = 0.19140625;
    # J 128/198 -> 1, T 0: style 0.6: 2.29140625. Paper: 1.5477 > 1.5 -> stop at 0.5.
    ("reference-band-only", B128, t(198), (2.29140625, False), (0.5, True)),
    # Reference: 957/639 = 1.4977 -> 1; L3 151/128 -> 0.5; "however": contrast and concession, T 0.45;
    # J 128/151 -> 1: 0.5 + 1 + 0.5 + 0.18 + 0.6 = 2.78. Paper: (1.5 - 957/639)/0.2 = 1.5/127.8 = 15/1278;
    # contrast only, T 0.4: 0.5 + 15/1278 + 0.5 + 0.16 + 0.6.
    ("passes-all-however", B128, t(150) + " " + t(40) + " however", (2.78, False), (1.76 + 15 / 1278, False)),
    # 744/639 = 1.1643: reference (744 - 511.2)/319.5 = 2328/3195, paper full; L3 129/128 -> 0.5 ("also" is the
    # reference's stopword but its unique count keeps stopwords; paper: no stopword of collab's); reference T 0.45
    # ("so" inside "also"), J 128/128 -> 1; paper T 0.4, J 128/129 -> 1. Reference 1.78 + 2328/3195, paper 2.76.
    ("passes-all-also", B128, t(128) + " " + t(20) + " also", (1.78 + 2328 / 3195, False), (2.76, False)),
    # 858/639 = 1.3427: reference 1, paper (958.5 - 858)/127.8 = 1005/1278; L3 reference 164/128, paper 163/128
    # ("when" is collab's stopword) -> 0.5; 12 categories each: T 0.95, J >= 128/164 -> 1: style 0.98.
    # Reference 2.98 (its maximum), paper 1.98 + 1005/1278.
    ("twelve-categories", B128, t(150) + " " + TWELVE, (2.98, False), (1.98 + 1005 / 1278, False)),
    # 899/639 = 1.4069: reference 1, paper (958.5 - 899)/127.8 = 595/1278; L3 180/128 = 1.40625 -> 0.3671875;
    # J 28/280 = 0.1 -> 0.1/0.23 = 10/23, T 0: style 6/23.
    ("jaccard-0.1", B128, t(180, 100), (1.8671875 + 6 / 23, False), (0.8671875 + 595 / 1278 + 6 / 23, False)),
    # Reference: 50 trailing newlines count: 949/689 = 1.377 -> 1; L3 150/128 -> 0.5; J 128/150 -> 1: 2.6.
    # Paper strips them: (958.5 - 949)/127.8 = 95/1278: 1.6 + 95/1278.
    ("untrimmed", B128 + "\n" * 50, t(150) + " " + t(40), (2.6, False), (1.6 + 95 / 1278, False)),
    # Reference: "...ther" + "efore..." make "therefore" (cause_effect): T 0.4; 955/639 = 1.4945 -> 1; L3 151/128
    # -> 0.5; J 127/152 -> 1: 2.76. Paper joins with a newline: T 0; (958.5 - 955)/127.8 = 35/1278: 1.6 + 35/1278.
    ("seam", t(127) + " ther", "efore " + t(150) + " " + t(40), (2.76, False), (1.6 + 35 / 1278, False)),
    # 634/639 = 0.9922: reference (634 - 511.2)/319.5 = 1228/3195, paper (634 - 511.2)/127.8 = 614/639.
    # L3 reference keeps the 10 stopwords: 70/128 = 0.546875 -> 0.5 * 0.046875/0.2 = 0.1171875, J 0, T 0;
    # paper: 60/128 = 0.46875 < 0.5 -> stop.
    (
        "stopwords-kept",
        B128,
        t(60, 128) + " " + t(60, 128) + " the and of to in is it on for with",
        (0.6171875 + 1228 / 3195, False),
        (0.5 + 614 / 639, True),
    ),
    # L2: 849/649 = 1.3082: reference 1, paper (973.5 - 849)/129.8 = 1245/1298; L3 170/100 = 1.7 exactly -> 0 and go
    # on; disjoint, no transitions: reference 1.5, paper 0.5 + 1245/1298.
    ("unique-1.7", t(100) + " " + t(30), t(170, 100), (1.5, False), (0.5 + 1245 / 1298, False)),
    # L3 171/100 = 1.71 -> stop; L2 854/649: reference 1, paper (973.5 - 854)/129.8 = 1195/1298.
    ("unique-1.71", t(100) + " " + t(30), t(171, 100), (1.5, True), (0.5 + 1195 / 1298, True)),
    # L2 999/999 = 1.0: reference 0.2/0.5 = 0.4, paper 1; L3 100/200 = 0.5 exactly -> 0 and go on; style 0.
    ("unique-0.5", t(200), t(100, 200) + " " + t(100, 200), (0.9, False), (1.5, False)),
    # L3 99/200 = 0.495 -> stop.
    ("unique-0.495", t(200), " ".join([t(99, 200)] * 2 + [t(2, 200)]), (0.9, True), (1.5, True)),
]


@pytest.mark.parametrize("background,methods,ref,paper", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hand_computed_rewards(background, methods, ref, paper):
    for mode, (expected, stopped) in (("reference", ref), ("paper", paper)):
        total, terminated, info = a.arxiv_reward(background, methods, mode)
        assert total == pytest.approx(expected, rel=1e-9, abs=1e-12), mode
        assert terminated is stopped, mode
        assert set(info) == {"structure", "length", "uniqueness", "style", "total"} and info["total"] == total
        assert sum(v for k, v in info.items() if k != "total") == pytest.approx(total, rel=1e-9, abs=1e-12)


def test_the_cases_cover_every_stage_and_differ():
    assert {c[3][1] for c in CASES} == {True, False}
    assert sum(c[3] != c[4] for c in CASES) >= 10
    assert a.arxiv_reward("", "")[:2] == (0.0, True)


@pytest.mark.parametrize(
    "band,points",
    [
        (a.LENGTH_BANDS["reference"], [(0.79, None), (0.8, 0.0), (1.05, 0.5), (1.3, 1.0), (1.6, 1.0), (1.8, 0.5)]),
        (a.LENGTH_BANDS["reference"], [(2.0, 0.0), (2.01, None)]),
        (a.LENGTH_BANDS["paper"], [(0.79, None), (0.8, 0.0), (0.9, 0.5), (1.0, 1.0), (1.3, 1.0), (1.4, 0.5)]),
        (a.LENGTH_BANDS["paper"], [(1.5, 0.0), (1.51, None)]),
        (a.UNIQUENESS_BAND, [(0.49, None), (0.5, 0.0), (0.6, 0.25), (0.7, 0.5), (1.3, 0.5), (1.5, 0.25), (1.7, 0.0)]),
        (a.UNIQUENESS_BAND, [(1.71, None), (0.0, None)]),
    ],
)
def test_bands_at_their_boundaries(band, points):
    for ratio, expected in points:
        got = band(ratio)
        assert got == (None if expected is None else pytest.approx(expected, abs=1e-12)), ratio


@pytest.mark.parametrize("r", [0.8, 0.93, 1.1, 1.2999, 1.61, 1.77, 1.99])
def test_length_bands_in_the_references_arithmetic(r):
    # the reference's own expressions (rewards/arxiv_rewards.py): reference mode agrees to the last bit
    expected = (r - 0.8) / (1.3 - 0.8) if r < 1.3 else 1.0 - ((r - 1.6) / (2.0 - 1.6))
    assert a.LENGTH_BANDS["reference"](r) == expected


@pytest.mark.parametrize("u", [0.5, 0.55, 0.6999, 1.31, 1.45, 1.7])
def test_uniqueness_band_in_the_references_arithmetic(u):
    expected = 0.5 * (u - 0.5) / (0.7 - 0.5) if u < 0.7 else 0.5 * (1.0 - ((u - 1.3) / (1.7 - 1.3)))
    assert a.UNIQUENESS_BAND(u) == expected


def test_style_and_its_maximum():
    assert a.style_reward(0, 0.0) == 0.0
    assert a.style_reward(1, 0.115) == pytest.approx(0.16 + 0.3)  # T 0.4, J 0.5
    assert a.style_reward(12, 0.5) == pytest.approx(0.98)  # T 0.95, J capped at 1
    assert a.jaccard_score(0.23) == 1.0 and a.jaccard_score(0.9) == 1.0


def test_measurements_of_each_mode():
    ref = a.measure("Don't stop  ", "for\nexample, state-of-the-art 3.5%", "reference")
    assert (ref["background_tokens"], ref["methods_tokens"]) == (2, 4)  # whitespace tokens in both modes
    assert ref["length_ratio"] == pytest.approx(34 / 12)  # trailing spaces counted
    assert ref["unique_ratio"] == pytest.approx(8 / 3)  # don, t, stop; for, example, state, of, the, art, 3, 5
    assert ref["categories"] == 0  # "for\nexample" is no "for example"
    paper = a.measure("Don't stop  ", "for\nexample, state-of-the-art 3.5%", "paper")
    assert (paper["background_tokens"], paper["methods_tokens"]) == (2, 4)
    assert paper["length_ratio"] == pytest.approx(34 / 10)
    assert paper["unique_ratio"] == pytest.approx(3 / 1)  # stop; example, state, art (don't, for, of, the: stopwords)
    assert paper["categories"] == 1  # example, across the line break


# -- the environment -----------------------------------------------------------------------------------------
def abstracts(n: int, tag: str = "train") -> list[dict]:
    """Records of the hub's OpenMLRL/arXiv_abstract: one string per abstract and its whitespace token count."""
    rows = []
    for i in range(n):
        text = f"We study problem {tag} {i}. Our method improves on prior work by a wide margin."
        rows.append({"article_id": f"{tag}-{i}", "abstract_text": text, "token_count": len(text.split())})
    return rows


@pytest.fixture
def hub(tmp_path):
    for split, n in (("train", 12), ("val", 3), ("test", 2)):
        parquet(tmp_path / "arXiv_abstract" / "data" / f"{split}-00000-of-00001.parquet", abstracts(n, split))
    return tmp_path / "arXiv_abstract" / "data"


def test_the_hubs_parquet_selects_the_task(hub):
    env = WritingEnv(dataset=f"arxiv:{hub}/train-*.parquet", eval_dataset=f"arxiv:{hub}/val-*.parquet")
    assert env.task == "arxiv" and [r.name for r in env.roles] == ["background", "methods"]
    assert [r.max_new_tokens for r in env.roles] == [256, 256] and env.reward_max == 3.0
    assert [t["article_id"] for t in env.tasks("eval")] == ["val-0", "val-1", "val-2"]
    assert len(env.tasks("train")) == 12 and env.tasks("train")[0]["token_count"] == 15
    one = WritingEnv(dataset=f"arxiv:{hub}/train-*.parquet", train_split="[0:3]")
    assert [t["article_id"] for t in one.tasks("train")] == ["train-0", "train-1", "train-2"]
    assert [t["article_id"] for t in one.tasks("eval")] == ["train-11"]  # one file: its last tenth
    assert WritingEnv().task == "tldr" and [r.name for r in WritingEnv().roles] == ["concise", "detailed"]


def test_the_prompts_hold_the_abstract_and_each_role(hub):
    env = WritingEnv(dataset=f"arxiv:{hub}/test-*.parquet")
    task = env.tasks("train")[0]
    background, methods = env.observe(task)
    for prompt in (background, methods):
        assert task["abstract_text"] in prompt and "introduction" in prompt
    assert "Your part: the background" in background and "covers the methodology" in background
    assert "Your part: the methodology" in methods and "covers the background" in methods


def test_the_same_records_as_jsonl(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in abstracts(4)))
    for env in (WritingEnv(dataset=f"arxiv:{path}"), WritingEnv(dataset=str(path), task="arxiv")):
        assert env.task == "arxiv" and [t["article_id"] for t in env.tasks("eval")] == ["train-3"]


def test_a_missing_file_field_or_task_is_one_line(hub, tmp_path):
    missing = f"{tmp_path}/none/train-*.parquet"
    one_line(
        lambda: WritingEnv(dataset=f"arxiv:{missing}"),
        "arXiv",
        "OpenMLRL/arXiv_abstract",
        "file not found",
        missing,
        "abstract_text",
    )
    bad = parquet(tmp_path / "bad.parquet", [{"article_id": "1", "abstract_text": "An abstract."}])
    one_line(lambda: WritingEnv(dataset=f"arxiv:{bad}"), "OpenMLRL/arXiv_abstract", "record 0 has no 'token_count'")
    one_line(lambda: WritingEnv(task="arxiv"), "arxiv task has no packaged abstracts", "arxiv:PATH")
    one_line(lambda: WritingEnv(dataset=f"arxiv:{hub}/train-*.parquet", task="tldr"), "task: arxiv")
    one_line(lambda: WritingEnv(dataset=f"arxiv:{hub}/train-*.parquet", eval_dataset="tldr:x.parquet"), "tldr")
    one_line(lambda: WritingEnv(task="summary"), "unknown writing task 'summary'", "valid: tldr, arxiv")


@pytest.mark.parametrize("mode", ["paper", "reference"])
def test_one_scripted_episode(hub, mode):
    env = WritingEnv(dataset=f"arxiv:{hub}/train-*.parquet", reward_mode=mode, horizon=2)
    state = env.reset(env.tasks("train")[0])
    background, methods = B128, t(150) + " " + t(40) + " however"  # case "passes-all-however"
    step = env.step(state, [background, methods])
    expected = 2.78 if mode == "reference" else 1.76 + 15 / 1278
    assert step.rewards == pytest.approx((expected, expected), rel=1e-9)
    assert not step.done and step.info["structure"] == 0.5 and step.info["uniqueness"] == 0.5
    # the next turn's messages: the measured bands, per agent
    replies = [history[-1]["content"] for history in step.state.histories]
    assert all("The background part is 128 words; the methods part is 191 words" in r for r in replies)
    assert all("Transition categories used: " in r and r.endswith("Revise your part.") for r in replies)
    if mode == "paper":  # 1.50 is above the paper band's 1.0-1.3: the background part should grow
        assert replies[0].count("make yours longer") == 1 and "make yours" not in replies[1]
    last = env.step(step.state, [t(20), t(30)])  # 20 tokens: out of band, the episode ends
    assert last.done and last.rewards == (0.0, 0.0)


def test_one_tiny_step_of_the_preset(hub, tmp_path):
    """conf/presets/magrpo_arxiv_paper.yaml on the tiny model: full-parameter agents, one update on the abstracts
    (16 new tokens instead of 256, to be quick)."""
    from tests.support import fit
    from tests.support.presets import ROOT

    short = "{finetune: full, lr: 5.0e-6, sampling: {temperature: 0.7, top_p: 0.9, max_new_tokens: 16}}"
    args = ["--config", str(ROOT / "conf" / "presets" / "magrpo_arxiv_paper.yaml"), "--model.base.name", "tiny"]
    args += ["--data.env_options.dataset", f"arxiv:{hub}/train-*.parquet", "--model.agents", f"[{short}, {short}]"]
    args += ["--data.env_options.eval_dataset", f"arxiv:{hub}/val-*.parquet", "--trainer.callbacks", "[]"]
    run = fit(tmp_path / "runs", "magrpo", args, steps=1)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["data"]["env_options"]["dataset"] == f"arxiv:{hub}/train-*.parquet"
    assert [a["finetune"] for a in config["model"]["agents"]] == ["full", "full"]
    assert config["model"]["base"] == {**config["model"]["base"], "name": "tiny", "dtype": "float32"}
    assert list((run / "checkpoints").glob("*step=1.ckpt"))
