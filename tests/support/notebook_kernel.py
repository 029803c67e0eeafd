"""What the notebook tests share: a Jupyter kernel for this interpreter, running a notebook, a PNG's size."""

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
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    }
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "collab test kernel",
                "language": "python",
                "env": env,
            }
        )
    )
    return folder / "jupyter"


def execute(name: str, cwd: Path, runs: Path, figures: Path, monkeypatch) -> list[str]:
    """Run ``notebooks/<name>.ipynb`` in ``cwd``; the text of its outputs (streams, plain text, markdown)."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("COLLAB_RUNS", str(runs))
    monkeypatch.setenv("COLLAB_FIGURES", str(figures))
    monkeypatch.delenv("COLLAB_TABLE", raising=False)
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    return [
        o.text if o.output_type == "stream" else o.data.get("text/plain", "") + o.data.get("text/markdown", "")
        for o in outputs
        if o.output_type in ("stream", "display_data", "execute_result")
    ]
