"""A grid's finished runs carried to another machine: ``python -m collab.compare ... --restore RESULTS [STEPS]``.

Every successful row of ``results.csv`` that is a run of this grid (its method, env and seed name a cell) becomes
that run's record, ``step_rows`` from ``steps.csv``, so the grid redoes none of them; a row made at another budget
or evaluation stops the command in one line before anything runs, and a cell with a record keeps it
(docs/evaluation.md, *python -m collab.compare*).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import get_args, get_type_hints

from collab.compare.grid import Cell, Settings, record_path
from collab.compare.report import RESULT_COLUMNS, STEP_COLUMNS
from collab.compare.running import Record, write_record
from collab.errors import UserError


def _number_type(hint) -> type | None:
    """int or float for a Record field typed so (optional or not), None for a string field."""
    kinds = (hint, *get_args(hint))
    return int if int in kinds else float if float in kinds else None


NUMBERS = {key: kind for key, hint in get_type_hints(Record).items() if (kind := _number_type(hint))}
"""The results.csv columns read as numbers: Record's int and float fields."""


def _read(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        raise UserError(f"--restore: {path} is not a file; give a grid's results.csv (and its steps.csv)")
    kind = "results" if "score" in columns else "steps"
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            rows = list(reader)
    except (UnicodeDecodeError, csv.Error) as e:
        raise UserError(f"--restore: {path} is not a CSV file ({e}); give a grid's {kind}.csv") from None
    if missing:
        raise UserError(
            f"--restore: {path} has no column {', '.join(missing)}; give a grid's {kind}.csv "
            f"(columns {', '.join(columns)})"
        )
    return [{k: v or "" for k, v in row.items() if k is not None} for row in rows]  # short rows: empty cells


def _value(path: Path, row: dict[str, str], key: str):
    """The record's value of a CSV cell: a string column as it is, a number column's number (None when empty)."""
    text = row[key]
    if key not in NUMBERS:
        return text
    if text == "":
        return None
    try:
        return int(float(text)) if NUMBERS[key] is int else float(text)
    except ValueError:
        raise UserError(
            f"--restore: {path}: {key} of {row['method']}-{row['env']}-{row['seed']} is {text!r}, not a number"
        ) from None


def _step(path: Path, row: dict[str, str]) -> dict:
    try:
        return {
            "method": row["method"],
            "env": row["env"],
            "seed": int(row["seed"]),
            "step": int(row["step"]),
            "rollout": int(row["rollout"]) if row["rollout"] != "" else "",
            "tag": row["tag"],
            "value": float(row["value"]),
        }
    except ValueError:
        raise UserError(
            f"--restore: {path}: a row of {row['method']}-{row['env']}-{row['seed']} ({row['tag']}) has "
            f"a step, rollout or value that is not a number"
        ) from None


def _mismatch(record: dict, settings: Settings) -> str | None:
    """Why this run was not made at the grid's budget and evaluation (None: it was)."""
    if settings.defaults:
        return None
    wanted = [("eval_samples", settings.eval_samples)]
    if settings.eval_tasks is not None:
        wanted.append(("eval_problems", settings.eval_tasks))
    if settings.score is not None:
        wanted.append(("score_key", settings.score))
    if record["kind"] != "baseline" and settings.rollouts is not None:
        wanted.append(("rollouts", settings.rollouts))
    for key, value in wanted:
        if record.get(key) != value:
            return f"{key} {record.get(key)!r}, this grid's {value!r}"
    if record["kind"] != "baseline" and settings.tokens is not None and (record.get("tokens") or 0) < settings.tokens:
        return f"tokens {record.get('tokens')!r}, under this grid's budget of {settings.tokens}"
    return None


def restored(paths: list[str], cells: list[Cell], settings: Settings, out: Path) -> dict[Cell, dict]:
    """The record of every cell without one that ``paths`` (``RESULTS [STEPS]``) holds as a successful run at this
    grid's settings (read and checked only: :func:`write` writes them)."""
    if not 1 <= len(paths) <= 2:
        raise UserError(f"--restore takes a grid's results.csv and optionally its steps.csv, got {len(paths)} paths")
    results = Path(paths[0])
    rows = _read(results, RESULT_COLUMNS)
    steps = [_step(Path(paths[1]), row) for row in _read(Path(paths[1]), STEP_COLUMNS)] if len(paths) == 2 else []
    by_name = {c.name: c for c in cells}
    fields = set(Record.__dataclass_fields__)
    chosen = {}
    for row in rows:
        name = f"{row['method']}-{row['env']}-{row['seed']}"
        cell = by_name.get(name)
        if cell is None or record_path(out, cell).exists():
            continue
        record = {key: _value(results, row, key) for key in RESULT_COLUMNS if key in fields}
        if record["returncode"] != 0:
            continue
        why = _mismatch(record, settings)
        if why is not None:
            raise UserError(
                f"--restore: {results} holds {name} at {why}: another grid's run; give this grid's "
                f"results.csv or start another --output"
            )
        mine = [s for s in steps if (s["method"], s["env"], s["seed"]) == (cell.method, cell.env, cell.seed)]
        chosen[cell] = {**record, "command": [], "metrics": {}, "step_rows": mine, "restored_from": str(results)}
    return chosen


def write(records: dict[Cell, dict], out: Path) -> None:
    for cell, record in records.items():
        write_record(out, cell, record)
