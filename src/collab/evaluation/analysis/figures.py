"""Figures (matplotlib, imported when called): mean curves with confidence bands, scheme distributions, and
saving under ``$COLLAB_FIGURES``."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from collab.evaluation.analysis.curves import curves_by, mean_curve
from collab.evaluation.analysis.runs import RunInfo, run_infos


def figures_dir() -> Path | None:
    """The folder notebooks save their figures to: ``$COLLAB_FIGURES`` (created), else None (no saving)."""
    folder = os.environ.get("COLLAB_FIGURES")
    if not folder:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder)


def save_figure(fig, name: str) -> Path | None:
    """Save ``fig`` as ``<figures_dir()>/<name>`` (PNG, 120 dpi) when ``$COLLAB_FIGURES`` is set."""
    folder = figures_dir()
    if folder is None:
        return None
    path = folder / name
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def plot_mean_curves(ax, groups: dict[str, list[list[tuple[int, float]]]], z: float | None = None) -> None:
    """One line per group (its :func:`mean_curve`) with the confidence band shaded; the legend
    gives the number of runs (seeds) per group."""
    for group, curves in sorted(groups.items()):
        curve = mean_curve(curves, z)
        (line,) = ax.plot(curve["step"], curve["mean"], label=f"{group} (n={len(curves)})")
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
    ax.stackplot(
        [s for s, _ in steps],
        *[[d.get(n, 0.0) for _, d in steps] for n in names],
        labels=names,
        colors=[colors.get(n, "black") for n in names],
    )
    ax.set_ylim(0, 1)
    if len(steps) > 1:
        ax.set_xlim(steps[0][0], steps[-1][0])
    ax.set_xlabel("step")
    ax.set_ylabel("fraction")


def schemes_figure(
    rows: Sequence[dict],
    history: dict[str, Sequence[tuple[int, dict[str, float]]]] | None = None,
    title: str = "per run",
    max_history: int = 3,
):
    """A figure with the stacked bars of ``rows`` (:func:`plot_scheme_bars`) and, beside them, the
    distribution over steps of up to ``max_history`` runs of ``history`` (:func:`scheme_history`);
    one legend for all panels."""
    import matplotlib.pyplot as plt

    history = list((history or {}).items())[:max_history]
    fig, axes = plt.subplots(
        1, 1 + len(history), figsize=(6 + 4.5 * len(history), max(3.2, 1.8 + 0.4 * len(rows))), squeeze=False
    )
    plot_scheme_bars(axes[0][0], rows)
    axes[0][0].set_title(title)
    for ax, (label, steps) in zip(axes[0][1:], history):
        plot_scheme_steps(ax, steps)
        ax.set_title(label)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def curves_figure(
    source: str | Path | Iterable[RunInfo],
    tag: str = "reward/return",
    key: str = "algo",
    split: str = "env",
    window: int = 1,
    z: float | None = None,
):
    """A matplotlib figure with one panel per value of the :class:`RunInfo` field ``split`` (envs
    have their own reward scales) and in each the :func:`mean_curve` of ``tag`` per ``key`` group
    (:func:`plot_mean_curves`); None when no run logged ``tag``."""
    import matplotlib.pyplot as plt

    infos = run_infos(source)
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
