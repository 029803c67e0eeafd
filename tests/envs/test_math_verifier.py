"""The math env judged by Dr. MAS's verifier (``judge: verifier``, profile ``math_drmas``), by hand: its rules read
from ``langfengQ/DrMAS`` (``agent_system/agent/orchestra/math/math_orchestra.py`` and the verifier agent's approval
update): approve ends the attempt, reject sends the solver back, a review without a verdict approves, and the last
loop calls no verifier."""

import json
from dataclasses import replace

import pytest

from collab.envs.math.env import MathEnv
from collab.errors import UserError
from collab.rollout.episode_batch import episode_batch
from collab.rollout.protocol import Dependency
from tests.support import ScriptedTeam


def make_env(horizon: int = 2) -> MathEnv:
    return MathEnv(dataset="small_addition", profile="math_drmas", judge="verifier", horizon=horizon)


@pytest.mark.parametrize(
    "review,approved",
    [
        ("All steps hold. <verify>approve</verify>", True),
        ("Step 2 is wrong. <verify>reject</verify>", False),
        ("I have no verdict.", True),  # a missing verdict approves
        ("<verify>reject</verify> on second thought <verify>approve</verify>", True),  # approve anywhere wins
        ("<verify>Approve</verify>", True),  # neither exact tag: no verdict
        ("<verify>approve</verify><verify>reject</verify>", True),
    ],
)
def test_the_verdict_is_read_as_the_reference_reads_it(review, approved):
    assert MathEnv.approves(review) is approved


def test_approve_ends_with_the_grade_reject_goes_on_and_the_last_turn_is_the_solvers():
    env = make_env()
    task = env.tasks("train")[0]
    right, wrong = f"So \\boxed{{{task['answer']}}}", "So \\boxed{-1}"
    start = env.reset(task)
    last = replace(start, turn=1)
    approve, reject = "<verify>approve</verify>", "<verify>reject</verify>"
    scores = env.score_batch([start] * 4 + [last] * 2, [
        (right, approve), (wrong, approve), (right, reject), (wrong, "no verdict"), (right, reject), (wrong, approve),
    ])  # fmt: skip
    assert [s.rewards for s in scores] == [(1.0, 1.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0), (1.0, 1.0), (0.0, 0.0)]
    assert [s.terminated for s in scores] == [True, True, False, True, True, True]
    assert [s.info["solved"] for s in scores] == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert [s.info.get("approved") for s in scores] == [1.0, 1.0, 0.0, 1.0, None, None]
    # the last loop calls no verifier; earlier turns play both
    assert env.played(start, (right, reject)) == (True, True)
    assert env.played(last, (right, reject)) == (True, False)
    # after a reject the solver sees the turn's outputs, and no gold verdict
    nxt = env.transition(start, (wrong, "Step 1 is off. " + reject), scores[2])
    assert "solver: So \\boxed{-1}" in nxt and "verifier: Step 1 is off." in nxt and "Judge" not in nxt


def test_the_truth_judge_is_unchanged():
    env = MathEnv(dataset="small_addition", profile="duo")
    start = env.reset(env.tasks("train")[0])
    score = env.score(start, ("think", "\\boxed{-1}"))
    assert score.rewards == (0.0, 0.0) and not score.terminated
    assert env.transition(start, ("think", "\\boxed{-1}"), score).endswith("Judge: incorrect")


def test_whole_episodes_of_solver_then_verifier():
    """K episodes under MAGRPO's episodes rollout with the chain: the verifier reviews the solver's answer of the
    same turn; a rejected first attempt gets a second, the solver's alone (2 decisions, not 3 or 4)."""
    env = make_env()
    tasks = env.tasks("train")[:2]

    def respond(agent, messages):
        text = messages[-1]["content"]
        if agent == 0:  # the solver: wrong first, right once it has seen a rejection
            return f"\\boxed{{{tasks[0]['answer'] if 'reject' in text else -1}}}"
        return "<verify>reject</verify>" if "\\boxed{-1}" in text else "<verify>approve</verify>"

    batch = episode_batch(ScriptedTeam(respond), env, tasks, 3, 1.0, dependency=Dependency("chain", 2))
    rows = [(s.agent, s.turn, s.text, s.returns) for s in batch.items]
    per_episode = [(0, 0), (1, 0), (0, 1)]  # solver, verifier at turn 0; the solver alone at turn 1
    assert [(a, t) for a, t, _, _ in rows] == per_episode * 6
    assert {text for a, t, text, _ in rows if a == 1} == {"<verify>reject</verify>"}
    first = tasks[0]["answer"]
    returns = [r for _, _, _, r in rows]
    assert returns[:9] == [1.0] * 9  # task 0: the second attempt is right
    assert returns[9:] == [1.0 if str(first) == str(tasks[1]["answer"]) else 0.0] * 9


def test_valid_actions_by_the_reference_projections(tmp_path):
    env = make_env()
    assert env.valid(0, "so \\boxed{3}") and not env.valid(0, "so 3")
    assert not env.valid(0, "so \\fbox{3}") and not env.valid(0, "so \\boxed 3")  # not boxes to DeepScaleR
    assert env.valid(1, "fine <verify>approve</verify>") and env.valid(1, "<verify></verify>")
    assert not env.valid(1, "approve") and not env.valid(1, "<verify>approve</verify> \u5bf9")
    roles = [{"role": r, "prompt": r, "with_answer": r == "solver"} for r in ("planner", "solver", "verifier")]
    (tmp_path / "trio.json").write_text(json.dumps(roles))
    trio = MathEnv(dataset="small_addition", profile=str(tmp_path / "trio.json"), judge="verifier")
    assert trio.valid(0, "no box, no tags") and not trio.valid(1, "no box") and not trio.valid(2, "no tags")
    truth = MathEnv(dataset="small_addition", profile="duo")
    assert truth.valid(1, "no box") and truth.valid(0, "")


def test_the_invalid_penalty_comes_off_the_invalid_responses_return_alone():
    """The solver answers without a box at turn 0 (invalid), the verifier rejects; at turn 1 a boxed right answer:
    every response's return is the episode's 1.0 but the unboxed one's, 1.0 - 0.1."""
    env = make_env()
    task = env.tasks("train")[0]

    def respond(agent, messages):
        if agent == 1:
            return "<verify>reject</verify>"
        return f"\\boxed{{{task['answer']}}}" if "reject" in messages[-1]["content"] else "no idea"

    batch = episode_batch(ScriptedTeam(respond), env, [task], 2, 1.0, dependency=Dependency("chain", 2),
                          invalid_penalty=0.1)  # fmt: skip
    got = [(s.agent, s.turn, round(s.returns, 9)) for s in batch.items]
    assert got == [(0, 0, 0.9), (1, 0, 1.0), (0, 1, 1.0)] * 2


@pytest.mark.parametrize(
    "options,message",
    [
        ({"judge": "gold"}, "unknown math judge 'gold'; valid: truth, verifier"),
        ({"judge": "verifier", "profile": "duo"}, "judge verifier needs a profile whose last agent reviews"),
    ],
)
def test_a_judge_that_cannot_run_is_one_line(options, message):
    with pytest.raises(UserError, match=message) as e:
        MathEnv(dataset="small_addition", **options)
    assert "\n" not in str(e.value)
