"""Reading runs for notebooks and reports: TensorBoard scalars as plain Python data.

A run is a folder ``<root>/<name>/version_N/`` written by ``python -m collab.fit`` (TensorBoard events,
LightningCLI's ``config.yaml``, ``hparams.yaml``, ``reward_summary.json``).

- :func:`list_runs` / :func:`run_info`: each run's algo, env, seed and base model (:class:`RunInfo`);
  :func:`reward_summaries` its ``reward_summary.json``.
- :func:`tag_table`: one tag across runs as tidy rows; :func:`last_values`: a few tags' last values per run.
- :func:`curves_by` and :func:`mean_curve`: a tag's curves grouped (by algo...) and averaged over seeds
  with a 95% confidence band (Student t); :func:`smooth`: a trailing moving average.
- :func:`scheme_steps`, :func:`scheme_table`, :func:`scheme_history`: the cooperation-scheme
  distribution of coding runs (``eval/env/scheme/*``, ``env/scheme/*``).
- :func:`read_table`: a comparison table (csv, e.g. ``collab.evaluate --table``); :func:`as_frame`
  shows rows as a DataFrame when pandas is installed, else as :class:`Rows`.
- Figures: :func:`curves_figure`, :func:`schemes_figure` and the ``plot_*`` helpers (matplotlib,
  imported when called); :func:`save_figure` saves under ``$COLLAB_FIGURES`` (:func:`figures_dir`);
  :func:`runs_root` is ``$COLLAB_RUNS`` or ``runs``.

Nothing here needs numpy or pandas.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

SCHEME_PREFIXES = ("eval/env/scheme/", "env/scheme/")
"""Where the coding env's scheme one-hots are logged: the evaluation callback's mean over eval
episodes (``eval/env/scheme/<name>``), and training's mean over each rollout (``env/scheme/<name>``)."""

# Student t quantiles t(0.975, df) for df = 1..30 (two-sided 95%); larger df use the normal 1.96.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of every scalar in a run folder's TensorBoard event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(Path(run_dir).glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


def runs(root: str | Path = "runs") -> list[Path]:
    """Every run folder (one holding TensorBoard events) under ``root``."""
    return sorted({p.parent for p in Path(root).rglob("events.out.tfevents.*")})


def runs_root(default: str | Path = "runs") -> Path:
    """The runs folder a notebook reads: ``$COLLAB_RUNS``, else ``default``."""
    return Path(os.environ.get("COLLAB_RUNS") or default)


def figures_dir() -> Path | None:
    """The folder notebooks save their figures to: ``$COLLAB_FIGURES`` (created), else None (no saving)."""
    folder = os.environ.get("COLLAB_FIGURES")
    if not folder:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder)


@dataclass(frozen=True)
class RunInfo:
    """What identifies a run. ``name`` is the logger's name (the folder above ``version_N``);
    ``algo`` is the logger name recorded in ``config.yaml`` (collab.fit names the logger after
    ``--algo``), else ``name``; ``env``, ``seed`` (``seed_everything``) and ``model``
    (``model.base.name``) come from the run's ``config.yaml`` (else ``hparams.yaml``) and are None when
    neither says. ``label`` is the run folder relative to the root it was listed under (``name/version_N``
    for a single run folder)."""

    path: Path
    name: str
    version: str
    algo: str
    env: str | None
    seed: int | None
    model: str | None
    label: str


def _yaml(path: Path) -> dict:
    if not path.is_file():
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _get(config: dict, *keys: str):
    for key in keys:
        if not isinstance(config, dict):
            return None
        config = config.get(key)
    return config


def run_info(run_dir: str | Path, root: str | Path | None = None) -> RunInfo:
    """:class:`RunInfo` of one run folder (``root``: the folder its ``label`` is relative to)."""
    path = Path(run_dir)
    versioned = path.name.startswith("version_")
    name = path.parent.name if versioned else path.name
    version = path.name if versioned else ""
    config = _yaml(path / "config.yaml") or _yaml(path / "hparams.yaml")
    seed = config.get("seed_everything")
    if isinstance(seed, bool) or not isinstance(seed, int):
        seed = None
    logger_name = _get(config, "trainer", "logger", "init_args", "name")
    label = path.relative_to(root).as_posix() if root is not None else "."
    if label == ".":
        label = f"{name}/{version}".rstrip("/")
    return RunInfo(path=path, name=name, version=version, algo=str(logger_name or name),
                   env=_get(config, "data", "env"), seed=seed, model=_get(config, "model", "base", "name"),
                   label=label)


def list_runs(root: str | Path = "runs") -> list[RunInfo]:
    """:class:`RunInfo` of every run under ``root`` (sorted by folder)."""
    return [run_info(p, root) for p in runs(root)]


def _infos(source: str | Path | Iterable[RunInfo]) -> list[RunInfo]:
    return list_runs(source) if isinstance(source, (str, Path)) else list(source)


def tag_table(source: str | Path | Iterable[RunInfo], tag: str) -> list[dict]:
    """Tidy rows ``{run, algo, env, seed, model, step, value}`` of ``tag`` in every run of ``source``
    (a root folder or :class:`RunInfo` s); runs without the tag give no rows."""
    rows = []
    for info in _infos(source):
        for step, value in read_scalars(info.path).get(tag, []):
            rows.append({"run": info.label, "algo": info.algo, "env": info.env, "seed": info.seed,
                         "model": info.model, "step": step, "value": value})
    return rows


def last_values(source: str | Path | Iterable[RunInfo], tags: Sequence[str]) -> list[dict]:
    """One row per run: ``{run, algo, env, seed, <tag>: value at its last logged step (None if never)}``."""
    rows = []
    for info in _infos(source):
        scalars = read_scalars(info.path)
        rows.append({"run": info.label, "algo": info.algo, "env": info.env, "seed": info.seed,
                     **{tag: max(scalars[tag])[1] if scalars.get(tag) else None for tag in tags}})
    return rows


def smooth(curve: Sequence[tuple[int, float]], window: int = 1) -> list[tuple[int, float]]:
    """Trailing moving average over ``window`` points (1: unchanged), the steps kept."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    points = sorted(curve)
    out = []
    for i, (step, _) in enumerate(points):
        part = [v for _, v in points[max(0, i - window + 1): i + 1]]
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


def curves_by(source: str | Path | Iterable[RunInfo], tag: str, key: str = "algo",
              window: int = 1) -> dict[str, list[list[tuple[int, float]]]]:
    """``{group: [curve of each run]}`` of ``tag`` with runs grouped by a :class:`RunInfo` field
    (``algo``, ``env``, ``name``, ``model``; several: ``"algo,env"``), each curve smoothed over ``window``."""
    groups: dict[str, list[list[tuple[int, float]]]] = {}
    fields = [k.strip() for k in key.split(",")]
    for info in _infos(source):
        curve = read_scalars(info.path).get(tag)
        if curve:
            group = "/".join(str(getattr(info, f)) for f in fields)
            groups.setdefault(group, []).append(smooth(curve, window))
    return groups


def scheme_steps(scalars: dict[str, list[tuple[int, float]]],
                 prefix: str = "eval/env/scheme/") -> list[tuple[int, dict[str, float]]]:
    """The scheme distribution at each logged step: ``[(step, {scheme: fraction}), ...]`` from the
    tags ``<prefix><scheme>`` of a run's scalars (:func:`read_scalars`); every scheme of
    :data:`collab.envs.coding.schemes.SCHEMES` is present (0.0 when not logged at that step).
    Empty when the run logged no such tag (not a coding run, or no evaluation)."""
    from collab.envs.coding.schemes import SCHEMES

    per_step: dict[int, dict[str, float]] = {}
    for tag, points in scalars.items():
        if tag.startswith(prefix):
            scheme = tag[len(prefix):]
            for step, value in points:
                per_step.setdefault(int(step), {})[scheme] = float(value)
    names = list(SCHEMES) + sorted({s for d in per_step.values() for s in d} - set(SCHEMES))
    return [(step, {s: per_step[step].get(s, 0.0) for s in names}) for step in sorted(per_step)]


def scheme_table(source: str | Path | Iterable[RunInfo], prefixes: Sequence[str] = SCHEME_PREFIXES,
                 at: str = "last") -> list[dict]:
    """One row per run that logged scheme tags: ``{run, algo, env, seed, source, step, <scheme>...}``.

    ``source`` is the first of ``prefixes`` the run has (evaluation before training by default);
    ``at="last"`` takes the distribution at the last logged step (the trained team), ``at="mean"``
    the mean over all logged steps (``step`` is then the last step)."""
    if at not in ("last", "mean"):
        raise ValueError(f"at must be 'last' or 'mean', got {at!r}")
    rows = []
    for info in _infos(source):
        scalars = read_scalars(info.path)
        for prefix in prefixes:
            steps = scheme_steps(scalars, prefix)
            if not steps:
                continue
            if at == "last":
                dist = steps[-1][1]
            else:
                dist = {s: sum(d[s] for _, d in steps) / len(steps) for s in steps[-1][1]}
            rows.append({"run": info.label, "algo": info.algo, "env": info.env, "seed": info.seed,
                         "source": prefix.rstrip("/"), "step": steps[-1][0], **dist})
            break
    return rows


def scheme_history(source: str | Path | Iterable[RunInfo], prefix: str = "env/scheme/",
                   window: int = 1) -> dict[str, list[tuple[int, dict[str, float]]]]:
    """``{run label: scheme_steps}`` of every run that logged ``<prefix><scheme>`` tags (by default
    training's per-rollout distribution), each scheme's series smoothed over ``window`` steps."""
    out = {}
    for info in _infos(source):
        steps = scheme_steps(read_scalars(info.path), prefix)
        if steps and window > 1:
            names = list(steps[0][1])
            series = {n: smooth([(s, d[n]) for s, d in steps], window) for n in names}
            steps = [(s, {n: series[n][i][1] for n in names}) for i, (s, _) in enumerate(steps)]
        if steps:
            out[info.label] = steps
    return out


def reward_summaries(source: str | Path | Iterable[RunInfo]) -> list[dict]:
    """One row per run from its ``reward_summary.json`` (``collab.training.callbacks.RewardSummary``):
    ``{run, algo, env, seed, rollouts, first_mean, last_mean}``; runs without the file are skipped."""
    import json

    rows = []
    for info in _infos(source):
        path = info.path / "reward_summary.json"
        if not path.is_file():
            continue
        summary = json.loads(path.read_text())
        rows.append({"run": info.label, "algo": info.algo, "env": info.env, "seed": info.seed,
                     **{k: summary.get(k) for k in ("rollouts", "first_mean", "last_mean")}})
    return rows


def _number(text: str | None):
    if text is None or text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_table(path: str | Path) -> list[dict] | None:
    """Rows of a csv table (e.g. ``collab.evaluate --table``) with numbers converted and empty cells
    None; None when the file does not exist."""
    path = Path(path)
    if not path.is_file():
        return None
    with path.open(newline="") as f:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]


def format_rows(rows: Sequence[dict], digits: int = 4) -> str:
    """Rows as a plain aligned text table (for when pandas is not installed)."""
    if not rows:
        return "(no rows)"
    columns = list(dict.fromkeys(k for row in rows for k in row))

    def cell(v) -> str:
        return f"{v:.{digits}g}" if isinstance(v, float) else "" if v is None else str(v)

    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


class Rows(list):
    """A list of row dicts that shows as a table: plain text (``repr``) or HTML in a notebook."""

    def __repr__(self) -> str:
        return format_rows(self)

    def _repr_html_(self) -> str:
        from html import escape

        columns = list(dict.fromkeys(k for row in self for k in row))
        cell = lambda v: escape(f"{v:.4g}" if isinstance(v, float) else "" if v is None else str(v))  # noqa: E731
        head = "".join(f"<th>{escape(str(c))}</th>" for c in columns)
        body = "".join("<tr>" + "".join(f"<td>{cell(row.get(c))}</td>" for c in columns) + "</tr>" for row in self)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def as_frame(rows: Sequence[dict]):
    """``rows`` as a pandas DataFrame when pandas is installed, else as :class:`Rows` (shown as a table)."""
    try:
        import pandas as pd
    except ImportError:
        return Rows(rows)
    return pd.DataFrame(list(rows))


# Plotting (matplotlib, imported when called).

def plot_mean_curves(ax, groups: dict[str, list[list[tuple[int, float]]]], z: float | None = None) -> None:
    """One line per group (its :func:`mean_curve`) with the confidence band shaded; the legend
    gives the number of runs (seeds) per group."""
    for group, curves in sorted(groups.items()):
        curve = mean_curve(curves, z)
        line, = ax.plot(curve["step"], curve["mean"], label=f"{group} (n={len(curves)})")
        if len(curves) > 1:
            ax.fill_between(curve["step"], curve["low"], curve["high"], color=line.get_color(), alpha=0.2)
    ax.set_xlabel("step")
    ax.legend(fontsize="small")


def _scheme_colors() -> dict[str, str]:
    """One fixed colour per scheme, so bars and areas agree across panels and figures."""
    from collab.envs.coding.schemes import SCHEMES

    palette = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:gray")
    return dict(zip(SCHEMES, palette))


def plot_scheme_bars(ax, rows: Sequence[dict], label: str = "run") -> None:
    """Stacked horizontal bars: the scheme distribution of each row of :func:`scheme_table`
    (or any rows with a fraction per scheme), labelled by ``row[label]``, first row on top."""
    colors = _scheme_colors()
    rows = list(rows)[::-1]
    labels = [str(row[label]) for row in rows]
    left = [0.0] * len(rows)
    for scheme, color in colors.items():
        widths = [float(row.get(scheme, 0.0)) for row in rows]
        ax.barh(labels, widths, left=left, label=scheme, color=color)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction of episodes")


def plot_scheme_steps(ax, steps: Sequence[tuple[int, dict[str, float]]]) -> None:
    """Stacked areas: the scheme distribution over steps (:func:`scheme_steps`)."""
    if not steps:
        return
    colors = _scheme_colors()
    names = list(steps[0][1])
    ax.stackplot([s for s, _ in steps], *[[d.get(n, 0.0) for _, d in steps] for n in names], labels=names,
                 colors=[colors.get(n, "black") for n in names])
    ax.set_ylim(0, 1)
    if len(steps) > 1:
        ax.set_xlim(steps[0][0], steps[-1][0])
    ax.set_xlabel("step")
    ax.set_ylabel("fraction")


def schemes_figure(rows: Sequence[dict], history: dict[str, Sequence[tuple[int, dict[str, float]]]] | None = None,
                   title: str = "per run", max_history: int = 3):
    """A figure with the stacked bars of ``rows`` (:func:`plot_scheme_bars`) and, beside them, the
    distribution over steps of up to ``max_history`` runs of ``history`` (:func:`scheme_history`);
    one legend for all panels."""
    import matplotlib.pyplot as plt

    history = list((history or {}).items())[:max_history]
    fig, axes = plt.subplots(1, 1 + len(history), figsize=(6 + 4.5 * len(history), max(3.2, 1.8 + 0.4 * len(rows))),
                             squeeze=False)
    plot_scheme_bars(axes[0][0], rows)
    axes[0][0].set_title(title)
    for ax, (label, steps) in zip(axes[0][1:], history):
        plot_scheme_steps(ax, steps)
        ax.set_title(label)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def curves_figure(source: str | Path | Iterable[RunInfo], tag: str = "reward/return", key: str = "algo",
                  split: str = "env", window: int = 1, z: float | None = None):
    """A matplotlib figure with one panel per value of the :class:`RunInfo` field ``split`` (envs
    have their own reward scales) and in each the :func:`mean_curve` of ``tag`` per ``key`` group
    (:func:`plot_mean_curves`); None when no run logged ``tag``."""
    import matplotlib.pyplot as plt

    infos = _infos(source)
    panels = {}
    for value in sorted({str(getattr(i, split)) for i in infos}):
        groups = curves_by([i for i in infos if str(getattr(i, split)) == value], tag, key, window)
        if groups:
            panels[value] = groups
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    for ax, (value, groups) in zip(axes[0], panels.items()):
        plot_mean_curves(ax, groups, z)
        ax.set_title(f"{split} = {value}")
        ax.set_ylabel(tag + (f" (mean of {window})" if window > 1 else ""))
    band = "Student t" if z is None else f"z = {z:g}"
    fig.suptitle(f"mean over runs (n seeds) with a 95% confidence band ({band})", fontsize="medium")
    fig.tight_layout()
    return fig


def save_figure(fig, name: str) -> Path | None:
    """Save ``fig`` as ``<figures_dir()>/<name>`` (PNG, 120 dpi) when ``$COLLAB_FIGURES`` is set."""
    folder = figures_dir()
    if folder is None:
        return None
    path = folder / name
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def info_rows(infos: Iterable[RunInfo]) -> list[dict]:
    """:class:`RunInfo` s as rows (``path`` as text) for :func:`as_frame`."""
    return [{**asdict(i), "path": str(i.path)} for i in infos]
