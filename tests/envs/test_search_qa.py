"""The search_qa env (Dr. MAS's search task): Search-R1's exact match against an oracle of its rules, a turn's
routing and search, the publishers' formats, bad input, and one training step on the tiny model."""

from __future__ import annotations

import json
import random
import re
import string

import pytest

from collab.envs import make_env
from collab.envs.search_qa.env import NO_QUERY
from collab.envs.search_qa.reward import exact_match, normalize
from collab.errors import UserError


def reference_score(solution: str, targets: list[str]) -> float:
    """SkyRL's ``compute_score`` (``skyrl_gym/envs/search/utils.py`` at 185caf6, Search-R1's ``qa_em``), restated: the
    last non-greedy ``<answer>(.*?)</answer>`` across lines, stripped, else 0; normalized (lowercase, no ASCII
    punctuation, no article words, single spaces) equal to a normalized target: 1, or 1/4 when the text opens or
    closes more than 10 answer tags; otherwise 0."""

    def norm(s: str) -> str:
        s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())

    matches = list(re.finditer(r"<answer>(.*?)</answer>", solution, re.DOTALL))
    if not matches:
        return 0.0
    answer = matches[-1].group(1).strip()
    if not any(norm(t) == norm(answer) for t in targets):
        return 0.0
    if solution.count("<answer>") > 10 or solution.count("</answer>") > 10:
        return 0.25
    return 1.0


@pytest.mark.parametrize(
    ("text", "gold", "expected"),
    [
        ("<answer>Canberra</answer>", ["Canberra"], 1.0),
        ("<answer> the  CANBERRA. </answer>", ["Canberra"], 1.0),  # case, article, punctuation, spaces
        ("<answer>Sydney</answer> then <answer>Canberra</answer>", ["Canberra"], 1.0),  # the last answer
        ("<answer>Canberra</answer> then <answer>Sydney</answer>", ["Canberra"], 0.0),
        ("Canberra", ["Canberra"], 0.0),  # no answer tags
        ("<answer>Canberra", ["Canberra"], 0.0),  # never closed
        ("<answer>a cheetah</answer>", ["the cheetah"], 1.0),
        ("<answer>theatre</answer>", ["atre"], 0.0),  # "the" only as a word
        ("<answer>Phobos and Deimos</answer>", ["Deimos and Phobos", "Phobos and Deimos"], 1.0),
        ("<answer>x</answer>" * 11 + "<answer>Au</answer>", ["Au"], 0.25),  # 12 tags of each: Search-R1's guard
        ("<answer>x</answer>" * 9 + "<answer>Au</answer>", ["Au"], 1.0),
        ("<answer>\n26\n</answer>", ["26"], 1.0),
    ],
)
def test_exact_match_by_hand(text, gold, expected):
    assert exact_match(text, gold) == expected == reference_score(text, gold)


def test_exact_match_agrees_with_the_reference_on_200_random_texts():
    rng = random.Random(0)
    words = ["the", "a", "An", "Canberra", "mount", "Kilimanjaro", "Au", "26", "black sea", "Black-Sea", "x", ""]
    for case in range(200):
        gold = [" ".join(rng.sample(words, rng.randint(1, 2))) for _ in range(rng.randint(1, 3))]
        parts = []
        for _ in range(rng.randint(0, 14)):
            body = rng.choice([rng.choice(gold), rng.choice(words), f" {rng.choice(gold).upper()}! ", "line\nbreak"])
            kind = rng.random()
            parts.append(
                f"<answer>{body}</answer>" if kind < 0.7 else (f"<answer>{body}" if kind < 0.85 else f"{body}</answer>")
            )
            parts.append(rng.choice(["", " ", "\n<information>doc</information>\n", "<search>q</search>"]))
        text = "".join(parts)
        assert exact_match(text, gold) == reference_score(text, gold), (case, text, gold)
    assert normalize("  The Black-Sea!  ") == "blacksea"


# -- a turn ------------------------------------------------------------------------------------------
def test_the_verifier_routes_the_team_action_and_a_search_brings_the_documents():
    env = make_env("search_qa")
    task = next(t for t in env.tasks("eval") if t["golden_answers"] == ["Mercury"])
    # no: the searcher's query runs; the answerer's answer is not played
    step = env.step(
        env.reset(task), ["<verify>no</verify>", "<search>closest to the Sun</search>", "<answer>Mercury</answer>"]
    )
    assert not step.done and step.rewards == (0.0, 0.0, 0.0) and step.info == {"searches": 1.0}
    seen = step.state.histories[2][-1]["content"]
    assert "<information>Doc 1 (Mercury (planet)): Mercury is the smallest planet" in seen and task["question"] in seen
    assert [m["role"] for m in step.state.histories[2]] == ["system", "user"]  # the question restated, not a dialog
    # a verifier without a verdict routes to the searcher too, whose text without a query gets NO_QUERY
    step = env.step(step.state, ["I am not sure", "let me think", "<answer>Mercury</answer>"])
    assert not step.done and step.info["searches"] == 1.0 and NO_QUERY in step.state.histories[0][-1]["content"]
    # yes: the answerer's answer ends the episode with the exact match; two turns of four skipped
    step = env.step(step.state, ["<VERIFY> yes </verify>", "<search>x</search>", "<answer> mercury </answer>"])
    assert step.done and step.rewards == (1.0, 1.0, 1.0) and step.turns_left == 1
    assert step.info == {"solved": 1.0, "answered": 1.0, "searches": 1.0}


def test_the_horizon_ends_an_unanswered_episode_at_0_and_a_solo_agent_plays_its_own_action():
    env = make_env("search_qa", team="solo", horizon=2)
    assert [r.name for r in env.roles] == ["agent"]
    task = env.tasks("train")[0]
    step = env.step(env.reset(task), ["<search>capital of Australia</search>"])
    assert "Canberra is the capital city of Australia" in step.state.histories[0][-1]["content"]
    last = env.step(step.state, ["<search>more</search>"])
    assert last.done and last.rewards == (0.0,) and last.info["solved"] == 0.0 and last.info["answered"] == 0.0
    right = env.step(step.state, ["<answer>Canberra</answer>"])
    assert right.rewards == (1.0,) and right.turns_left == 0


def test_the_publishers_formats_and_the_splits(tmp_path):
    corpus = tmp_path / "wiki.jsonl"
    corpus.write_text(
        "\n".join(
            json.dumps({"id": str(i), "contents": f'"Place {i}"\nPlace {i} lies in country {i}.'}) for i in range(5)
        )
    )
    questions = tmp_path / "nq.jsonl"
    questions.write_text(
        "\n".join(json.dumps({"question": f"Where is place {i}?", "golden_answers": f"country {i}"}) for i in range(6))
    )
    env = make_env("search_qa", dataset=str(questions), corpus=str(corpus), num_eval=2, team="solo")
    assert [t["id"] for t in env.tasks("train")] == ["0", "1", "2", "3"] and len(env.tasks("eval")) == 2
    assert env.tasks("eval")[0]["golden_answers"] == ["country 4"]
    step = env.step(env.reset(env.tasks("train")[3]), ["<search>place 3</search>"])
    assert "Doc 1 (Place 3): Place 3 lies in country 3." in step.state.histories[0][-1]["content"]
    held = make_env("search_qa", dataset=str(questions), eval_dataset=str(questions), corpus=str(corpus))
    assert len(held.tasks("train")) == len(held.tasks("eval")) == 6


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"team": "duo"}, r"^search_qa option team must be one of orchestra, solo, got 'duo'$"),
        ({"top_k": 0}, r"^search_qa option top_k must be an integer >= 1, got 0$"),
        ({"corpus": "missing.jsonl"}, r"^search_qa corpus not found: missing.jsonl; give a JSON lines file"),
    ],
)
def test_bad_options_are_one_line(options, message):
    with pytest.raises(UserError, match=message):
        make_env("search_qa", **options)


def test_a_corpus_line_that_is_not_json_is_one_line(tmp_path):
    corpus = tmp_path / "broken.jsonl"
    corpus.write_text('{"contents": "Title\n')
    with pytest.raises(UserError, match=r"broken.jsonl, line 1: not a JSON object with a 'text' field$"):
        make_env("search_qa", corpus=str(corpus))


def test_bad_data_is_one_line_at_the_first_tasks(tmp_path):
    with pytest.raises(UserError, match=r"^data file not found: nowhere.jsonl$"):
        make_env("search_qa", dataset="nowhere.jsonl").tasks("train")
    few = tmp_path / "few.jsonl"
    few.write_text(json.dumps({"question": "q", "golden_answers": ["a"]}))
    with pytest.raises(UserError, match=r"holds 1 questions: give more than num_eval \(8\)"):
        make_env("search_qa", dataset=str(few)).tasks("eval")
    few.write_text(json.dumps({"question": "q", "answer": "a"}))
    with pytest.raises(UserError, match=r"has no 'golden_answers' field"):
        make_env("search_qa", dataset=str(few), eval_dataset=str(few)).tasks("train")


def test_magrpo_trains_the_orchestra_a_step():
    from collab.fit import build_cli
    from tests.support import quiet_fit
    from tests.training.test_cli import TINY

    argv = ["--data.env", "search_qa", "--data.batch_size", "1", "--data.num_turns", "2"]
    argv += ["--model.num_generations", "2", "--model.agents", json.dumps([{"sampling": {"max_new_tokens": 4}}] * 3)]
    cli = build_cli("magrpo", [*TINY, "--trainer.logger", "false", *argv])
    quiet_fit(cli.model, cli.datamodule, steps=1)
    assert len(cli.model.team.specs) == 3 and cli.model.global_step == 1


def test_the_played_agents_are_the_verifier_and_the_one_it_routes_to():
    """Whole-episode rollouts train only these (Dr. MAS's calls of a step): yes routes to the answerer; no, or no
    verdict, to the searcher; the solo agent always plays."""
    env = make_env("search_qa")
    state = env.reset(env.tasks("train")[0])
    acts = ["<search>q</search>", "<answer>a</answer>"]
    assert env.played(state, ["<verify>yes</verify>", *acts]) == (True, False, True)
    assert env.played(state, ["<verify> No </verify>", *acts]) == (True, True, False)
    assert env.played(state, ["I am not sure", *acts]) == (True, True, False)
    solo = make_env("search_qa", team="solo")
    assert solo.played(solo.reset(solo.tasks("train")[0]), ["<answer>a</answer>"]) == (True,)
