"""Evaluation: pass@k / acc@k / returns / schemes by hand on a scripted policy; the callback and the CLI
on the tiny random team."""

import json
from pathlib import Path

import pytest

from collab.envs import make_env
from collab.evaluation.heldout import evaluate, format_metrics, play
from tests.support import ScriptedTeam, warm

ROOT = Path(__file__).resolve().parents[2]

PRIME = {
    "task_id": "Toy/prime",
    "prompt": "def x_or_y(n, x, y):\n    '''Return x if n is prime, else y.'''\n",
    "test": "def check(candidate):\n    assert candidate(7, 34, 12) == 34\n    assert candidate(15, 8, 5) == 5\n"
    "    assert candidate(2, 10, 20) == 10\n    assert candidate(1, 100, 200) == 200\n",
    "entry_point": "x_or_y",
}
ADD = {
    "task_id": "Toy/add",
    "prompt": "def add(a, b):\n    '''Return a + b.'''\n",
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n"
    "    assert candidate(-1, 1) == 0\n    assert candidate(2, 2) == 4\n",
    "entry_point": "add",
}
PRIME_AUX = "def aux(n):\n    return n > 1 and all(n % d for d in range(2, n))\n"
RIGHT = "def x_or_y(n, x, y):\n    if aux(n):\n        return x\n    return y\n"  # 4/4
NEAR = "def x_or_y(n, x, y):\n    if aux(n) and n > 5:\n        return x\n    return y\n"  # 3/4
TIMES = "def add(a, b):\n    return a * b\n"  # 2/4
MINUS = "def add(a, b):\n    return a - b\n"  # 1/4

# Per (agent, entry point): the responses of successive samples.
SCRIPT = {
    (0, "x_or_y"): [PRIME_AUX] * 4,
    (1, "x_or_y"): [RIGHT, NEAR, RIGHT, NEAR],
    (0, "add"): [""] * 4,
    (1, "add"): [TIMES, MINUS, TIMES, TIMES],
}


def ScriptedPolicy(script) -> ScriptedTeam:
    """Fixed responses per problem: the agent's successive samples on a problem take its script in order."""
    queues = {key: list(v) for key, v in script.items()}

    def respond(agent, messages):
        entry = "x_or_y" if "x_or_y" in messages[0]["content"] else "add"
        return queues[(agent, entry)].pop(0)

    return ScriptedTeam(respond)


@pytest.fixture
def env(tmp_path):
    path = tmp_path / "toy.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in (PRIME, ADD)))
    return make_env(
        "coding",
        dataset="coophumaneval",
        path=str(path),
        train_split="[:]",
        eval_split="[:]",
        workers=2,
        test_timeout=2.0,
    )


def test_metrics_by_hand(env):
    metrics, episodes = evaluate(ScriptedPolicy(SCRIPT), env, env.tasks("eval"), num_samples=4, ks=[1, 3, 5, 10])
    assert [len(e) for e in episodes] == [4, 4]
    # pass@k: x_or_y has c = 2 of n = 4 correct, add has c = 0.
    assert metrics["eval/pass@1"] == pytest.approx((2 / 4 + 0) / 2)
    assert metrics["eval/pass@3"] == pytest.approx((1 - 0 / 4 + 0) / 2)  # C(2, 3) = 0: every 3-subset has a pass
    assert "eval/pass@5" not in metrics  # k > num_samples is skipped
    # acc@k: best pass rate among the first k samples.
    assert metrics["eval/acc@1"] == pytest.approx((1.0 + 0.5) / 2)
    assert metrics["eval/acc@3"] == pytest.approx((1.0 + 0.5) / 2)
    # Returns (F.2): RIGHT 4.0, NEAR 0.4+0.6+0.5+0.75+1.5 = 3.75; no aux for add: TIMES 0.6+0.5+0.5, MINUS 0.6+0.5+0.25.
    expected = (4.0 + 3.75 + 4.0 + 3.75 + 1.6 + 1.35 + 1.6 + 1.6) / 8
    assert metrics["eval/return"] == pytest.approx(expected)
    assert metrics["eval/env/scheme/strategy_filter"] == pytest.approx(0.5)
    assert metrics["eval/env/scheme/none"] == pytest.approx(0.5)
    text = format_metrics(metrics)
    assert "pass@1 0.2500  pass@3 0.5000" in text and "strategy_filter 0.50" in text


def test_chunked_play_gives_the_same_metrics(env):
    whole, _ = evaluate(ScriptedPolicy(SCRIPT), env, env.tasks("eval"), num_samples=4, ks=[1, 3], tasks_per_batch=None)
    chunked, episodes = evaluate(
        ScriptedPolicy(SCRIPT), env, env.tasks("eval"), num_samples=4, ks=[1, 3], tasks_per_batch=1
    )
    assert chunked == whole
    assert [ep.task for eps in episodes for ep in eps] == [0] * 4 + [1] * 4


def test_multi_turn_episodes_continue_until_solved(tmp_path):
    path = tmp_path / "toy.json"
    path.write_text(json.dumps([PRIME]))
    env = make_env(
        "coding",
        dataset="coophumaneval",
        path=str(path),
        train_split="[:]",
        eval_split="[:]",
        horizon=2,
        workers=2,
        test_timeout=2.0,
    )
    script = {(0, "x_or_y"): [PRIME_AUX] * 3, (1, "x_or_y"): [RIGHT, NEAR, RIGHT]}
    (episodes,) = play(ScriptedPolicy(script), env, env.tasks("eval"), num_samples=2)
    assert [len(e.steps) for e in episodes] == [1, 2]  # the second sample revises once, with the diagnostics
    assert episodes[1].info["solved"] == 1.0
    assert episodes[1].return_ == pytest.approx(3.75 + 4.0)


def test_bad_k_is_a_user_error(env):
    from collab.errors import UserError

    with pytest.raises(UserError, match="no k <= num_samples"):
        evaluate(ScriptedPolicy(SCRIPT), env, env.tasks("eval"), num_samples=2, ks=[5])


def run_module(module, *args, cwd, timeout=600):
    """``python -m module args``, forked warm (tests/support/warm.py)."""
    return warm.run(list(args), cwd, warm.child_env(), module, timeout)


TINY = [
    "--model.base.name",
    "tiny",
    "--trainer.accelerator",
    "cpu",
    "--data.env",
    "coding",
    "--model.agents",
    json.dumps([{"sampling": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 16}}] * 2),
]


def test_evaluate_cli_on_the_untrained_tiny_team(tmp_path):
    out = tmp_path / "metrics.json"
    result = run_module(
        "collab.evaluate",
        "--algo",
        "magrpo",
        *TINY,
        "--max_tasks",
        "2",
        "--num_samples",
        "3",
        "--k",
        "1",
        "3",
        "--output",
        str(out),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "magrpo on coding (eval: 2 tasks x 3 samples; weights: untrained)" in result.stdout
    metrics = json.loads(out.read_text())
    assert set(metrics) >= {"eval/pass@1", "eval/pass@3", "eval/acc@1", "eval/return", "eval/env/scheme/none"}
    assert 0.0 <= metrics["eval/pass@1"] <= metrics["eval/pass@3"] <= 1.0


def test_fit_with_the_evaluation_callback_then_evaluate_its_weights(tmp_path, monkeypatch, capsys):
    config = tmp_path / "eval.yaml"
    config.write_text("""
trainer:
  max_steps: 1
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {save_last: true}
    - class_path: collab.training.callbacks.AdapterCheckpoint
    - class_path: collab.training.callbacks.EvaluationCallback
      init_args: {every_n_steps: 1, num_samples: 2, ks: [1, 2], max_tasks: 2}
model:
  num_generations: 2
  agent_lr: 0.05
data:
  batch_size: 1
""")
    result = run_module("collab.fit", "--algo", "magrpo", *TINY, "--config", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "evaluation at step 1 (2 eval tasks x 2 samples)" in result.stdout
    assert result.stdout.count("evaluation at step") == 1  # not again at the end: it just ran
    from collab.evaluation.analysis import read_scalars

    run = tmp_path / "runs" / "magrpo" / "version_0"
    assert {"eval/pass@1", "eval/pass@2", "eval/acc@1", "env/tests", "env/cooperation"} <= set(read_scalars(run))

    # The same trained weights through a Lightning checkpoint or the peft folders give the same evaluation (in this
    # process: test_evaluate_cli_on_the_untrained_tiny_team runs ``python -m collab.evaluate`` itself).
    from collab.evaluate import main

    common = ["--algo", "magrpo", *TINY, "--max_tasks", "2", "--num_samples", "2", "--k", "1", "2"]
    monkeypatch.chdir(tmp_path)
    ckpt = ["--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--output", str(tmp_path / "ckpt.json")]
    assert main([*common, *ckpt]) == 0
    assert "weights: " + str(run / "checkpoints" / "last.ckpt") in capsys.readouterr().out
    adapters = ["--adapters", str(run / "adapters" / "last"), "--output", str(tmp_path / "adapters.json")]
    assert main([*common, *adapters]) == 0
    assert json.loads((tmp_path / "ckpt.json").read_text()) == json.loads((tmp_path / "adapters.json").read_text())
