"""Prompt-based baselines (CoLLM §5.2) and the comparison table (Table 1), on the tiny random team
and real environments (writing, coding, matrix)."""

from __future__ import annotations

import pytest
import torch

from collab.algos.agents import resolve_agents
from collab.envs import make_env
from collab.errors import UserError
from collab.evaluation.baselines import BASELINES, DiscussionEnv, SingleModelEnv, prepare
from collab.evaluation.comparison import cost_per_agent_turn, make_row, read_rows, render_markdown, update_table, upsert
from collab.policy.models import BaseConfig
from collab.policy.team import AgentSpec, AgentTeam, SamplingSpec
from collab.rollout.episodes import play

BUDGET = 8


pytestmark = pytest.mark.usefixtures("one_thread")


class Recorder:
    """The tiny team, recording every generate call's requests (agent, prompt text, samples)."""

    def __init__(self, team):
        self.team, self.calls = team, []

    def encode(self, agent, messages):
        return self.team.encode(agent, messages)

    def generate(self, requests, max_new_tokens=128):
        self.calls.append([(r.agent, r.n) for r in requests])
        return self.team.generate(requests, max_new_tokens=max_new_tokens)


@pytest.fixture(scope="module")
def team():
    env = make_env("writing")
    specs = [AgentSpec(sampling=SamplingSpec(max_new_tokens=BUDGET)) for _ in range(2)]
    torch.manual_seed(0)
    return AgentTeam(resolve_agents(env, specs), BaseConfig(name="tiny", device="cpu"))


def run(team, name, env, tasks=1, samples=1):
    protocol = prepare(name, env)
    recorder = Recorder(team)
    with protocol.applied(team, BUDGET):
        episodes = play(
            recorder, protocol.env, list(env.tasks("eval"))[:tasks], samples, BUDGET, None, protocol.dependency
        )
    return episodes, recorder


def last_user(observation) -> str:
    return observation[-1]["content"]


# -- what each agent sees ------------------------------------------------------------------------
def test_pipeline_agent_2_sees_agent_1_of_the_same_turn_and_parallel_does_not(team):
    env = make_env("writing")
    ((ep,),) = run(team, "pipeline", env)[0]
    first = ep.completions[0][0].text.strip()
    assert first and f"concise: {first}" in last_user(ep.observations[0][1])
    assert first not in last_user(ep.observations[0][0])
    ((ep,),) = run(team, "parallel", env)[0]
    assert ep.completions[0][0].text.strip() not in last_user(ep.observations[0][1])
    assert ep.observations[0][1] == env.reset(env.tasks("eval")[0]).histories[1]  # its own prompt, untouched


def test_discussion_on_a_one_turn_env_drafts_then_each_agent_sees_the_others_drafts_once(team):
    env = make_env("writing")
    ((ep,),) = run(team, "discussion", env)[0]
    assert len(ep.steps) == 2 and ep.steps[0].rewards == (0.0, 0.0) and not ep.steps[0].info  # unscored draft
    assert ep.steps[1].info["total"] == ep.return_  # the revision is what the env scores
    drafts = [c.text.strip() for c in ep.completions[0]]
    for i, other in ((0, 1), (1, 0)):
        seen = ep.observations[1][i]
        names = ("concise", "detailed")
        assert f"{names[other]}: {drafts[other]}" in last_user(seen)
        assert drafts[i] not in last_user(seen)  # its own draft: once, as its assistant message
        assert sum(drafts[i] in m["content"] for m in seen) == 1
        assert seen[-2] == {"role": "assistant", "content": ep.completions[0][i].text}
    assert ep.steps[1].state.turn == 1  # the draft round is not an environment turn


def test_discussion_on_a_two_turn_env_appends_the_others_previous_turn_to_the_feedback(team):
    env = make_env("coding", horizon=2)
    ((ep,),) = run(team, "discussion", env)[0]
    assert len(ep.steps) == 2 and ep.steps[0].info  # both turns scored, no draft
    first = [c.text.strip() for c in ep.completions[0]]
    for i, (me, other) in enumerate(((0, 1), (1, 0))):
        message = last_user(ep.observations[1][i])
        assert message.startswith("Static and execution diagnostics:")  # the env's own feedback first
        assert f"{('aux', 'main')[other]}: {first[other]}" in message and first[me] not in message
    assert DiscussionEnv(env).draft is False and DiscussionEnv(make_env("writing")).draft is True


def test_single_makes_one_request_per_episode_turn_and_scores_the_split(team):
    env = make_env("coding", horizon=2)
    episodes, recorder = run(team, "single", env, tasks=2, samples=2)
    eps = [ep for group in episodes for ep in group]
    # turn 0: one prompt per task (2 samples each); turn 1: one per live episode; always agent 0
    assert [sum(n for _, n in call) for call in recorder.calls] == [4, sum(len(ep.steps) > 1 for ep in eps)]
    assert all(agent == 0 for call in recorder.calls for agent, _ in call)
    assert all(len(turn) == 1 for ep in eps for turn in ep.completions)
    ep = eps[0]
    prompt = last_user(ep.observations[0][0])
    assert "### aux\nCreate a helper function" in prompt and "### main\nSolve this coding problem" in prompt
    assert prompt.endswith("(### aux, ### main), in that order.")
    if len(ep.steps) > 1:  # the next turn merges both roles' feedback
        assert "### aux\nStatic and execution diagnostics" in last_user(ep.observations[1][0])
    split = ep.steps[0].state.memory["split"]
    assert list(split) == env.split_single_response(ep.completions[0][0].text)
    # the single model's budget is both roles' (8 + 8), restored afterwards
    assert max(len(c.completion_ids) for e in eps for turn in e.completions for c in turn) > BUDGET
    assert all(len(c.completion_ids) <= 2 * BUDGET for e in eps for turn in e.completions for c in turn)
    assert [s.sampling.max_new_tokens for s in team.specs] == [BUDGET, BUDGET]


def test_split_maps_headers_back_to_roles_with_fallbacks():
    env = make_env("writing")
    text = "Sure.\n### Concise\nShort one.\n\n**detailed:**\nA longer one.\nSecond line.\n"
    assert env.split_single_response(text) == ["Short one.", "A longer one.\nSecond line."]
    assert env.split_single_response("concise:\na\ndetailed\nb\n### concise\nc") == ["a\n\nc", "b"]  # repeats join
    assert env.split_single_response("no headers here") == ["no headers here"] * 2  # fallback: all of it
    assert env.split_single_response("Intro.\n### detailed\nLong.") == ["Intro.", "Long."]  # missing: the preamble
    assert (
        env.split_single_response("the concise one is short") == ["the concise one is short"] * 2
    )  # not a header line


def test_single_prompt_shows_a_shared_message_once_and_keeps_the_closed_vocabulary():
    env = make_env("matrix")
    prompt = env.single_agent_prompt(env.observe({}), 0)
    assert prompt.count("Your choice (A or B)") == 1
    assert prompt.count("### player1\nYou are playing a game") == 1 and "### player2\n" in prompt
    single = SingleModelEnv(env)
    assert single.roles[0].choices == ("A", "B") and single.n_agents == 1 and single.name == "matrix"
    state = single.reset(env.tasks("eval")[0])
    step = single.step(state, ["A"])  # no headers: the answer is every role's
    assert step.state.memory["split"] == ("A", "A") and step.rewards == (10.0, 10.0) and step.done


def test_wrappers_hand_the_evaluation_the_inner_state_for_voxels():
    env = make_env("matrix")
    env.voxels = lambda state: ("built", state.turn)  # as the Minecraft env's, read by the evaluation's IoU
    single = SingleModelEnv(env)
    step = single.step(single.reset(env.tasks("eval")[0]), ["A"])
    assert single.voxels(step.state) == ("built", 1) and step.state.memory["inner"].turn == 1
    assert DiscussionEnv(env).voxels is env.voxels
    assert not hasattr(SingleModelEnv(make_env("matrix")), "voxels")


def test_prepare_rejects_unknown_names_and_one_agent_teams():
    with pytest.raises(UserError, match="unknown baseline 'solo'; valid: discussion, parallel, pipeline, single"):
        prepare("solo", make_env("matrix"))
    assert {prepare(n, make_env("matrix")).name for n in BASELINES} == set(BASELINES)
    solo = make_env("math", profile="solo", dataset="arithmetic", num_eval=1, num_train=1)
    with pytest.raises(UserError, match="needs at least 2 agents"):
        prepare("pipeline", solo)
    assert prepare("single", solo).env.n_agents == 1


# -- cost and the table ----------------------------------------------------------------------------
def test_cost_counts_tokens_per_agent_per_turn_on_real_completions(team):
    env = make_env("writing")
    episodes, _ = run(team, "discussion", env, tasks=2, samples=2)
    tokens = responses = 0
    for group in episodes:
        for ep in group:
            for turn in range(len(ep.steps)):  # turns actually played (draft + revision)
                for agent in range(env.n_agents):
                    tokens += len(ep.completions[turn][agent].completion_ids)
                    responses += 1
    assert responses == 2 * 2 * 2 * 2 and tokens > 0
    assert cost_per_agent_turn(episodes) == pytest.approx(tokens / responses)
    single, _ = run(team, "single", env, tasks=2)
    n = sum(len(ep.completions) for group in single for ep in group)
    assert cost_per_agent_turn(single) == pytest.approx(
        sum(len(c.completion_ids) for group in single for ep in group for t in ep.completions for c in t) / n
    )
    row = make_row(
        "discussion", "TLDR", env, {"eval/env/total": 1.5, "eval/samples": 2, "eval/problems": 2}, 8.0, episodes, "tiny"
    )
    assert row["time_s"] == "2" and row["score"] == "50" and row["cost_tokens"] == f"{tokens / responses:.6g}"


ROWS = [
    {"method": "magrpo", "task": "TLDR", "env": "writing", "time_s": "1.8", "cost_tokens": "178", "score": "93.5"},
    {"method": "parallel", "task": "TLDR", "env": "writing", "time_s": "2.3", "cost_tokens": "244.2", "score": "22.7"},
    {
        "method": "parallel",
        "task": "HouseBuild",
        "env": "minecraft",
        "time_s": "19.2",
        "cost_tokens": "502",
        "hp": "21.8",
        "iou": "46.1",
    },
    {"method": "single", "task": "CoopHE", "env": "coding", "time_s": "0.25", "cost_tokens": "90", "pass": "56.25"},
]


def test_upsert_replaces_the_same_method_and_task_and_appends_others(tmp_path):
    rows = upsert(ROWS, {**ROWS[1], "score": "30.0"})
    assert len(rows) == 4 and rows[1]["score"] == "30.0"
    rows = upsert(rows, {"method": "pipeline", "task": "TLDR", "env": "writing", "time_s": "4.3"})
    assert [r["method"] for r in rows] == ["magrpo", "parallel", "parallel", "single", "pipeline"]
    path = tmp_path / "t.csv"
    for row in ROWS:
        update_table(path, row)
    _, md = update_table(path, {**ROWS[0], "time_s": "1.9"})
    back = read_rows(path)
    assert path.read_text().splitlines()[0] == (
        "method,task,env,time_s,cost_tokens,score,hp,iou,pass,samples,tasks,model,split,weights"
    )
    assert len(back) == 4 and back[0]["time_s"] == "1.9" and back[3]["pass"] == "56.25" and back[0]["hp"] == ""
    assert md == tmp_path / "t.md" and md.read_text() == render_markdown(back)


def test_markdown_is_shaped_like_table_1():
    assert render_markdown(ROWS).splitlines() == [
        "| Method | TLDR |  |  | HouseBuild |  |  |  | CoopHE |  |  |",
        "| :-- | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: |",
        "|  | Time | Cost | Score | Time | Cost | HP | IoU | Time | Cost | Pass |",
        "| single | – | – | – | – | – | – | – | 0.25 | 90 | 56.2 |",
        "| parallel | 2.3 | 244 | 22.7 | 19.2 | 502 | 21.8 | 46.1 | – | – | – |",
        "| magrpo | 1.8 | 178 | 93.5 | – | – | – | – | – | – | – |",
        "",
        "Time: seconds per episode; Cost: generated tokens per agent per turn; scores in % (Return: mean episode "
        "return). CoLLM, Table 1 layout (collab.evaluation.comparison).",
    ]


# -- the command line ----------------------------------------------------------------------------
TINY = [
    "--algo",
    "magrpo",
    "--model.base.name",
    "tiny",
    "--trainer.accelerator",
    "cpu",
    "--data.env",
    "writing",
    "--model.agents",
    '[{"sampling": {"max_new_tokens": 8}}, {"sampling": {"max_new_tokens": 8}}]',
    "--max_tasks",
    "1",
    "--num_samples",
    "1",
    "--k",
    "1",
]


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_cli_bad_baseline_and_table_are_one_line(capsys):
    from collab.evaluate import main

    assert main([*TINY, "--baseline", "bogus"]) == 2
    assert error_lines(capsys) == ["error: unknown baseline 'bogus'; valid: discussion, parallel, pipeline, single"]
    assert main([*TINY, "--baseline", "single", "--table", "out.txt"]) == 2
    assert error_lines(capsys) == [
        "error: --table must name a .csv file (the markdown table is written next to it), got out.txt"
    ]


def test_cli_runs_every_baseline_and_a_trained_team_into_one_table(tmp_path, capsys, team, monkeypatch):
    from collab.evaluate import main

    monkeypatch.chdir(tmp_path)
    table = tmp_path / "cmp.csv"
    for name in BASELINES:
        assert main([*TINY, "--baseline", name, "--table", str(table), "--task", "TLDR"]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert f"{name} baseline (magrpo team) on writing (eval: 1 tasks x 1 samples; weights: untrained)" in out
        assert " s/episode  cost " in out and "tokens/agent/turn  Score " in out
    team.save_adapters(tmp_path / "adapters")  # weights of the same shape as the CLI's team
    assert main([*TINY, "--adapters", str(tmp_path / "adapters"), "--table", str(table), "--task", "TLDR"]) == 0
    assert (
        main(
            [
                *TINY,
                "--baseline",
                "pipeline",
                "--adapters",
                str(tmp_path / "adapters"),
                "--table",
                str(table),
                "--task",
                "TLDR",
            ]
        )
        == 0
    )
    rows = read_rows(table)
    assert [r["method"] for r in rows] == [*BASELINES, "magrpo", "pipeline+magrpo"]
    assert all(
        r["task"] == "TLDR"
        and r["env"] == "writing"
        and r["model"] == "tiny"
        and r["samples"] == "1"
        and float(r["time_s"]) > 0
        and 0 < float(r["cost_tokens"]) <= 16
        and 0 <= float(r["score"]) <= 100
        for r in rows
    )
    assert float(rows[0]["cost_tokens"]) > 8  # the single model writes both parts
    md = (tmp_path / "cmp.md").read_text().splitlines()
    assert md[0] == "| Method | TLDR |  |  |" and md[2] == "|  | Time | Cost | Score |"
    assert [line.split(" | ")[0] for line in md[3:9]] == [
        "| single",
        "| parallel",
        "| pipeline",
        "| discussion",
        "| magrpo",
        "| pipeline+magrpo",
    ]
