"""Files replaced whole: a reader, or a run killed while writing (SIGKILL), sees the previous version or the
new one, never a truncated one."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename: a reader (or a
    run killed meanwhile) sees the old file or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def replace_folder(folder: str | Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` fills a temporary sibling folder, which then replaces ``folder``: ``folder`` is
    always the previous complete version or the new one (for the instant between the two renames,
    the previous one is ``<folder>.old``)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
    for leftover in (tmp, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    write(tmp)
    if folder.exists():
        os.replace(folder, old)
    os.replace(tmp, folder)
    if old.exists():
        shutil.rmtree(old)
