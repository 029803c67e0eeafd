"""StrBuild's tasks: a string drawn in a 5 x 5 block font, read from the publisher's ``data.csv``.

The reference (OpenMLRL/LLM_Collab_Minecraft, ``str_build/utils/str_builder.py``, ``load_tasks_from_csv`` and
``render_string_mask_rows``) reads a csv with a header and the columns ``string`` and ``difficulty``
(``str_build/dataset/data.csv``: 10 rows, ``I`` to ``CLIM``). A row's string, trimmed and upper-cased, is drawn
letter by letter in its 5 x 5 font, ``spacing`` empty columns between two letters (2 in its config), as top-down
rows of ``#`` (a block) and ``.`` (air). The rows stand upright in the plane ``z = local_z`` (0 in its config):
column ``c`` is ``x = c``, row ``r`` (0 at the top) is ``y = 4 - r``, so the bbox runs from ``[0, 0, z]`` to
``[width - 1, 4, z]``. A row with an empty string is skipped; a ``difficulty`` that is not an integer reads as 0
(it is never used otherwise); task ids number the csv's data rows from 1, skipped rows included
(``str_build_0001``...).

collab's choices where the reference is silent or lenient: a file that is missing, not a ``.csv``, without a
``string`` column or without a usable row is one :class:`~collab.errors.UserError` line; a string with a
character the font does not draw (anything but ``A``-``Z``) is refused (the reference leaves its 5 columns
blank).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from collab.envs.records import load_records, packaged, select
from collab.errors import UserError

SHIPPED = "str_build/strings.csv"
"""Ten strings written for collab (the publisher's file is not shipped): ``dataset: null`` reads them."""
HEIGHT = 5

# The reference's 5 x 5 font (``_FONT_5X5``), rows top-down, '#' a block.
FONT = {
    "A": ".###./#...#/#####/#...#/#...#",
    "B": "####./#...#/####./#...#/####.",
    "C": ".####/#..../#..../#..../.####",
    "D": "####./#...#/#...#/#...#/####.",
    "E": "#####/#..../####./#..../#####",
    "F": "#####/#..../####./#..../#....",
    "G": ".####/#..../#.###/#...#/.###.",
    "H": "#...#/#...#/#####/#...#/#...#",
    "I": "#####/..#../..#../..#../#####",
    "J": "..###/...#./...#./#..#./.##..",
    "K": "#...#/#..#./###../#..#./#...#",
    "L": "#..../#..../#..../#..../#####",
    "M": "#...#/##.##/#.#.#/#...#/#...#",
    "N": "#...#/##..#/#.#.#/#..##/#...#",
    "O": ".###./#...#/#...#/#...#/.###.",
    "P": "####./#...#/####./#..../#....",
    "Q": ".###./#...#/#...#/#..##/.####",
    "R": "####./#...#/####./#..#./#...#",
    "S": ".####/#..../.###./....#/####.",
    "T": "#####/..#../..#../..#../..#..",
    "U": "#...#/#...#/#...#/#...#/.###.",
    "V": "#...#/#...#/#...#/.#.#./..#..",
    "W": "#...#/#...#/#.#.#/##.##/#...#",
    "X": "#...#/.#.#./..#../.#.#./#...#",
    "Y": "#...#/.#.#./..#../..#../..#..",
    "Z": "#####/...#./..#../.#.../#####",
}


def render(text: str, spacing: int) -> list[str]:
    """The top-down rows of ``text`` (trimmed, upper-cased), ``spacing`` air columns between letters."""
    rows = [""] * HEIGHT
    letters = str(text).strip().upper()
    for i, ch in enumerate(letters):
        glyph = FONT[ch].split("/")
        gap = "." * spacing if i < len(letters) - 1 else ""
        rows = [row + g + gap for row, g in zip(rows, glyph)]
    return rows


def positions(rows: Sequence[str], z: int) -> list[tuple[int, int, int]]:
    """WORLD positions of the ``#`` cells: ``x`` the column, ``y = height - 1 - row``, ``z`` fixed."""
    top = len(rows) - 1
    return [(x, top - r, z) for r, row in enumerate(rows) for x, ch in enumerate(row) if ch == "#"]


def _difficulty(value: Any) -> int:
    try:
        return int(str(value or "").strip() or "0")
    except ValueError:
        return 0


def load_strings(path: str | Path) -> list[dict[str, Any]]:
    """The tasks of a StrBuild csv (module docstring): ``{"task_id", "string", "difficulty"}`` records."""
    expect = "expected the publisher's data.csv format: a header line 'string,difficulty', then one string a row"
    if not Path(path).is_file():
        raise UserError(f"StrBuild data file not found: {path}; {expect}")
    if Path(path).suffix != ".csv":
        raise UserError(f"{path}: a StrBuild dataset is a .csv file; {expect}")
    rows = load_records(path)
    if rows and "string" not in rows[0]:
        raise UserError(f"{path}: no 'string' column (the header has: {', '.join(map(str, rows[0]))}); {expect}")
    records = []
    for idx, row in enumerate(rows, 1):
        text = str(row.get("string") or "").strip()
        if not text:
            continue
        bad = sorted({ch for ch in text.upper() if ch not in FONT})
        if bad:
            raise UserError(
                f"{path}: data row {idx} {text!r} has {bad[0]!r}, which the 5 x 5 font does not draw; "
                "a string holds the letters A-Z only"
            )
        records.append(
            {"task_id": f"str_build_{idx:04d}", "string": text, "difficulty": _difficulty(row.get("difficulty"))}
        )
    if not records:
        raise UserError(f"{path}: no row with a non-empty string; {expect}")
    return records


def shipped_path() -> Path:
    return packaged(SHIPPED)


def split_strings(dataset: str | None, train_split: str | None, eval_split: str | None) -> dict[str, list[Any]]:
    """``{"train": ..., "eval": ...}``: without splits, the last fifth (at least one) for eval, as the reference's
    ``[:8]`` / ``[8:]`` of its 10 strings; a single string serves both; an empty split is a UserError."""
    from collab.envs.minecraft.tasks import default_splits

    records = load_strings(shipped_path() if dataset is None else dataset)
    defaults = default_splits(len(records))
    out = {}
    for name, spec in (("train", train_split or defaults[0]), ("eval", eval_split or defaults[1])):
        out[name] = select(records, spec)
        if not out[name]:
            raise UserError(
                f"the {name} split {spec!r} of {len(records)} StrBuild strings is empty; pass {name}_split, e.g. '[:]'"
            )
    return out


def string_of(task: Mapping[str, Any]) -> str:
    """A task record's string (checked: letters A-Z, not empty)."""
    text = str(task.get("string", "")).strip() if isinstance(task, Mapping) else ""
    if not text or any(ch not in FONT for ch in text.upper()):
        raise UserError(f"a StrBuild task needs a 'string' of letters A-Z, got {task!r}")
    return text
