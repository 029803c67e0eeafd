"""HouseBuild task records: loading, checking and splitting (CoLLM, Section 5.1 and Appendix C.1).

A record (the format of the HouseBuild data) has ``task_id``, ``inventory`` (letter -> block name,
``"A": "air"`` included), ``target_spec`` (``{"type": "y_layers", "size": [X, Y, Z], "layers":
[{"y": int, "rows": [Z strings of X letters]}]}``) and optionally ``bbox`` (``{"from": [x, y, z],
"to": [x, y, z]}``, inclusive, ``to - from + 1 == size``; ``null`` or absent: from the origin) and
``count`` (letter counts; not needed, not checked). Layers not listed are air. Every problem with a
record is a :class:`~collab.errors.UserError` of one line naming the record and the field.

The authors publish the paper's 10 tasks as ``house_build/dataset/data.json`` of
https://github.com/OpenMLRL/LLM_Collab_Minecraft; ``dataset: housebuild:PATH`` reads that file
(:mod:`collab.envs.published`). BoxBuilder is the task's earlier name there: its ``dataset/box_builder/data.json``
(removed when the task was renamed) has the same records with the legend named ``palette``, read as ``inventory``
(a plain path or ``boxbuilder:PATH``). Splits: the paper trains on HouseBuild[0:8] and evaluates on HouseBuild[8:10]
(C.1). Without ``train_split`` / ``eval_split``, a file keeps its last fifth (at least one record) for eval and the
rest for train (10 records: ``[0:8]`` / ``[8:10]``); the shipped houses
(``collab/data/housebuild/houses.json``, 12 small houses made for collab) split ``[0:8]`` / ``[8:12]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from collab.envs.minecraft.world import AIR, House, grid_from_layers, normalize_block
from collab.envs.published import read_published, split_source
from collab.envs.records import check_fields, load_records, packaged, select
from collab.errors import UserError, require

REQUIRED = ("task_id", "inventory", "target_spec")
SHIPPED = "housebuild/houses.json"
SHIPPED_SPLITS = ("[0:8]", "[8:12]")


def _vec(value: Any, what: str) -> tuple[int, int, int]:
    ok = (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )
    require(ok, f"{what} must be a list of 3 integers, got {value!r}")
    return tuple(value)  # type: ignore[return-value]


def _legend(inventory: Any, where: str) -> tuple[tuple[str, str], ...]:
    require(
        isinstance(inventory, Mapping) and len(inventory) > 0,
        f"{where}: 'inventory' must be an object letter -> block name, got {inventory!r}",
    )
    legend = []
    for letter, block in inventory.items():
        require(
            isinstance(letter, str) and len(letter) == 1 and isinstance(block, str) and normalize_block(block),
            f"{where}: inventory entry {letter!r}: {block!r} must map one letter to a block name",
        )
        legend.append((letter, normalize_block(block)))
    return tuple(legend)


def _layers(spec: Mapping[str, Any], size: tuple[int, int, int], letters: set[str], where: str) -> dict[int, list[str]]:
    sx, sy, sz = size
    layers = spec.get("layers")
    require(isinstance(layers, list), f"{where}: target_spec.layers must be a list of {{'y', 'rows'}} objects")
    out: dict[int, list[str]] = {}
    for i, item in enumerate(layers):
        require(
            isinstance(item, Mapping) and "y" in item and "rows" in item,
            f"{where}: target_spec.layers[{i}] must have 'y' and 'rows'",
        )
        y, rows = item["y"], item["rows"]
        require(
            isinstance(y, int) and 0 <= y < sy and y not in out,
            f"{where}: layer {i} has y={y!r}; expected a distinct integer in 0..{sy - 1}",
        )
        require(
            isinstance(rows, list) and len(rows) == sz,
            f"{where}: layer y={y} must have {sz} rows (size Z), got {len(rows) if isinstance(rows, list) else rows!r}",
        )
        for z, row in enumerate(rows):
            require(
                isinstance(row, str) and len(row) == sx,
                f"{where}: layer y={y} row {z} must be a string of {sx} letters (size X), got {row!r}",
            )
            bad = sorted(set(row) - letters)
            if bad:
                raise UserError(
                    f"{where}: layer y={y} row {z} uses {bad[0]!r}, not in the inventory ({', '.join(sorted(letters))})"
                )
        out[y] = rows
    return out


def house_from_record(record: Mapping[str, Any], where: str = "task") -> House:
    """A checked :class:`House` from one record (see the module docstring for the format)."""
    require(isinstance(record, Mapping), f"{where}: expected an object with fields {', '.join(REQUIRED)}")
    missing = [f for f in REQUIRED if f not in record]
    if missing:
        raise UserError(
            f"{where}: no {missing[0]!r} field (it has: {', '.join(sorted(record)) or 'none'}); "
            f"required: {', '.join(REQUIRED)}"
        )
    where = f"{where} ({record['task_id']})"
    legend = _legend(record["inventory"], where)
    spec = record["target_spec"]
    require(
        isinstance(spec, Mapping) and spec.get("type") == "y_layers",
        f"{where}: target_spec.type must be 'y_layers', "
        f"got {spec.get('type') if isinstance(spec, Mapping) else spec!r}",
    )
    size = _vec(spec.get("size"), f"{where}: target_spec.size")
    require(
        all(s >= 1 for s in size) and size[0] * size[1] * size[2] <= 4096,
        f"{where}: target_spec.size {list(size)} must be positive with at most 4096 voxels",
    )
    origin = (0, 0, 0)
    bbox = record.get("bbox")
    if bbox is not None:
        require(isinstance(bbox, Mapping), f"{where}: bbox must be {{'from': [x, y, z], 'to': [x, y, z]}} or null")
        lo, hi = _vec(bbox.get("from"), f"{where}: bbox.from"), _vec(bbox.get("to"), f"{where}: bbox.to")
        origin = tuple(min(a, b) for a, b in zip(lo, hi))  # type: ignore[assignment]
        span = [abs(b - a) + 1 for a, b in zip(lo, hi)]
        require(span == list(size), f"{where}: bbox spans {span} blocks but target_spec.size is {list(size)}")
    palette = (AIR,) + tuple(dict.fromkeys(b for _, b in legend if b != AIR))
    require(len(palette) <= 255, f"{where}: at most 254 distinct blocks, got {len(palette) - 1}")
    ids = {letter: palette.index(block) for letter, block in legend}
    layers = _layers(spec, size, set(ids), where)
    return House(
        task_id=str(record["task_id"]),
        legend=legend,
        size=size,
        origin=origin,  # type: ignore[arg-type]
        palette=palette,
        target=grid_from_layers(size, layers, ids),
    )


def from_boxbuilder(record: Any) -> Any:
    """A BoxBuilder record as a HouseBuild one: BoxBuilder, HouseBuild's earlier name in the authors' repository
    (``dataset/box_builder/data.json``), calls the legend ``palette``; every other field is the same."""
    if isinstance(record, Mapping) and "palette" in record and "inventory" not in record:
        return {("inventory" if k == "palette" else k): v for k, v in record.items()}
    return record


def load_houses(path: str | Path) -> list[dict[str, Any]]:
    """The records of a HouseBuild ``.json`` / ``.jsonl`` file (BoxBuilder's too: :func:`from_boxbuilder`), or of
    ``housebuild:PATH`` / ``boxbuilder:PATH`` (the authors' files, with a missing file's error naming where each is
    published), each checked by :func:`house_from_record`."""
    name, source = split_source(str(path), ("housebuild", "boxbuilder"))
    records = [from_boxbuilder(r) for r in (read_published(name, source) if name else load_records(path))]
    check_fields(records, REQUIRED, str(path))
    require(len(records) > 0, f"{path}: no HouseBuild records")
    for i, record in enumerate(records):
        house_from_record(record, f"{path}: record {i}")
    return records


def shipped_path() -> Path:
    """The houses shipped with collab."""
    return packaged(SHIPPED)


def default_splits(n: int) -> tuple[str, str]:
    """``[0:n - k]`` / ``[n - k:n]`` with ``k = max(1, n // 5)``; a single record serves both splits."""
    if n <= 1:
        return "[:]", "[:]"
    k = max(1, n // 5)
    return f"[0:{n - k}]", f"[{n - k}:{n}]"


def split_houses(
    dataset: str | None, train_split: str | None, eval_split: str | None
) -> dict[str, list[dict[str, Any]]]:
    """``{"train": ..., "eval": ...}`` of ``dataset`` (``None``: the shipped houses) by slice strings (``"[0:8]"``);
    an empty split is a UserError."""
    records = load_houses(shipped_path() if dataset is None else dataset)
    defaults = SHIPPED_SPLITS if dataset is None else default_splits(len(records))
    out = {"train": select(records, train_split or defaults[0]), "eval": select(records, eval_split or defaults[1])}
    for name, spec in (("train", train_split or defaults[0]), ("eval", eval_split or defaults[1])):
        if not out[name]:
            raise UserError(
                f"the {name} split {spec!r} of {len(records)} HouseBuild records is empty; "
                f"pass {name}_split, e.g. '[:]' for every record"
            )
    return out
