"""What a ``python -m collab.compare`` grid's records add up to: ``results.csv`` and ``steps.csv`` rows
(:func:`result_rows`, :func:`step_rows`), :func:`summarize` (per method and env: the held-out score's mean and
standard error over seeds, the paired difference against the single-agent control with a Student-t 95%
confidence interval, wall time, generated tokens, peak memory), :func:`render_grid_markdown` (the table, its
budget stated), :func:`render_seed_tables` (``--defaults``: every seed's gain) and the figures
(:func:`grid_figure`: learning curves, mean and 95% band over seeds, one panel per env; :func:`heldout_figure`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from collab.evaluation.comparison import ORDER, markdown_row, number

RESULT_COLUMNS = (
    "method",
    "kind",
    "env",
    "seed",
    "returncode",
    "score",
    "score_se",
    "before",
    "before_se",
    "gain",
    "gain_se",
    "score_key",
    "eval_problems",
    "eval_samples",
    "rollouts",
    "steps",
    "tokens",
    "wall_s",
    "jobs",
    "peak_rss_bytes",
    "run_dir",
)
"""``results.csv``: one row per run (a :class:`collab.compare.running.Record`); ``score`` is the held-out score
after training (a baseline's: untrained), ``before`` the same before training."""
STEP_COLUMNS = ("method", "env", "seed", "step", "rollout", "tag", "value")
"""``steps.csv``: every scalar a trained run logged, at the logger's step and the rollouts done by then."""


def result_rows(records: Iterable[Mapping]) -> list[dict[str, str]]:
    """``results.csv``'s rows (strings, empty for none) of records (dicts)."""
    return [
        {
            k: "" if r.get(k) is None else (number(r[k]) if isinstance(r[k], float) else str(r[k]))
            for k in RESULT_COLUMNS
        }
        for r in records
    ]


def step_rows(record: Mapping, scalars: Mapping[str, Sequence[tuple[int, float]]]) -> list[dict]:
    """``steps.csv``'s rows of one run from its scalars (``{tag: [(step, value)]}``) and its record. ``rollout``:
    a training metric's is the rollout count logged with it (``rollout/count``: Lightning logs a manually
    optimized module's metrics once per rollout); an evaluation's (``eval/*``, logged at the optimizer step) is 0
    before training and the run's rollouts at its last step (the grid evaluates before and after training only)."""
    rollout_at = {int(s): int(v) for s, v in scalars.get("rollout/count", [])}
    last_step, rollouts = record.get("steps"), record.get("rollouts")

    def rollout(tag: str, step: int):
        if not tag.startswith("eval/"):
            return rollout_at.get(step, "")
        return 0 if step == 0 else (rollouts if step == last_step else "")

    return [
        {
            "method": record["method"],
            "env": record["env"],
            "seed": record["seed"],
            "step": int(step),
            "rollout": rollout(tag, int(step)),
            "tag": tag,
            "value": float(value),
        }
        for tag, points in sorted(scalars.items())
        for step, value in points
    ]


def write_csv(path: str | Path, rows: Sequence[Mapping], fields: Sequence[str]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields), restval="", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def mean_se(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and standard error (sample std, ddof 1, / sqrt(n)); no SE below two values."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def _float(x) -> float | None:
    if x in (None, ""):
        return None
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def summarize(rows: Iterable[Mapping], control: str = "grpo") -> list[dict]:
    """Per (method, env), over the seeds of its successful runs: ``n``, ``score`` / ``score_se`` (mean and SE of
    the held-out scores), ``diff`` / ``diff_low`` / ``diff_high`` / ``pairs`` (the paired difference against
    ``control``: per seed run by both, score - control's score; their mean and its Student-t 95% confidence
    interval, mean ± t(0.975, pairs - 1) · SE; none below two pairs), ``wall_s`` and ``tokens`` (means per run),
    ``peak_rss_bytes`` (the largest) and ``failed`` (runs that did not end well)."""
    from collab.evaluation.analysis.curves import t_quantile

    rows = list(rows)
    scores: dict[tuple[str, str], dict[int, float]] = {}
    groups: dict[tuple[str, str], list[Mapping]] = {}
    for r in rows:
        groups.setdefault((str(r["method"]), str(r["env"])), []).append(r)
        score = _float(r.get("score"))
        if str(r.get("returncode")) == "0" and score is not None:
            scores.setdefault((str(r["method"]), str(r["env"])), {})[int(r["seed"])] = score
    out = []
    for (method, env), members in groups.items():
        ok = [r for r in members if str(r.get("returncode")) == "0"]
        mine = scores.get((method, env), {})
        entry: dict = {
            "method": method,
            "env": env,
            "kind": members[0].get("kind", ""),
            "n": len(mine),
            "failed": len(members) - len(ok),
            "score": None,
            "score_se": None,
            "diff": None,
            "diff_low": None,
            "diff_high": None,
            "pairs": 0,
        }
        if mine:
            entry["score"], entry["score_se"] = mean_se(list(mine.values()))
        theirs = scores.get((control, env), {})
        if method != control and theirs:
            diffs = [mine[s] - theirs[s] for s in sorted(mine) if s in theirs]
            entry["pairs"] = len(diffs)
            if diffs:
                entry["diff"], se = mean_se(diffs)
                if se is not None:
                    half = t_quantile(len(diffs) - 1) * se
                    entry["diff_low"], entry["diff_high"] = entry["diff"] - half, entry["diff"] + half
        for key in ("wall_s", "tokens"):
            values = [v for v in (_float(r.get(key)) for r in ok) if v is not None]
            entry[key] = sum(values) / len(values) if values else None
        peaks = [v for v in (_float(r.get("peak_rss_bytes")) for r in ok) if v]
        entry["peak_rss_bytes"] = max(peaks) if peaks else None
        out.append(entry)
    order = {m: i for i, m in enumerate(ORDER)}
    return sorted(out, key=lambda e: (order.get(e["method"], len(order)), e["method"]))


def _pm(mean: float | None, se: float | None) -> str:
    if mean is None:
        return "–"
    return f"{mean:.4f}" + (f" ± {se:.4f}" if se is not None else "")


def _diff(entry: Mapping) -> str:
    if entry["diff"] is None:
        return "–"
    if entry["diff_low"] is None:
        return f"{entry['diff']:+.4f} (1 seed)"
    return f"{entry['diff']:+.4f} [{entry['diff_low']:+.4f}, {entry['diff_high']:+.4f}]"


def _size(x: float | None, unit: str) -> str:
    if x is None:
        return "–"
    if unit == "s":
        return f"{x:.0f} s" if x < 120 else f"{x / 60:.1f} min"
    if unit == "GiB":
        return f"{x / 2**30:.2f} GiB"
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


GRID_COLUMNS = ("Held-out", "Δ vs {control} (95% CI)", "Wall", "Tokens", "Peak mem")


def render_grid_markdown(
    summary: Sequence[Mapping], budget: str, evaluation: str, control: str = "grpo", failed: Sequence[str] = ()
) -> str:
    """The grid's table: one row per method, one column group per env (held-out score mean ± SE over seeds, the
    paired difference against ``control`` with its 95% CI, wall time and generated tokens per run, peak memory),
    the budget and the evaluation stated above it, the failed runs below."""
    envs = list(dict.fromkeys(e["env"] for e in summary))
    order = {m: i for i, m in enumerate(ORDER)}
    methods = sorted(dict.fromkeys(e["method"] for e in summary), key=lambda m: (order.get(m, len(order)), m))
    cells = {(e["method"], e["env"]): e for e in summary}
    titles = [t.format(control=control) for t in GRID_COLUMNS]
    head = ["Method"] + [env if j == 0 else "" for env in envs for j in range(len(titles))]
    lines = [f"Budget: {budget} per training run (every method and seed the same).", "", f"Held-out: {evaluation}.", ""]
    if not summary:
        return "\n".join(lines + ["No run has finished yet."]) + "\n"
    lines += [
        markdown_row(head),
        markdown_row([":--"] + ["--:"] * (len(head) - 1)),
        markdown_row([""] + titles * len(envs)),
    ]
    for m in methods:
        row = [m + (" (control)" if m == control else "")]
        for env in envs:
            e = cells.get((m, env))
            if e is None:
                row += ["–"] * len(titles)
                continue
            seeds = f" (n={e['n']})" if e["n"] else ""
            row += [
                _pm(e["score"], e["score_se"]) + seeds,
                _diff(e),
                _size(e["wall_s"], "s"),
                _size(e["tokens"], "tokens"),
                _size(e["peak_rss_bytes"], "GiB"),
            ]
        lines.append(markdown_row(row))
    lines += [
        "",
        f"Held-out: mean ± SE over seeds (n runs). Δ: per seed, the method's held-out score minus the "
        f"single-agent control's ({control}: MAGRPO with one agent doing every role, the same budget), "
        "mean and Student-t 95% confidence interval over the seeds. Wall: mean time per run (a baseline's: "
        "its evaluation). Tokens: generated in training per run. Peak mem: the largest peak resident "
        "memory of a run's process tree. Baselines are untrained (collab.evaluation.baselines).",
    ]
    if failed:
        lines += ["", "Failed runs (left out): " + ", ".join(failed)]
    return "\n".join(lines) + "\n"


def render_seed_tables(rows: Sequence[Mapping], failed: Sequence[str] = ()) -> str:
    """``collab.compare --defaults``'s tables: per (algorithm, env), every seed's held-out score before and
    after training (± its SE over eval problems), the paired gain ± its SE and their ratio, wall time and peak
    memory; under it the mean gain over the seeds ± its SE across seeds (:func:`mean_se`), their ratio and how
    many seeds gained."""
    lines = [
        "Each algorithm's main job as it is: `python -m collab.fit --algo A --seed_everything k --data.seed k` "
        "(its own env, budget and held-out evaluation; nothing else given).",
        "",
    ]
    groups: dict[tuple[str, str], list[Mapping]] = {}
    for r in rows:
        groups.setdefault((str(r["method"]), str(r["env"])), []).append(r)
    order = {m: i for i, m in enumerate(ORDER)}
    for method, env in sorted(groups, key=lambda k: (order.get(k[0], len(order)), k)):
        mine = sorted(
            (r for r in groups[(method, env)] if str(r.get("returncode")) == "0" and _float(r.get("gain")) is not None),
            key=lambda r: int(r["seed"]),
        )
        if not mine:
            continue
        key = str(mine[0].get("score_key") or "score")
        lines += [
            f"### {method} on {env}: held-out {'accuracy' if key == 'solved' else key} "
            f"({mine[0].get('eval_problems') or '?'} eval problems x {mine[0].get('eval_samples') or '?'} "
            "episodes)",
            "",
            "| seed | before | after | gain (paired SE) | gain / SE | wall | peak mem |",
            "|---|---|---|---|---|---|---|",
        ]
        gains = []
        for r in mine:
            gain, gain_se = _float(r["gain"]), _float(r.get("gain_se"))
            gains.append(gain)
            ratio = f"{gain / gain_se:.1f}" if gain_se else "–"
            lines.append(
                f"| {r['seed']} | {_pm(_float(r.get('before')), _float(r.get('before_se')))} "
                f"| {_pm(_float(r.get('score')), _float(r.get('score_se')))} | {gain:+.4f}"
                + (f" ± {gain_se:.4f}" if gain_se is not None else "")
                + f" | {ratio} | {_size(_float(r.get('wall_s')), 's')} "
                f"| {_size(_float(r.get('peak_rss_bytes')), 'GiB')} |"
            )
        mean, se = mean_se(gains)
        spread = f" ± {se:.4f} (SE over seeds; {mean / se:.1f} SE)" if se else ""
        lines += [
            "",
            f"Mean gain over {len(gains)} seeds {mean:+.4f}{spread}; positive on "
            f"{sum(g > 0 for g in gains)} of {len(gains)}.",
            "",
        ]
    if failed:
        lines += ["Failed runs (left out): " + ", ".join(failed), ""]
    return "\n".join(lines)


def grid_curves(steps: Iterable[Mapping], tag: str = "reward/return") -> dict[str, dict[str, list]]:
    """``{env: {method: [curve per seed]}}`` of ``tag`` over rollouts (each curve ``[(rollout, value)]``) from
    ``steps.csv``'s rows."""
    runs: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    for r in steps:
        if r["tag"] == tag and r["rollout"] not in ("", None):
            runs.setdefault((str(r["env"]), str(r["method"]), str(r["seed"])), []).append(
                (int(r["rollout"]), float(r["value"]))
            )
    out: dict[str, dict[str, list]] = {}
    for (env, method, _), curve in sorted(runs.items()):
        out.setdefault(env, {}).setdefault(method, []).append(sorted(curve))
    return out


def grid_figure(steps: Iterable[Mapping], tag: str = "reward/return"):
    """Learning curves, one panel per env: each method's mean over seeds of ``tag`` against rollouts, with its
    Student-t 95% band (:func:`collab.evaluation.analysis.plot_mean_curves`). None when no run logged ``tag``."""
    import matplotlib.pyplot as plt

    from collab.evaluation.analysis import plot_mean_curves

    curves = grid_curves(steps, tag)
    if not curves:
        return None
    fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 4), squeeze=False)
    for ax, (env, groups) in zip(axes[0], sorted(curves.items())):
        plot_mean_curves(ax, groups)
        ax.set_title(env)
        ax.set_xlabel("rollout")
        ax.set_ylabel(tag)
    fig.tight_layout()
    return fig


def heldout_figure(rows: Sequence[Mapping], control: str = "grpo"):
    """The held-out scores, one panel per env: each method's runs (grey points, one per seed) and their mean
    with its Student-t 95% confidence interval over seeds. None when no run has a score."""
    import matplotlib.pyplot as plt

    from collab.evaluation.analysis.curves import t_quantile

    summary = [e for e in summarize(rows, control) if e["score"] is not None]
    envs = sorted({e["env"] for e in summary})
    if not envs:
        return None
    fig, axes = plt.subplots(1, len(envs), figsize=(5.5 * len(envs), 4), squeeze=False)
    for ax, env in zip(axes[0], envs):
        entries = [e for e in summary if e["env"] == env]
        for x, e in enumerate(entries):
            seeds = [
                _float(r.get("score"))
                for r in rows
                if str(r["method"]) == e["method"] and str(r["env"]) == env and str(r.get("returncode")) == "0"
            ]
            seeds = [s for s in seeds if s is not None]
            ax.scatter([x] * len(seeds), seeds, color="0.6", s=14, zorder=3)
            half = t_quantile(e["n"] - 1) * e["score_se"] if e["score_se"] is not None else 0.0
            ax.errorbar(x, e["score"], yerr=half, fmt="o", capsize=5, zorder=4)
        ax.set_xticks(range(len(entries)), [e["method"] for e in entries], rotation=30)
        ax.set_title(env)
        ax.set_ylabel("held-out score")
    fig.tight_layout()
    return fig
