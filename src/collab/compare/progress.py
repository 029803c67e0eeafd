"""The progress display of ``python -m collab.compare``: ``run i of N`` lines with the time left, written to
``compare.log`` and to stdout, and the wall clock's ``m:ss`` / ``h:mm:ss``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from collab.compare.grid import Cell


class Progress:
    """``run i of N`` lines with the time left, to ``compare.log`` always and to stdout: redrawn in place on a
    terminal (with the current run's elapsed time), one plain line each otherwise. The time left is the
    remaining runs' mean wall time of their kind (trained or baseline) from the records so far."""

    def __init__(self, log: Path, stream=None, jobs: int = 1) -> None:
        self.log, self.stream, self.jobs = log, stream or sys.stdout, jobs
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.walls: dict[str, list[float]] = {"train": [], "baseline": []}

    def add(self, record: dict) -> None:
        self.walls["baseline" if record["kind"] == "baseline" else "train"].append(float(record["wall_s"]))

    def left(self, remaining: list[Cell]) -> str:
        every = [w for ws in self.walls.values() for w in ws]
        if not every:
            return "time left unknown"
        mean = {k: sum(ws) / len(ws) if ws else sum(every) / len(every) for k, ws in self.walls.items()}
        seconds = sum(mean["baseline" if c.kind == "baseline" else "train"] for c in remaining) / self.jobs
        return f"about {clock_time(seconds)} left"

    def line(self, text: str, transient: bool = False) -> None:
        if not transient:
            with self.log.open("a") as f:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
        if self.tty:
            self.stream.write("\r\033[K" + text + ("" if transient else "\n"))
            self.stream.flush()
        elif not transient:
            print(text, file=self.stream, flush=True)


def clock_time(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )
