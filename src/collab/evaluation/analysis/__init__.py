"""Reading runs for notebooks and reports: TensorBoard scalars as plain Python data.

A run is a folder ``<root>/<name>/version_N/`` written by ``python -m collab.fit`` (TensorBoard events,
LightningCLI's ``config.yaml``, ``hparams.yaml``, ``reward_summary.json``). Import every name from here
(``from collab.evaluation import analysis``); they live in :mod:`~collab.evaluation.analysis.runs` (runs, their
info, tags, summaries, comparison tables; :func:`runs_root`: ``$COLLAB_RUNS`` or ``runs``),
:mod:`~collab.evaluation.analysis.curves` (curves grouped and averaged over seeds with a 95% Student-t band,
smoothing, cooperation-scheme distributions) and :mod:`~collab.evaluation.analysis.figures` (matplotlib, imported
when called; saved under ``$COLLAB_FIGURES``). Notebooks: docs/evaluation.md#analysis-and-notebooks.

Nothing here needs numpy or pandas.
"""

from collab.evaluation.analysis.curves import (
    SCHEME_PREFIXES,
    curves_by,
    mean_curve,
    scheme_history,
    scheme_steps,
    scheme_table,
    smooth,
    t_quantile,
)
from collab.evaluation.analysis.figures import (
    curves_figure,
    figures_dir,
    plot_mean_curves,
    plot_scheme_bars,
    plot_scheme_steps,
    save_figure,
    schemes_figure,
)
from collab.evaluation.analysis.runs import (
    Rows,
    RunInfo,
    as_frame,
    format_rows,
    info_rows,
    last_values,
    list_runs,
    read_scalars,
    read_table,
    reward_summaries,
    run_info,
    run_infos,
    runs,
    runs_root,
    tag_table,
)

__all__ = [
    "SCHEME_PREFIXES",
    "RunInfo",
    "Rows",
    "as_frame",
    "curves_by",
    "curves_figure",
    "figures_dir",
    "format_rows",
    "info_rows",
    "last_values",
    "list_runs",
    "mean_curve",
    "plot_mean_curves",
    "plot_scheme_bars",
    "plot_scheme_steps",
    "read_scalars",
    "read_table",
    "reward_summaries",
    "run_info",
    "run_infos",
    "runs",
    "runs_root",
    "save_figure",
    "scheme_history",
    "scheme_steps",
    "scheme_table",
    "schemes_figure",
    "smooth",
    "t_quantile",
    "tag_table",
]
