"""benchmarks/main_jobs.py sums the resident memory of a job's whole process tree (a job's children count:
``collab.compare.running.tree_rss``, which its ``TreePeak`` samples): checked on this process with a child that
holds 200 MiB."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HOLD = (
    "import sys, time; block = bytearray(200 * 2**20); sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_the_tree_rss_counts_the_children():
    from collab.compare.running import tree_rss

    alone = tree_rss(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with_child = tree_rss(os.getpid())
        child_alone = tree_rss(child.pid)
    finally:
        child.kill()
        child.wait()
    assert child_alone > 200 * 2**20  # the bytearray is written (zeroed), so resident
    assert with_child - alone > 0.9 * child_alone  # this process's own RSS moves a little between the readings


def spawning(code: str) -> str:
    """A process that starts ``code`` as its child and passes on the child's first line."""
    return (
        "import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', " + repr(code) + "], "
        "stdout=subprocess.PIPE, text=True); sys.stdout.write(child.stdout.readline()); sys.stdout.flush(); "
        "time.sleep(60)"
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_the_children_files_and_the_proc_scan_find_the_same_tree(monkeypatch):
    """A chain of three processes (the last holds 200 MiB): the walk through /proc/<pid>/task/<tid>/children
    finds all three, as the scan of every process's parent (the fallback where the kernel has no children
    files) does."""
    from collab.compare import running

    parent = subprocess.Popen(
        [sys.executable, "-c", spawning(spawning(HOLD))], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert parent.stdout.readline().strip() == "ready"
        walked = running._process_tree(parent.pid)
        monkeypatch.setattr(running, "_children", lambda pid: None)
        scanned = running._process_tree(parent.pid)
        rss = running.tree_rss(parent.pid)
    finally:
        os.killpg(parent.pid, 9)
        parent.wait()
    assert len(walked) == 3 and walked == scanned and parent.pid in walked
    assert rss > 200 * 2**20  # the last process's bytearray counts
