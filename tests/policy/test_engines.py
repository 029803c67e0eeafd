"""The rollout engines from the main environment.

vLLM's CPU build pins transformers below the main environment's, so it lives in ``.venv-vllm`` (``bash
scripts/setup.sh --with-vllm``, which the README's test command and CI run). Here, where ``vllm`` does not
import, the engine tests (``tests/policy/test_vllm_engine.py``) run in that environment as a subprocess and
must all pass, none skipped. The engine's bad-input lines are cases of ``tests/training/test_bad_input.py``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vllm" / "bin" / "python"


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="vllm imports here: pytest runs the engine tests directly"
)
def test_the_vllm_engine_tests_pass_in_the_vllm_environment():
    if not VENV.is_file():
        pytest.skip("no .venv-vllm: make it with bash scripts/setup.sh --with-vllm")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(
        [str(VENV), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/policy/test_vllm_engine.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert re.search(r"\b\d+ passed\b", summary) and "skipped" not in summary and "failed" not in summary, summary
