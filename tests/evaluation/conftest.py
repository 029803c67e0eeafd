"""Fixtures of the evaluation tests."""

from __future__ import annotations

import pytest

from tests.support.notebook_kernel import write_kernel


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """A ``python3`` kernelspec running this interpreter with ``src`` importable, first on ``$JUPYTER_PATH``."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("JUPYTER_PATH", str(write_kernel(tmp_path)))
    return tmp_path
