"""Reading runs for notebooks and reports: TensorBoard scalars as plain Python data.

A run is a folder ``<root>/<name>/version_N/`` written by ``python -m collab.fit`` (TensorBoard events,
LightningCLI's ``config.yaml``, ``hparams.yaml``, ``reward_summary.json``). Import every name from here
(``from collab.evaluation import analysis``); they live in three files:

- :mod:`~collab.evaluation.analysis.runs`: :func:`list_runs` / :func:`run_info`: each run's algo, env,
  seed and base model (:class:`RunInfo`); :func:`reward_summaries` its ``reward_summary.json``;
  :func:`tag_table`: one tag across runs as tidy rows; :func:`last_values`: a few tags' last values per
  run; :func:`read_table`: a comparison table (csv, e.g. ``collab.evaluate --table``); :func:`as_frame`
  shows rows as a DataFrame when pandas is installed, else as :class:`Rows`; :func:`runs_root` is
  ``$COLLAB_RUNS`` or ``runs``.
- :mod:`~collab.evaluation.analysis.curves`: :func:`curves_by` and :func:`mean_curve`: a tag's curves
  grouped (by algo...) and averaged over seeds with a 95% confidence band (Student t); :func:`smooth`: a
  trailing moving average; :func:`scheme_steps`, :func:`scheme_table`, :func:`scheme_history`: the
  cooperation-scheme distribution of coding runs (``eval/env/scheme/*``, ``env/scheme/*``).
- :mod:`~collab.evaluation.analysis.figures`: :func:`curves_figure`, :func:`schemes_figure` and the
  ``plot_*`` helpers (matplotlib, imported when called); :func:`save_figure` saves under
  ``$COLLAB_FIGURES`` (:func:`figures_dir`).

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
