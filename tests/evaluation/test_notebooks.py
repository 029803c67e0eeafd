"""``collab.evaluation.analysis`` on tiny runs, and both notebooks executed top to bottom against them.

One module fixture trains three tiny runs (``tiny`` model, 2 rollouts each, in one subprocess): MAGRPO on
writing with seeds 0 and 1, and MAGRPO on coding with the evaluation callback (so the scheme tags
``env/scheme/*`` and ``eval/env/scheme/*`` exist). The notebooks run with nbclient on a ``python3``
kernel of this interpreter (a kernelspec written to a temporary ``$JUPYTER_PATH``), in a temporary
folder, with ``COLLAB_RUNS`` naming the tiny runs and ``COLLAB_FIGURES`` a temporary figures folder.
"""

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.notebook_kernel import execute, png_size

ROOT = Path(__file__).resolve().parents[2]

SMALL = """
trainer:
  accelerator: cpu
  max_steps: 2
  enable_progress_bar: false
  enable_model_summary: false
  enable_checkpointing: false
  callbacks:
    - class_path: collab.training.callbacks.RewardSummary
      init_args: {window: 1}
model:
  base: {name: tiny}
  agents:
    - sampling: {temperature: 0.7, top_p: 0.9, top_k: 0, max_new_tokens: 8}
    - sampling: {temperature: 0.7, top_p: 0.9, top_k: 0, max_new_tokens: 8}
  num_generations: 2
data:
  env: writing
  batch_size: 1
"""
CODING = """
trainer:
  callbacks:
    - class_path: collab.training.callbacks.RewardSummary
      init_args: {window: 1}
    - class_path: collab.training.callbacks.EvaluationCallback
      init_args: {every_n_steps: 1, num_samples: 2, ks: [1, 2], max_tasks: 2, at_end: true}
model:
  agents:
    - sampling: {temperature: 0.7, top_p: 0.9, top_k: 0, max_new_tokens: 16}
    - sampling: {temperature: 0.7, top_p: 0.9, top_k: 0, max_new_tokens: 16}
data:
  env: coding
  env_options: {dataset: humaneval}
  num_turns: 1
"""
# As collab.evaluate --table writes it (collab.evaluation.comparison): a score column per task, empty where a task
# has none.
TABLE = (
    "method,task,env,time_s,cost_tokens,score,pass,samples,tasks,model,split,weights\n"
    "magrpo,tldr,writing,1.25,61.5,41.2,,4,16,smollm2-135m-instruct,eval,runs/magrpo/version_0\n"
    "single,coophe,coding,0.98,120.0,,8.5,4,16,smollm2-135m-instruct,eval,\n"
)


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """``<tmp>/runs/magrpo/version_{0,1}`` (writing, seeds 0 and 1), ``version_2`` (coding, seed 0)
    and ``<tmp>/runs/comparison.csv``."""
    work = tmp_path_factory.mktemp("tiny_runs")
    (work / "small.yaml").write_text(SMALL)
    (work / "coding.yaml").write_text(CODING)
    jobs = [
        ["--seed_everything", "0"],
        ["--seed_everything", "1"],
        ["--seed_everything", "0", "--config", "coding.yaml"],
    ]
    script = textwrap.dedent(f"""
        import sys
        from collab.fit import main
        base = ["--algo", "magrpo", "--config", "small.yaml", "--trainer.logger.init_args.save_dir", "runs"]
        for extra in {jobs!r}:
            code = main(base + extra)
            if code:
                sys.exit(code)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (work / "runs" / "comparison.csv").write_text(TABLE)
    (work / "runs" / "comparison.md").write_text("| Method | Time |\n|---|---|\n| magrpo | 1.25 |\n")
    return work / "runs"


# Pure helpers.


def test_mean_curve_aligns_steps_and_uses_student_t():
    from collab.evaluation.analysis import mean_curve, t_quantile

    curve = mean_curve([[(0, 1.0), (1, 2.0), (2, 5.0)], [(0, 3.0), (1, 4.0)], [(1, 6.0), (1, 8.0)]])
    assert curve["step"] == [0, 1, 2] and curve["n"] == [2, 3, 1]
    # The third curve logs step 1 twice (a resumed run): it counts once, as 7.0.
    assert curve["mean"] == pytest.approx([2.0, 13 / 3, 5.0])
    sem0 = math.sqrt(2.0) / math.sqrt(2)  # values 1 and 3: sample std sqrt(2)
    assert curve["high"][0] - curve["mean"][0] == pytest.approx(t_quantile(1) * sem0)
    assert curve["low"][2] == curve["high"][2] == 5.0  # one curve: no band
    normal = mean_curve([[(0, 1.0)], [(0, 3.0)]], z=1.96)
    assert normal["high"][0] == pytest.approx(2.0 + 1.96 * sem0)
    assert t_quantile(1) == pytest.approx(12.706) and t_quantile(100) == 1.96


def test_smooth_and_table_helpers(tmp_path):
    from collab.evaluation.analysis import Rows, format_rows, read_table, smooth

    assert smooth([(2, 3.0), (0, 1.0), (1, 2.0)], 2) == [(0, 1.0), (1, 1.5), (2, 2.5)]
    assert smooth([(0, 1.0)]) == [(0, 1.0)]
    with pytest.raises(ValueError):
        smooth([], 0)
    assert read_table(tmp_path / "missing.csv") is None
    (tmp_path / "t.csv").write_text(TABLE)
    rows = read_table(tmp_path / "t.csv")
    assert rows[0]["method"] == "magrpo" and rows[0]["time_s"] == 1.25 and rows[0]["samples"] == 4
    assert rows[0]["pass"] is None and rows[1]["pass"] == 8.5 and rows[1]["weights"] is None
    text = format_rows(rows)
    assert text.splitlines()[0].split()[:5] == ["method", "task", "env", "time_s", "cost_tokens"]
    assert len(text.splitlines()) == 3
    assert repr(Rows(rows)) == text and "<td>single</td>" in Rows(rows)._repr_html_()
    assert format_rows([]) == "(no rows)"


def test_scheme_steps_fill_every_scheme():
    from collab.envs.coding.schemes import SCHEMES
    from collab.evaluation.analysis import scheme_steps

    scalars = {
        "eval/env/scheme/fallback": [(5, 0.25), (10, 0.5)],
        "eval/env/scheme/none": [(5, 0.75), (10, 0.5)],
        "env/scheme/none": [(0, 1.0)],
        "reward/return": [(0, 1.0)],
    }
    steps = scheme_steps(scalars)
    assert [s for s, _ in steps] == [5, 10]
    assert list(steps[0][1]) == list(SCHEMES) and steps[0][1]["fallback"] == 0.25 and steps[1][1]["decorator"] == 0.0
    assert scheme_steps(scalars, "env/scheme/") == [(0, {**{s: 0.0 for s in SCHEMES}, "none": 1.0})]
    assert scheme_steps({"reward/return": [(0, 1.0)]}) == []


def test_run_info_without_config(tmp_path):
    from collab.evaluation.analysis import run_info

    run = tmp_path / "ippo" / "version_3"
    run.mkdir(parents=True)
    info = run_info(run)
    assert (info.name, info.version, info.algo, info.env, info.seed, info.label) == (
        "ippo",
        "version_3",
        "ippo",
        None,
        None,
        "ippo/version_3",
    )
    (run / "hparams.yaml").write_text("seed_everything: 7\ndata: {env: matrix}\n")
    assert (run_info(run).seed, run_info(run).env) == (7, "matrix")
    assert run_info(run, tmp_path).label == "ippo/version_3" and run_info(run, run).label == "ippo/version_3"
    nested = tmp_path / "h100" / "ippo" / "version_0"
    nested.mkdir(parents=True)
    (nested / "events.out.tfevents.0").write_bytes(b"")
    from collab.evaluation.analysis import list_runs

    assert [i.label for i in list_runs(tmp_path)] == ["h100/ippo/version_0"]  # unique under the root


# The tiny runs.


def test_runs_are_described(tiny_runs):
    from collab.evaluation.analysis import list_runs, reward_summaries, scheme_history, scheme_table, tag_table

    infos = list_runs(tiny_runs)
    assert [(i.label, i.algo, i.env, i.seed, i.model) for i in infos] == [
        ("magrpo/version_0", "magrpo", "writing", 0, "tiny"),
        ("magrpo/version_1", "magrpo", "writing", 1, "tiny"),
        ("magrpo/version_2", "magrpo", "coding", 0, "tiny"),
    ]
    rows = tag_table(tiny_runs, "reward/return")
    assert len(rows) == 6 and {r["step"] for r in rows} == {0, 1} and {r["seed"] for r in rows} == {0, 1}
    assert [r["rollouts"] for r in reward_summaries(infos)] == [2, 2, 2]
    schemes = scheme_table(tiny_runs)
    assert len(schemes) == 1 and schemes[0]["run"] == "magrpo/version_2" and schemes[0]["source"] == "eval/env/scheme"
    assert schemes[0]["step"] == 2  # evaluations at steps 1 and 2 (every_n_steps=1)
    from collab.envs.coding.schemes import SCHEMES

    assert sum(schemes[0][s] for s in SCHEMES) == pytest.approx(1.0)
    history = scheme_history(tiny_runs, "env/scheme/", window=2)
    assert list(history) == ["magrpo/version_2"] and [s for s, _ in history["magrpo/version_2"]] == [0, 1]


# The notebooks.


def test_analysis_notebook(tiny_runs, kernel_env, monkeypatch):
    figures = kernel_env / "figures"
    text = "".join(execute("analysis", kernel_env, tiny_runs, figures, monkeypatch))
    assert "3 runs under" in text and "no comparison table" not in text
    assert "coophe" in text and "| magrpo | 1.25 |" in text  # the csv, then its markdown
    png = figures / "analysis_rewards.png"
    assert png.stat().st_size > 10_000
    width, height = png_size(png)
    assert width > 600 and height > 300  # two panels (coding, writing)
    assert not list(kernel_env.glob("runs")), "the notebook must not write into its working folder"


def test_cooperation_notebook(tiny_runs, kernel_env, monkeypatch):
    figures = kernel_env / "figures"
    text = "".join(execute("cooperation", kernel_env, tiny_runs, figures, monkeypatch))
    assert "1 coding runs with scheme tags" in text
    png = figures / "cooperation_schemes.png"
    assert png.stat().st_size > 10_000 and png_size(png)[0] > 600


def test_notebooks_without_runs(kernel_env, monkeypatch):
    """An empty runs folder: a note instead of the reward figure; the schemes of the hand-written samples."""
    empty, figures = kernel_env / "empty", kernel_env / "figures"
    empty.mkdir()
    text = "".join(execute("analysis", kernel_env, empty, figures, monkeypatch))
    assert "0 runs under" in text and "no run under" in text and "no comparison table" in text
    assert not (figures / "analysis_rewards.png").exists()
    text = "".join(execute("cooperation", kernel_env, empty, figures, monkeypatch))
    assert "0 coding runs" in text
    assert png_size(figures / "cooperation_schemes.png")[0] > 300
