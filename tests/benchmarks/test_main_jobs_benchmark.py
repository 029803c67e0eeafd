"""benchmarks/main_jobs.py sums the resident memory of a job's whole process tree (issue 33's precision: a
job's children count): checked on this process with a child that holds 200 MiB."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.benchmarks import load

HOLD = "import sys, time; block = bytearray(200 * 2**20); sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_the_tree_rss_counts_the_children():
    main_jobs = load("main_jobs")
    alone = main_jobs.tree_rss(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with_child = main_jobs.tree_rss(os.getpid())
        child_alone = main_jobs.tree_rss(child.pid)
    finally:
        child.kill()
        child.wait()
    assert child_alone > 200 * 2**20  # the bytearray is written (zeroed), so resident
    assert with_child - alone > 0.9 * child_alone  # this process's own RSS moves a little between the readings
