"""Curves: a tag's curves grouped and averaged over seeds with a 95% confidence band (Student t), smoothing,
and the cooperation-scheme distribution of coding runs over steps (``eval/env/scheme/*``, ``env/scheme/*``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from collab.evaluation.analysis.runs import RunInfo, read_scalars, run_infos

SCHEME_PREFIXES = ("eval/env/scheme/", "env/scheme/")
"""Where the coding env's scheme one-hots are logged: the evaluation callback's mean over eval
episodes (``eval/env/scheme/<name>``), and training's mean over each rollout (``env/scheme/<name>``)."""

# Student t quantiles t(0.975, df) for df = 1..30 (two-sided 95%); larger df use the normal 1.96.
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def smooth(curve: Sequence[tuple[int, float]], window: int = 1) -> list[tuple[int, float]]:
    """Trailing moving average over ``window`` points (1: unchanged), the steps kept."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    points = sorted(curve)
    out = []
    for i, (step, _) in enumerate(points):
        part = [v for _, v in points[max(0, i - window + 1) : i + 1]]
        out.append((step, sum(part) / len(part)))
    return out


def t_quantile(df: int) -> float:
    """Two-sided 95% Student t quantile t(0.975, df) (the normal 1.96 beyond df 30)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def mean_curve(curves: Sequence[Sequence[tuple[int, float]]], z: float | None = None) -> dict[str, list]:
    """Mean over seeds of ``curves`` (each ``[(step, value), ...]``) with a 95% confidence band.

    Steps are aligned by value: at each step logged by any curve, the mean and the standard error of
    the mean (sample std / sqrt(n)) of the n curves that have it; the band is mean ± q·sem with q the
    Student t quantile t(0.975, n-1) (``z`` overrides it, e.g. 1.96 for the normal approximation).
    A step seen by one curve only has no spread: its band is the mean itself. A curve that logs a
    step twice (a resumed run) counts with the mean of its values there.
    Returns ``{"step", "mean", "low", "high", "n"}``, lists ordered by step.
    """
    per_step: dict[int, list[float]] = {}
    for curve in curves:
        mine: dict[int, list[float]] = {}
        for step, value in curve:
            mine.setdefault(int(step), []).append(float(value))
        for step, values in mine.items():
            per_step.setdefault(step, []).append(sum(values) / len(values))
    out: dict[str, list] = {"step": [], "mean": [], "low": [], "high": [], "n": []}
    for step in sorted(per_step):
        values = per_step[step]
        n = len(values)
        mean = sum(values) / n
        half = 0.0
        if n > 1:
            sem = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
            half = (t_quantile(n - 1) if z is None else z) * sem
        for key, v in zip(out, (step, mean, mean - half, mean + half, n)):
            out[key].append(v)
    return out


def curves_by(
    source: str | Path | Iterable[RunInfo], tag: str, key: str = "algo", window: int = 1
) -> dict[str, list[list[tuple[int, float]]]]:
    """``{group: [curve of each run]}`` of ``tag`` with runs grouped by a :class:`RunInfo` field
    (``algo``, ``env``, ``name``, ``model``; several: ``"algo,env"``), each curve smoothed over ``window``."""
    groups: dict[str, list[list[tuple[int, float]]]] = {}
    fields = [k.strip() for k in key.split(",")]
    for info in run_infos(source):
        curve = read_scalars(info.path).get(tag)
        if curve:
            group = "/".join(str(getattr(info, f)) for f in fields)
            groups.setdefault(group, []).append(smooth(curve, window))
    return groups


def scheme_steps(
    scalars: dict[str, list[tuple[int, float]]], prefix: str = "eval/env/scheme/"
) -> list[tuple[int, dict[str, float]]]:
    """The scheme distribution at each logged step: ``[(step, {scheme: fraction}), ...]`` from the
    tags ``<prefix><scheme>`` of a run's scalars (:func:`read_scalars`); every scheme of
    :data:`collab.envs.coding.schemes.SCHEMES` is present (0.0 when not logged at that step).
    Empty when the run logged no such tag (not a coding run, or no evaluation)."""
    from collab.envs.coding.schemes import SCHEMES

    per_step: dict[int, dict[str, float]] = {}
    for tag, points in scalars.items():
        if tag.startswith(prefix):
            scheme = tag[len(prefix) :]
            for step, value in points:
                per_step.setdefault(int(step), {})[scheme] = float(value)
    names = list(SCHEMES) + sorted({s for d in per_step.values() for s in d} - set(SCHEMES))
    return [(step, {s: per_step[step].get(s, 0.0) for s in names}) for step in sorted(per_step)]


def scheme_table(
    source: str | Path | Iterable[RunInfo], prefixes: Sequence[str] = SCHEME_PREFIXES, at: str = "last"
) -> list[dict]:
    """One row per run that logged scheme tags: ``{run, algo, env, seed, source, step, <scheme>...}``.

    ``source`` is the first of ``prefixes`` the run has (evaluation before training by default);
    ``at="last"`` takes the distribution at the last logged step (the trained team), ``at="mean"``
    the mean over all logged steps (``step`` is then the last step)."""
    if at not in ("last", "mean"):
        raise ValueError(f"at must be 'last' or 'mean', got {at!r}")
    rows = []
    for info in run_infos(source):
        scalars = read_scalars(info.path)
        for prefix in prefixes:
            steps = scheme_steps(scalars, prefix)
            if not steps:
                continue
            if at == "last":
                dist = steps[-1][1]
            else:
                dist = {s: sum(d[s] for _, d in steps) / len(steps) for s in steps[-1][1]}
            rows.append({**info.row(), "source": prefix.rstrip("/"), "step": steps[-1][0], **dist})
            break
    return rows


def scheme_history(
    source: str | Path | Iterable[RunInfo], prefix: str = "env/scheme/", window: int = 1
) -> dict[str, list[tuple[int, dict[str, float]]]]:
    """``{run label: scheme_steps}`` of every run that logged ``<prefix><scheme>`` tags (by default
    training's per-rollout distribution), each scheme's series smoothed over ``window`` steps."""
    out = {}
    for info in run_infos(source):
        steps = scheme_steps(read_scalars(info.path), prefix)
        if steps and window > 1:
            names = list(steps[0][1])
            series = {n: smooth([(s, d[n]) for s, d in steps], window) for n in names}
            steps = [(s, {n: series[n][i][1] for n in names}) for i, (s, _) in enumerate(steps)]
        if steps:
            out[info.label] = steps
    return out
