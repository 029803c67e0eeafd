"""Held-out evaluation before and after training (``EvaluationCallback(at_start=True)``): per-problem
scores, their standard errors and the paired gain by hand on a scripted team; the progress display
(one plain line per rollout when stdout is not a terminal, the trimmed rich bar on one)."""

import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from collab.algos import from_config
from collab.envs import make_env
from collab.evaluation.heldout import MeanSE, mean_se, task_scores
from collab.rollout.protocol import Dependency
from collab.training.callbacks import EvaluationCallback
from collab.training.progress import RolloutBar, RolloutLines, progress_callback
from tests.support import ScriptedTeam

ROOT = Path(__file__).resolve().parents[2]


def test_mean_and_se_by_hand():
    # 3 of 8: mean 0.375, s^2 = (3 * 0.625^2 + 5 * 0.375^2) / 7 = 0.267857, SE = sqrt(s^2 / 8) = 0.182981.
    mean, se = mean_se([1, 1, 1, 0, 0, 0, 0, 0])
    assert mean == pytest.approx(0.375) and se == pytest.approx(math.sqrt(0.267857142857 / 8))
    assert se == pytest.approx(math.sqrt(0.375 * 0.625 / 7))  # 0/1 scores: sqrt(p (1 - p) / (n - 1))
    # Continuous scores: 2.0, 2.5, 3.0 -> mean 2.5, s = 0.5, SE = 0.5 / sqrt(3).
    assert mean_se([2.0, 2.5, 3.0]) == pytest.approx((2.5, 0.5 / math.sqrt(3)))
    # Updates in several pieces (as DDP shards are summed) give the same figures.
    metric = MeanSE()
    metric.update([1, 1, 1])
    metric.update(torch.tensor([0.0, 0, 0, 0, 0]))
    assert metric.compute() == pytest.approx(mean_se([1, 1, 1, 0, 0, 0, 0, 0]))
    assert math.isnan(mean_se([1.0])[1]) and math.isnan(mean_se([])[0])


class Module:
    """What the callback reads of a collab LightningModule."""

    def __init__(self, team, env):
        self.team, self.env, self.max_new_tokens, self.device = team, env, 8, torch.device("cpu")
        self.protocol, self.training = Dependency("chain", 2), True

    def eval(self):
        self.training = False

    def train(self, mode=True):
        self.training = mode


class Solver:
    """A DUO whose Actor answers right exactly on the problems of ``right`` (indices of the eval split)."""

    def __init__(self, env):
        self.answers = {t["problem"]: (i, str(t["answer"])) for i, t in enumerate(env.tasks("eval"))}
        self.right: set[int] = set()
        self.team = ScriptedTeam(self.respond)

    def respond(self, agent, messages):
        if agent == 0:
            return "Add the two numbers."
        i, answer = next(v for problem, v in self.answers.items() if problem in messages[-1]["content"])
        return f"\\boxed{{{answer if i in self.right else '-1'}}}"


def test_before_and_after_with_the_paired_gain(tmp_path, capsys):
    env = make_env("math", dataset="addition", profile="duo", horizon=1, num_eval=8)
    solver = Solver(env)
    module = Module(solver.team, env)
    trainer = SimpleNamespace(
        global_step=0, loggers=[], callback_metrics={}, is_global_zero=True, log_dir=str(tmp_path)
    )
    callback = EvaluationCallback(at_start=True, num_samples=1, ks=[1], tasks_per_batch=3)
    solver.right = {0, 1, 2}
    callback.on_train_start(trainer, module)
    solver.right = {1, 2, 3, 4, 5}  # one problem lost, three gained
    trainer.global_step = 12
    callback.on_train_end(trainer, module)
    assert callback.scores == [[1, 1, 1, 0, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1, 0, 0]]
    held = callback.held_out
    se = math.sqrt(0.375 * 0.625 / 7)  # 3/8 and 5/8 right: the same SE
    assert held["before"] == pytest.approx(0.375) and held["before_se"] == pytest.approx(se)
    assert held["after"] == pytest.approx(0.625) and held["after_se"] == pytest.approx(se)
    # Differences -1, 0, 0, 1, 1, 1, 0, 0: mean 0.25, s^2 = (1.25^2 + 3 * 0.75^2 + 4 * 0.25^2) / 7 = 0.5,
    # SE = sqrt(0.5 / 8) = 0.25, so the gain is 1.0 SE (unpaired SEs would give 0.25 / 0.2588 = 0.97).
    assert held["gain"] == pytest.approx(0.25) and held["gain_se"] == pytest.approx(0.25)
    assert held["gain_z"] == pytest.approx(1.0)
    assert held["score"] == "solved" and held["problems"] == 8 and (held["before_step"], held["after_step"]) == (0, 12)
    out = capsys.readouterr().out
    assert (
        "held-out accuracy (8 eval problems, 1 samples): before 0.3750 ± 0.1830, after 0.6250 ± 0.1830, "
        "gain +0.2500 ± 0.2500 (1.0 SE)"
    ) in out
    assert out.count("evaluation at step") == 2 and "accuracy 0.3750 ± 0.1830 (SE over 8 problems)" in out
    assert trainer.callback_metrics["eval/score"] == pytest.approx(0.625)
    summary = json.loads((tmp_path / "reward_summary.json").read_text())
    assert summary["held_out"]["gain_se"] == pytest.approx(0.25)


def test_a_later_evaluation_at_the_last_step_is_the_after(tmp_path, capsys):
    """With ``every_n_steps`` landing on the last step, training's end does not evaluate again: the
    comparison takes that evaluation as "after"; other callbacks' summary entries are kept."""
    env = make_env("math", dataset="addition", profile="duo", horizon=1, num_eval=4)
    solver = Solver(env)
    module = Module(solver.team, env)
    (tmp_path / "reward_summary.json").write_text(json.dumps({"rollouts": 2}))
    trainer = SimpleNamespace(
        global_step=0, loggers=[], callback_metrics={}, is_global_zero=True, log_dir=str(tmp_path)
    )
    callback = EvaluationCallback(every_n_steps=2, at_start=True, num_samples=1, ks=[1])
    callback.on_train_start(trainer, module)
    solver.right = {0, 1, 2, 3}
    trainer.global_step = 2
    callback.on_train_batch_end(trainer, module, None, None, 0)
    callback.on_train_end(trainer, module)
    assert len(callback.scores) == 2 and callback.held_out["gain"] == 1.0 and callback.held_out["gain_se"] == 0.0
    assert "gain +1.0000 ± 0.0000 (inf SE)" in capsys.readouterr().out
    summary = json.loads((tmp_path / "reward_summary.json").read_text())
    assert summary["rollouts"] == 2 and summary["held_out"]["after"] == 1.0


def test_records_merge_in_task_order_and_give_the_metrics_by_hand():
    """Records arrive per rank in any order (rank 0: batches 0, 2; rank 1: batch 1); merged they give
    the figures of all three tasks, each once, with no process group."""
    from collab.evaluation.heldout import TaskRecord, batches, gather_records, record_metrics, record_scores

    assert batches(5, 2) == [range(0, 2), range(2, 4), range(4, 5)] and batches(1, 4) == [range(0, 1)]
    assert batches(3, None) == [range(0, 3)] and batches(0, 4) == []

    def rec(task, solved, returns):
        return TaskRecord(task, list(returns), [{"solved": s, "pass_rate": s} for s in solved])

    rank0 = [rec(0, [1.0, 1.0], [2.0, 4.0]), rec(2, [0.0, 0.0], [0.0, 0.0])]
    rank1 = [rec(1, [1.0, 0.0], [1.0, 1.0])]
    records = gather_records(rank1 + rank0)
    assert [r.task for r in records] == [0, 1, 2]
    # per-problem accuracies 1, 0.5, 0: mean 0.5, s^2 = (0.25 + 0 + 0.25) / 2 = 0.25, SE = 0.5 / sqrt(3)
    scores = record_scores(records, "solved")
    assert scores == [1.0, 0.5, 0.0]
    assert mean_se(scores) == pytest.approx((0.5, 0.5 / math.sqrt(3)))
    # per-problem returns 3, 1, 0: mean 4/3, s^2 = ((5/3)^2 + (1/3)^2 + (4/3)^2) / 2 = 7/3, SE = sqrt(7/9)
    assert record_scores(records, "return") == [3.0, 1.0, 0.0]
    assert mean_se(record_scores(records, "return")) == pytest.approx((4 / 3, math.sqrt(7 / 9)))
    metrics = record_metrics(records, [1, 2], num_samples=2)
    assert metrics["eval/problems"] == 3.0 and metrics["eval/return"] == pytest.approx(8 / 6)
    assert metrics["eval/pass@1"] == pytest.approx(0.5) and metrics["eval/env/solved"] == pytest.approx(0.5)
    assert metrics["eval/pass@2"] == pytest.approx((1 + 1 + 0) / 3)  # pass@2 of 2 samples: any solved
    assert metrics["eval/acc@2"] == pytest.approx((1 + 1 + 0) / 3)


def test_one_eval_problem_prints_no_standard_error(tmp_path, capsys):
    """One eval task: the lines give the figures and say why there is no SE; the summary keeps null."""
    from collab.evaluation.heldout import format_se

    assert format_se(0.5, float("nan"), 1) == "0.5000 (1 eval problem: no standard error)"
    assert format_se(0.5, 0.1, 3) == "0.5000 ± 0.1000"
    env = make_env("math", dataset="addition", profile="duo", horizon=1, num_eval=4)
    solver = Solver(env)
    module = Module(solver.team, env)
    trainer = SimpleNamespace(
        global_step=0, loggers=[], callback_metrics={}, is_global_zero=True, log_dir=str(tmp_path)
    )
    callback = EvaluationCallback(at_start=True, num_samples=1, ks=[1], max_tasks=1)
    callback.on_train_start(trainer, module)
    solver.right = {0}
    trainer.global_step = 1
    callback.on_train_end(trainer, module)
    out = capsys.readouterr().out
    assert "nan" not in out and "accuracy 0.0000 (1 eval problem: no standard error)" in out
    assert (
        "held-out accuracy (1 eval problem, 1 samples): before 0.0000, after 1.0000, gain +1.0000 "
        "(1 eval problem: no standard error)"
    ) in out
    held = json.loads((tmp_path / "reward_summary.json").read_text())["held_out"]
    assert held["problems"] == 1 and held["before_se"] is held["after_se"] is held["gain_se"] is held["gain_z"] is None
    assert "eval/score_se" not in trainer.callback_metrics


def test_task_scores_average_each_tasks_samples():
    from collab.envs.base import StepResult
    from collab.rollout.episodes import Episode

    def episode(reward, solved):
        return Episode(0, steps=[StepResult(None, (reward, reward), True, {"solved": solved})])

    episodes = [[episode(2.0, 1.0), episode(3.0, 0.0)], [episode(1.0, 0.0)]]
    assert task_scores(episodes, "return") == [2.5, 1.0]
    assert task_scores(episodes, "solved") == [0.5, 0.0]


def test_greedy_evaluation_on_the_tiny_team_is_repeatable_and_restores_sampling(one_thread):
    from collab.policy.models import BaseConfig
    from collab.policy.team import AgentSpec, SamplingSpec

    env = make_env("math", dataset="addition", profile="duo", horizon=1, num_eval=4)
    agents = [AgentSpec(sampling=SamplingSpec(temperature=1.0, max_new_tokens=6)) for _ in range(2)]
    module = from_config("marft_a", base=BaseConfig(name="tiny"), agents=agents, value_head={"lr": 1e-3})
    module.build(env)
    trainer = SimpleNamespace(global_step=0, loggers=[], callback_metrics={}, is_global_zero=False, log_dir=None)
    callback = EvaluationCallback(num_samples=1, ks=[1], greedy=True)
    torch.manual_seed(1)
    state = torch.get_rng_state()
    texts = []
    for _ in range(2):
        from collab.evaluation.heldout import evaluate

        with callback._decoding(module):
            assert all(spec.sampling.temperature == 0.0 for spec in module.team.specs)
            _, episodes = evaluate(module.team, env, env.tasks("eval"), 1, [1], 8, "cpu", None, module.protocol)
        texts.append([ep.responses for eps in episodes for ep in eps])
    assert texts[0] == texts[1]
    assert [spec.sampling.temperature for spec in module.team.specs] == [1.0, 1.0]
    assert torch.equal(torch.get_rng_state(), state)  # the training's random stream is untouched
    callback.run(trainer, module)
    assert set(trainer.callback_metrics) >= {"eval/score", "eval/score_se", "eval/pass@1"}


# -- the progress display ------------------------------------------------------------------------------
class Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_the_display_follows_whether_stdout_is_a_terminal():
    assert isinstance(progress_callback(Stream(False)), RolloutLines)
    assert isinstance(progress_callback(Stream(True)), RolloutBar)


def test_plain_lines_name_step_reward_throughput_and_time():
    stream = Stream(False)
    lines = RolloutLines(stream=stream)
    trainer = SimpleNamespace(
        global_step=0,
        max_steps=12,
        is_global_zero=True,
        callback_metrics={
            "reward/return": torch.tensor(0.25),
            "rollout/tokens_per_s": torch.tensor(41.25),
            "rollout/seconds": torch.tensor(17.24),
        },
    )
    lines.on_train_start(trainer, None)
    trainer.global_step = 3
    lines.on_train_batch_end(trainer, None, None, None, 2)
    text = stream.getvalue().splitlines()
    assert text[0] == "training from step 0 of 12"
    assert text[1].startswith("step 3/12  reward 0.2500  tokens/s 41.2  rollout 17.2 s  step ")
    assert "elapsed 0:00" in text[1]
    lines.disable()
    lines.on_train_batch_end(trainer, None, None, None, 3)
    assert len(stream.getvalue().splitlines()) == 2


def test_rich_bar_drops_epoch_speed_and_version():
    from lightning.pytorch.callbacks.progress.rich_progress import ProcessingSpeedColumn

    bar = RolloutBar()
    assert bar._get_train_description(0) == "rollouts"
    assert not any(isinstance(c, ProcessingSpeedColumn) for c in bar.configure_columns(None))
    trainer = SimpleNamespace(progress_bar_metrics={"reward": 0.5}, loggers=[SimpleNamespace(version=3)], logger=None)
    assert bar.get_metrics(trainer, None) == {"reward": 0.5}


def fit(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "collab.fit", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def test_fit_prints_one_line_per_rollout_and_the_held_out_comparison_when_piped(tmp_path):
    """The main job's config (marft_a: before/after evaluation on) on the tiny model, stdout a pipe."""
    result = fit(
        "--algo",
        "marft_a",
        "--model.base.name",
        "tiny",
        "--trainer.accelerator",
        "cpu",
        "--trainer.max_steps",
        "2",
        "--data.batch_size",
        "2",
        "--data.env_options",
        "{dataset: addition, profile: duo, num_eval: 4}",
        "--model.agents",
        '[{"sampling": {"max_new_tokens": 4}}, {"sampling": {"max_new_tokens": 4}}]',
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split("  ")[0] for line in steps] == ["step 1/2", "step 2/2"], out[-3000:]
    assert all("reward " in line and "tokens/s " in line and "rollout " in line for line in steps)
    for noise in ("Epoch 0", "it/s", "v_num"):
        assert noise not in out and noise not in result.stderr
    assert "held-out accuracy (4 eval problems, greedy): before " in out
    summary = json.loads((tmp_path / "runs" / "marft_a" / "version_0" / "reward_summary.json").read_text())
    assert summary["rollouts"] == 2 and {"before", "after", "gain", "gain_se"} <= set(summary["held_out"])
