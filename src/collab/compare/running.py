"""A cell of ``python -m collab.compare`` run: one subprocess from an empty folder, its process tree's peak
resident memory sampled meanwhile, and the record it leaves.

A cell is done when its record ``<out>/records/<cell>.json`` exists: written (atomically) after its
subprocess ended, successfully or not; a cell without one is run again from an empty folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from collab.compare.grid import Cell, Settings, cell_dir, command, record_path
from collab.runtime.files import atomic_write_text
from collab.runtime.memory import resident_bytes


def _children(pid: int) -> list[int] | None:
    """The child processes of ``pid`` from ``/proc/<pid>/task/<tid>/children`` (a read per thread of ``pid``);
    ``None`` where the kernel has no such files."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # ended
    out: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended
            return None
        except OSError:
            continue
    return out


def _process_tree(root: int) -> set[int]:
    """``root`` and every process below it: the children files where the kernel has them, else one scan of
    every process's parent in ``/proc``."""
    tree, frontier = {root}, [root]
    while frontier:
        below = [_children(pid) for pid in frontier]
        if any(b is None for b in below):
            break
        frontier = [c for b in below for c in b if c not in tree]
        tree.update(frontier)
    else:
        return tree
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    tree, frontier = {root}, [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier and pid not in tree]
        tree.update(frontier)
    return tree


def tree_rss(root: int) -> int:
    """Resident bytes of process ``root`` and every process below it (Linux ``/proc``; 0 elsewhere)."""
    if not os.path.isdir("/proc"):
        return 0
    return sum(resident_bytes(pid) for pid in _process_tree(root))


class TreePeak:
    """``with TreePeak(proc) as peak:`` samples the resident bytes of ``proc`` (a ``Popen``) and its children every
    ``every`` seconds in a thread while the process runs; ``peak.bytes`` is the largest sum seen. The block should end
    with the process (``wait``/``communicate``): leaving it joins the sampler."""

    def __init__(self, proc, every: float = 0.05) -> None:
        self.proc, self.every, self.bytes = proc, every, 0
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while self.proc.poll() is None:
            self.bytes = max(self.bytes, tree_rss(self.proc.pid))
            time.sleep(self.every)

    def __enter__(self) -> "TreePeak":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._thread.join()


@dataclass
class Record:
    """What a cell left: how it ended, its cost and its held-out figures (``score`` after training)."""

    method: str
    kind: str
    env: str
    seed: int
    returncode: int
    wall_s: float
    peak_rss_bytes: int
    command: list[str]
    run_dir: str = ""
    score: float | None = None
    score_se: float | None = None
    before: float | None = None
    gain: float | None = None
    gain_se: float | None = None
    score_key: str = ""
    eval_problems: int | None = None
    eval_samples: int | None = None
    rollouts: int | None = None
    steps: int | None = None
    tokens: int | None = None
    jobs: int = 1
    metrics: dict = field(default_factory=dict)
    before_se: float | None = None


class Running:
    """The cells' subprocesses running now (several with ``--jobs``). ``stop()`` (the grid's Ctrl-C or SIGTERM)
    ends them all; a cell ended so, or not started yet, raises KeyboardInterrupt in :func:`run_cell` and leaves no
    record. ``jobs``: how many run at once (in each record: their wall times shared the machine)."""

    def __init__(self, jobs: int = 1) -> None:
        self.jobs = jobs
        self.procs: set = set()
        self.stopped = False
        self._lock = threading.Lock()

    def start(self, proc) -> None:
        with self._lock:
            self.procs.add(proc)
            if self.stopped:
                proc.terminate()

    def end(self, proc) -> None:
        with self._lock:
            self.procs.discard(proc)

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            procs = list(self.procs)
        for proc in procs:
            proc.terminate()


def run_cell(
    cell: Cell,
    settings: Settings,
    out: Path,
    extra: list[str],
    running: Running | None = None,
    environment: dict[str, str] | None = None,
) -> Record:
    """Run ``cell`` from an empty folder (its output to ``<cell>/log.txt``; ``environment``: what its environment adds),
    sampling the process tree's resident memory every 50 ms; write and return its record."""
    import shutil

    running = running or Running()
    if running.stopped:
        raise KeyboardInterrupt
    folder = cell_dir(out, cell)
    shutil.rmtree(folder, ignore_errors=True)  # a cell killed before its record: from scratch
    folder.mkdir(parents=True)
    cmd = command(cell, settings, out, extra)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(environment or {})}
    start = time.perf_counter()
    with open(folder / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
        running.start(proc)
        with TreePeak(proc) as peak:
            try:
                proc.wait()
            except BaseException:  # Ctrl-C or SIGTERM of the grid: stop the cell too, leave no record
                proc.terminate()
                proc.wait()
                raise
            finally:
                running.end(proc)
    if running.stopped:  # ended by the grid's stop: no record, the cell runs again next time
        raise KeyboardInterrupt
    record = Record(
        cell.method,
        cell.kind,
        cell.env,
        cell.seed,
        proc.returncode,
        time.perf_counter() - start,
        peak.bytes,
        cmd,
        jobs=running.jobs,
    )
    fill(record, folder, settings.score)
    write_record(out, cell, asdict(record))
    return record


def fill(record: Record, folder: Path, score: str | None = None) -> None:
    """The held-out figures and counts of a finished cell: a trained run's ``reward_summary.json``, a
    baseline's metrics (the score: when the grid names one, the mean of that info key at the episodes' last step,
    ``eval/env/<score>`` (else ``eval/<score>``), as the trained runs' evaluation scores it; else ``eval/pass@1``
    where the env reports solved, else ``eval/return``: what the evaluation callback's ``eval/score`` is for
    equal samples per task)."""
    if record.returncode != 0:
        return
    if record.kind == "baseline":
        path = folder / "metrics.json"
        if path.is_file():
            metrics = json.loads(path.read_text())
            if score:  # the mean of the env's last-step info KEY (eval/env/KEY), as the trained runs' evaluation
                key = f"eval/env/{score}" if f"eval/env/{score}" in metrics else f"eval/{score}"
            else:
                key = "eval/pass@1" if "eval/pass@1" in metrics else "eval/return"
            record.metrics, record.score = metrics, metrics.get(key)
            record.score_key = key.removeprefix("eval/").removeprefix("env/")
            record.eval_problems, record.eval_samples = metrics.get("eval/problems"), metrics.get("eval/samples")
        return
    summaries = sorted(folder.glob("*/version_*/reward_summary.json"))
    if not summaries:
        return
    summary = json.loads(summaries[-1].read_text())
    record.run_dir = str(summaries[-1].parent)
    held = summary.get("held_out") or {}
    budget = summary.get("budget") or {}
    record.score, record.score_se, record.before = held.get("after"), held.get("after_se"), held.get("before")
    record.before_se = held.get("before_se")
    record.gain, record.gain_se, record.score_key = held.get("gain"), held.get("gain_se"), held.get("score") or ""
    record.eval_problems, record.eval_samples = held.get("problems"), held.get("samples")
    record.rollouts, record.steps, record.tokens = budget.get("rollouts"), budget.get("steps"), budget.get("tokens")


def write_record(out: Path, cell: Cell, record: dict) -> None:
    """The cell's record, written atomically (its presence means done)."""
    atomic_write_text(record_path(out, cell), json.dumps(record, indent=1))


def read_record(out: Path, cell: Cell) -> dict | None:
    path = record_path(out, cell)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):  # not ours (the write is atomic): run the cell again
        return None
