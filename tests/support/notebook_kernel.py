"""What the notebook tests share: a Jupyter kernel for this interpreter, and reading a PNG's size."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG file, checking its signature and header chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def write_kernel(folder: Path) -> Path:
    """A ``python3`` kernelspec under ``folder/jupyter`` running this interpreter with ``src`` importable and the
    inline matplotlib backend; put the returned folder first on ``$JUPYTER_PATH``."""
    spec = folder / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
           "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "collab test kernel", "language": "python", "env": env}))
    return folder / "jupyter"
