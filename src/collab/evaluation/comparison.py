"""The method comparison table of CoLLM, Table 1: time, cost and score of each method on each task.

For one evaluation (one method on one task) a row holds

- ``time_s``: seconds per episode, the wall time of playing (and scoring) the episodes divided by
  their number (tasks x samples). Episodes are decoded in batches, so this is an amortized time, not
  one episode's latency; the paper times responses on one GPU and does not say how it batches.
- ``cost_tokens``: generated tokens per agent per turn, the completion tokens of every agent at every
  turn actually played divided by the number of those (agent, turn) responses (a single model counts
  as one agent; a discussion's draft round counts as a turn).
- the task's score columns, :data:`SCORES` by environment name (in %, as in Table 1); an environment
  not listed gets :data:`GENERIC`, its mean return.
- ``samples``, ``tasks`` (episodes per task and tasks evaluated), ``model``, ``split``, ``weights``.

Rows live in a csv keyed by (method, task): :func:`update_table` upserts one and rewrites the
markdown next to it (:func:`render_markdown`): rows are methods, one column group per task with its
Time, Cost and score columns, like Table 1.

The grid of ``python -m collab.compare`` (methods x envs x seeds at one training budget) has its own tables:
:mod:`collab.compare.report`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

KEY = ("method", "task")
HEAD = ("method", "task", "env", "time_s", "cost_tokens")
TAIL = ("samples", "tasks", "model", "split", "weights")


@dataclass(frozen=True)
class ScoreColumn:
    """One score of a task: the first metric of ``keys`` that the evaluation reports, times ``scale``
    (``"reward_max"``: as a % of the environment's ``reward_max``)."""

    key: str
    """csv column."""
    title: str
    """Markdown header."""
    keys: tuple[str, ...]
    scale: float | str = 100.0

    def value(self, metrics: Mapping[str, float], reward_max: float | None = None) -> float | None:
        for key in self.keys:
            if key in metrics and not math.isnan(metrics[key]):
                if self.scale == "reward_max":
                    return 100.0 * metrics[key] / reward_max if reward_max else metrics[key]
                return float(self.scale) * metrics[key]
        return None


SCORES: dict[str, tuple[ScoreColumn, ...]] = {
    # TLDR "Score": the final turn's writing reward (components summed) as a % of its 3.0 maximum.
    "writing": (ScoreColumn("score", "Score", ("eval/env/total", "eval/return"), "reward_max"),),
    # CoopHE "Pass": pass@1, the share of episodes whose program passes every test.
    "coding": (ScoreColumn("pass", "Pass", ("eval/pass@1",)),),
    "competitive_coding": (ScoreColumn("pass", "Pass", ("eval/pass@1",)),),
    # HouseBuild: the players' remaining health and the final world's IoU with the target (fractions:
    # the evaluation's voxel IoU, else the env's last-turn info).
    "minecraft": (ScoreColumn("hp", "HP", ("eval/env/hp",)), ScoreColumn("iou", "IoU", ("eval/iou", "eval/env/iou"))),
    # Accuracy: a correct final answer (pass@1 is the solved share).
    "math": (ScoreColumn("acc", "Acc", ("eval/pass@1", "eval/env/correct")),),
    # Debate: the last turn's majority-vote accuracy.
    "debate": (ScoreColumn("acc", "Acc", ("eval/env/accuracy", "eval/pass@1")),),
}
GENERIC = (ScoreColumn("return", "Return", ("eval/return",), 1.0),)
"""Any other environment (e.g. matrix): the mean episode return, unscaled."""

ORDER = (
    "single",
    "parallel",
    "pipeline",
    "discussion",
    "grpo",
    "magrpo",
    "ippo",
    "maporl",
    "marft_a",
    "marft_t",
    "collm_dc",
    "collm_cc",
)
"""Rows of known methods come in Table 1's order (baselines first); other methods follow in csv order."""


def score_columns(env_name: str) -> tuple[ScoreColumn, ...]:
    return SCORES.get(env_name, GENERIC)


def cost_per_agent_turn(episodes: Iterable) -> float:
    """Generated tokens per agent per turn: all completion tokens / all (agent, turn) responses.

    ``episodes``: Episodes, or lists of them (as :func:`collab.evaluation.heldout.evaluate` returns).
    """
    tokens = responses = 0
    for ep in _flat(episodes):
        for turn in ep.completions:
            tokens += sum(c.own_tokens for c in turn)  # generated: a tool's result is not
            responses += len(turn)
    return tokens / responses if responses else float("nan")


def _flat(episodes: Iterable) -> list:
    out = []
    for item in episodes:
        out.extend(_flat(item) if isinstance(item, (list, tuple)) else [item])
    return out


def make_row(
    method: str,
    task: str,
    env,
    metrics: Mapping[str, float],
    seconds: float,
    episodes: Iterable,
    model: str = "",
    split: str = "eval",
    weights: str = "untrained",
) -> dict[str, str]:
    """One csv row (strings) for ``method`` evaluated on ``task`` (``env`` chooses the score columns)."""
    flat = _flat(episodes)
    row = {
        "method": method,
        "task": task,
        "env": env.name,
        "time_s": number(seconds / len(flat) if flat else float("nan")),
        "cost_tokens": number(cost_per_agent_turn(flat)),
    }
    for column in score_columns(env.name):
        value = column.value(metrics, env.reward_max)
        row[column.key] = "" if value is None else number(value)
    row.update(
        {
            "samples": str(int(metrics.get("eval/samples", 0))),
            "tasks": str(int(metrics.get("eval/problems", 0))),
            "model": model,
            "split": split,
            "weights": weights,
        }
    )
    return row


def number(x: float) -> str:
    """A csv cell: ``x`` to 6 significant digits, empty for NaN."""
    return "" if math.isnan(x) else f"{x:.6g}"


def upsert(rows: Sequence[Mapping[str, str]], row: Mapping[str, str]) -> list[dict[str, str]]:
    """``rows`` with ``row`` replacing the one of the same (method, task), else appended."""
    out = [dict(r) for r in rows]
    for i, r in enumerate(out):
        if all(r.get(k) == row.get(k) for k in KEY):
            out[i] = dict(row)
            return out
    return out + [dict(row)]


def columns(rows: Sequence[Mapping[str, str]]) -> list[str]:
    """csv header: the fixed head, every score column in order of first appearance, the fixed tail."""
    scores: list[str] = []
    for r in rows:
        scores += [k for k in r if k not in HEAD and k not in TAIL and k not in scores]
    return [*HEAD, *scores, *TAIL]


def read_rows(path: str | Path) -> list[dict[str, str]]:
    path = Path(path)
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [dict(r) for r in csv.DictReader(f)]


def write_rows(path: str | Path, rows: Sequence[Mapping[str, str]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns(rows), restval="")
        writer.writeheader()
        writer.writerows(rows)


def _titles() -> dict[str, str]:
    titles = {c.key: c.title for cols in (*SCORES.values(), GENERIC) for c in cols}
    return {"time_s": "Time", "cost_tokens": "Cost", **titles}


def _fmt(key: str, text: str) -> str:
    if text in ("", None):
        return "–"
    try:
        x = float(text)
    except ValueError:
        return text
    if key == "cost_tokens":
        return f"{x:.0f}"
    if key == "time_s" and abs(x) < 1:
        return f"{x:.2f}"
    return f"{x:.1f}"


def render_markdown(rows: Sequence[Mapping[str, str]]) -> str:
    """Table 1's shape: a header row of task names (each over its group), a row of the groups'
    column names (Time, Cost, then the task's scores), one row per method; ``–`` where a method was
    not evaluated on a task."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    known = [m for m in ORDER if any(r["method"] == m for r in rows)]
    methods = known + [m for m in dict.fromkeys(r["method"] for r in rows) if m not in known]
    score_keys = [k for k in columns(rows) if k not in HEAD and k not in TAIL]
    groups = {
        t: ["time_s", "cost_tokens"] + [k for k in score_keys if any(r["task"] == t and r.get(k) for r in rows)]
        for t in tasks
    }
    titles = _titles()
    cells = {(r["method"], r["task"]): r for r in rows}
    head = ["Method"] + [t if j == 0 else "" for t in tasks for j in range(len(groups[t]))]
    sub = [""] + [titles.get(k, k) for t in tasks for k in groups[t]]
    lines = [markdown_row(head), markdown_row([":--"] + ["--:"] * (len(head) - 1)), markdown_row(sub)]
    for m in methods:
        lines.append(markdown_row([m] + [_fmt(k, cells.get((m, t), {}).get(k, "")) for t in tasks for k in groups[t]]))
    lines += [
        "",
        "Time: seconds per episode; Cost: generated tokens per agent per turn; scores in % "
        "(Return: mean episode return). CoLLM, Table 1 layout (collab.evaluation.comparison).",
    ]
    return "\n".join(lines) + "\n"


def markdown_row(cells: Sequence[str]) -> str:
    """One row of a markdown table."""
    return "| " + " | ".join(cells) + " |"


def update_table(csv_path: str | Path, row: Mapping[str, str]) -> tuple[list[dict[str, str]], Path]:
    """Upsert ``row`` into the csv at ``csv_path`` and rewrite the markdown table next to it (same name,
    ``.md``); the rows and the markdown path."""
    csv_path = Path(csv_path)
    rows = upsert(read_rows(csv_path), row)
    write_rows(csv_path, rows)
    md = csv_path.with_suffix(".md")
    md.write_text(render_markdown(rows))
    return rows, md
