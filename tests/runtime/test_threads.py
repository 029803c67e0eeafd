"""A run's threads (collab.runtime.threads): the cores from the affinity and a CPU quota, an equal share per
process, idle OpenMP threads that spin long only while the cores are idle, and the setting put back for whoever
called the command."""

import os
import subprocess
import sys
from pathlib import Path

import torch

from collab.runtime import threads

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_v2_quota_is_the_smallest_of_the_cgroup_and_its_ancestors(tmp_path):
    write(tmp_path / "jobs" / "cpu.max", "250000 100000\n")
    write(tmp_path / "jobs" / "run7" / "cpu.max", "max 100000\n")  # none of its own: the parent's binds
    assert threads.cpu_quota("0::/jobs/run7\n", tmp_path) == 2.5
    write(tmp_path / "jobs" / "run7" / "cpu.max", "150000 100000\n")
    assert threads.cpu_quota("0::/jobs/run7\n", tmp_path) == 1.5
    assert threads.cpu_quota("0::/elsewhere\n", tmp_path) is None


def test_a_v1_quota_is_read_from_the_cpu_controller(tmp_path):
    line = "4:memory:/m\n3:cpu,cpuacct:/slurm/job9\n"
    write(tmp_path / "cpu,cpuacct" / "slurm" / "job9" / "cpu.cfs_quota_us", "-1\n")  # unlimited
    write(tmp_path / "cpu,cpuacct" / "slurm" / "job9" / "cpu.cfs_period_us", "100000\n")
    assert threads.cpu_quota(line, tmp_path) is None
    write(tmp_path / "cpu,cpuacct" / "slurm" / "job9" / "cpu.cfs_quota_us", "300000\n")
    assert threads.cpu_quota(line, tmp_path) == 3.0


def test_a_quota_below_the_affinity_caps_the_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(threads, "cpu_quota", lambda: 1.5)  # rounded up: two threads, throttled in part
    assert threads.usable_cores() == (2, "4 cores usable, a CPU quota of 1.5")
    monkeypatch.setattr(threads, "cpu_quota", lambda: 1.95)  # a 2-core machine's quota just under its cores
    assert threads.usable_cores() == (2, "4 cores usable, a CPU quota of 1.95")
    monkeypatch.setattr(threads, "cpu_quota", lambda: 0.5)
    assert threads.usable_cores() == (1, "4 cores usable, a CPU quota of 0.5")
    monkeypatch.setattr(threads, "cpu_quota", lambda: 8.0)
    assert threads.usable_cores() == (4, "4 cores usable")


def test_each_process_gets_its_share_and_the_setting_is_put_back(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: (4, "4 cores usable"))
    before = torch.get_num_threads()
    line, restore = threads.choose_threads(processes=2)
    try:
        assert torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"  # the started ones too
        assert line.startswith("threads: 2 a process (4 cores usable, 2 processes)")
    finally:
        restore()
    assert torch.get_num_threads() == before and "OMP_NUM_THREADS" not in os.environ
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's word stands
    line, restore = threads.choose_threads(processes=2)
    restore()
    assert "OMP_NUM_THREADS=3" in line and os.environ["OMP_NUM_THREADS"] == "3"


STAT = """cpu  300 0 100 900 0 0 0 0 0 0
cpu0 100 0 50 450 0 0 0 0 0 0
cpu1 200 0 50 450 0 0 0 0 0 0
intr 12345
"""
STAT_LATER = """cpu  560 0 120 1040 20 0 0 0 0 0
cpu0 110 0 50 520 20 0 0 0 0 0
cpu1 390 0 70 450 0 0 0 10 0 0
intr 12400
"""


def test_busy_cores_are_each_cpus_time_not_idle_over_its_time():
    # cpu0: 10 busy in 100 (70 idle, 20 I/O wait); cpu1: 190 user + 20 system + 10 stolen, nothing idle
    assert threads.busy_cores(STAT, STAT_LATER, {0, 1}) == 2 * (10 + 220) / (100 + 220)
    assert threads.busy_cores(STAT, STAT_LATER, {1}) == 1.0  # only this process's CPUs count
    assert threads.busy_cores(STAT, STAT, {0, 1}) == 0.0  # no time passed
    assert 0.0 <= threads.busy_elsewhere(0.05) <= len(os.sched_getaffinity(0))  # this machine's own /proc/stat


def test_the_wait_is_chosen_from_the_load_only_before_torch_and_only_when_unset(monkeypatch):
    assert threads.choose_wait({}, busy=lambda: 0.0, registry=None) is False  # torch is loaded: too late for libgomp
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(threads, "chosen", "")
    monkeypatch.setattr(threads, "cpu_quota", lambda: None)
    for busy, count, why in [
        (0.0, "300000", "cores idle at start, 0.0 busy elsewhere"),
        (0.4, "300000", "cores idle at start, 0.4 busy elsewhere"),
        (0.5, "1000", "0.5 cores busy elsewhere at start"),
        (1.9, "1000", "1.9 cores busy elsewhere at start"),
        (None, "1000", "the cores' load unknown"),
    ]:
        environ = {}
        assert threads.choose_wait(environ, busy=lambda: busy, registry=None) is True
        assert environ == {"GOMP_SPINCOUNT": count}
        monkeypatch.setenv("GOMP_SPINCOUNT", count)  # what the run's own environment then holds
        assert threads.describe(2, "2 cores usable, 1 process") == (
            f"threads: 2 a process (2 cores usable, 1 process); idle threads: spin {count} times, then sleep"
            f" (GOMP_SPINCOUNT; {why})"
        )
    monkeypatch.setattr(threads, "cpu_quota", lambda: 1.5)  # spinning spends a quota, shared or not
    environ = {}
    assert threads.choose_wait(environ, busy=lambda: 0.0, registry=None) is True
    assert environ == {"GOMP_SPINCOUNT": "1000"}
    for mine in ({"GOMP_SPINCOUNT": "10000"}, {"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_NUM_THREADS": "1"}):
        environ = dict(mine)
        assert threads.choose_wait(environ, busy=lambda: 0.0, registry=None) is False and environ == mine


def test_runs_started_together_find_each_other_and_the_dead_are_forgotten(monkeypatch, tmp_path):
    """Each run registers before its look at the load, so two runs idle in their looks at once still see each
    other; a registered pid that no longer runs is removed, not counted."""
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(threads, "chosen", "")
    monkeypatch.setattr(threads, "cpu_quota", lambda: None)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    beside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / str(ended.pid)).touch()
        environ = {}
        assert threads.choose_wait(environ, busy=lambda: 0.0, registry=tmp_path) is True
        assert environ == {"GOMP_SPINCOUNT": "300000"} and threads.chosen.startswith("cores idle at start")
        assert sorted(p.name for p in tmp_path.iterdir()) == [str(os.getpid())]  # registered; the ended one gone
        (tmp_path / str(beside.pid)).touch()  # another run, registered while this one looked
        environ = {}
        assert threads.choose_wait(environ, busy=lambda: 0.0, registry=tmp_path) is True
        assert environ == {"GOMP_SPINCOUNT": "1000"} and threads.chosen == "1 other collab run at start"
    finally:
        beside.kill()
        beside.wait()


def test_the_command_line_spins_briefly_beside_a_busy_process(tmp_path):
    """libgomp prints what it read when it loaded (OMP_DISPLAY_ENV): 1000 spins (its default: 300000) in a process
    started as ``python -m collab.fit`` while another process keeps a core busy."""
    env = {k: v for k, v in os.environ.items() if k not in (*threads.WAIT_VARIABLES, "OMP_NUM_THREADS")}
    env.update(OMP_DISPLAY_ENV="verbose", PYTHONPATH=str(ROOT / "src"))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])]
    try:
        result = subprocess.run(
            [sys.executable, "-m", "collab.fit", "--algo", "magrpo", "--print_config"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert result.returncode == 0, result.stderr[-2000:]
    assert "GOMP_SPINCOUNT = '1000'" in result.stderr, result.stderr[-2000:]


def test_compare_divides_the_usable_cores_among_its_jobs(monkeypatch):
    from collab import compare

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the machine's, not this process's
    monkeypatch.setattr(compare, "usable_cores", lambda: (6, "6 cores usable"))
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    brief = {"GOMP_SPINCOUNT": "1000"}  # runs that share the cores spin briefly, whatever each saw at its start
    assert [compare.job_environment(jobs) for jobs in (1, 2, 4, 8)] == [
        {},
        {"OMP_NUM_THREADS": "3", **brief},
        {"OMP_NUM_THREADS": "1", **brief},
        {"OMP_NUM_THREADS": "1", **brief},
    ]
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert compare.job_environment(2) == {}  # the runs inherit the user's
