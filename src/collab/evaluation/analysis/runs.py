"""Reading runs: each run's identity (:class:`RunInfo`), its TensorBoard scalars as plain Python data, its
``reward_summary.json``, and tables (csv in, plain text or HTML or a DataFrame out)."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


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

    def row(self) -> dict:
        """The columns that name the run in a table's row: ``{run, algo, env, seed}``."""
        return {"run": self.label, "algo": self.algo, "env": self.env, "seed": self.seed}


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
    return RunInfo(
        path=path,
        name=name,
        version=version,
        algo=str(logger_name or name),
        env=_get(config, "data", "env"),
        seed=seed,
        model=_get(config, "model", "base", "name"),
        label=label,
    )


def list_runs(root: str | Path = "runs") -> list[RunInfo]:
    """:class:`RunInfo` of every run under ``root`` (sorted by folder)."""
    return [run_info(p, root) for p in runs(root)]


def run_infos(source: str | Path | Iterable[RunInfo]) -> list[RunInfo]:
    """The runs of ``source``: every run under a root folder, or the given :class:`RunInfo` s."""
    return list_runs(source) if isinstance(source, (str, Path)) else list(source)


def tag_table(source: str | Path | Iterable[RunInfo], tag: str) -> list[dict]:
    """Tidy rows ``{run, algo, env, seed, model, step, value}`` of ``tag`` in every run of ``source``
    (a root folder or :class:`RunInfo` s); runs without the tag give no rows."""
    rows = []
    for info in run_infos(source):
        for step, value in read_scalars(info.path).get(tag, []):
            rows.append({**info.row(), "model": info.model, "step": step, "value": value})
    return rows


def last_values(source: str | Path | Iterable[RunInfo], tags: Sequence[str]) -> list[dict]:
    """One row per run: ``{run, algo, env, seed, <tag>: value at its last logged step (None if never)}``."""
    rows = []
    for info in run_infos(source):
        scalars = read_scalars(info.path)
        rows.append({**info.row(), **{tag: max(scalars[tag])[1] if scalars.get(tag) else None for tag in tags}})
    return rows


def reward_summaries(source: str | Path | Iterable[RunInfo]) -> list[dict]:
    """One row per run from its ``reward_summary.json`` (``collab.training.callbacks.RewardSummary``):
    ``{run, algo, env, seed, rollouts, first_mean, last_mean}``; runs without the file are skipped."""
    import json

    rows = []
    for info in run_infos(source):
        path = info.path / "reward_summary.json"
        if not path.is_file():
            continue
        summary = json.loads(path.read_text())
        rows.append({**info.row(), **{k: summary.get(k) for k in ("rollouts", "first_mean", "last_mean")}})
    return rows


def info_rows(infos: Iterable[RunInfo]) -> list[dict]:
    """:class:`RunInfo` s as rows (``path`` as text) for :func:`as_frame`."""
    return [{**asdict(i), "path": str(i.path)} for i in infos]


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
