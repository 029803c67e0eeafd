"""Reading runs for notebooks and reports: TensorBoard scalars as plain Python data."""

from __future__ import annotations

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
