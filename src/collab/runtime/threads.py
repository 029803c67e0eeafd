"""A run's threads: how many, and how they wait, chosen once for the cores this process gets.

- **Cores** (:func:`usable_cores`): the CPUs of this process's affinity, fewer when a CPU quota of its cgroup or an
  ancestor allows less (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), the quota rounded up: a thread throttled
  for part of each period still does more than no thread. Lightning counts the affinity alone.
- **Threads** (:func:`choose_threads`): those cores divided among the node's training processes, unless
  ``OMP_NUM_THREADS`` says otherwise; set before Lightning starts the processes, which inherit it.
- **Waiting** (:func:`spin_briefly`): libgomp's threads spin 300,000 times after each parallel region before they
  sleep, holding a core that another process's threads wait for; ``GOMP_SPINCOUNT`` = :data:`SPIN_COUNT` shares
  the machine nearly as well as sleeping at once and costs nothing alone (docs/usage.md, *Threads*, and
  docs/measurements.md have the figures). It must be in the environment before torch is imported, so the
  command-line entries call this first; ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` already set are left alone.

The run prints one line saying what was chosen (:func:`describe`).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
SPIN_COUNT = "1000"
"""libgomp's spins after a parallel region before its thread sleeps (its default: 300,000)."""


def spin_briefly(environ: dict | None = None) -> bool:
    """Set ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` unless a wait is configured or torch (and its OpenMP) is already
    loaded; True when set here."""
    environ = os.environ if environ is None else environ
    if any(name in environ for name in WAIT_VARIABLES) or "torch" in sys.modules:
        return False
    environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    return True


def _quota_v2(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _quota_v1(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period


def cpu_quota(proc_cgroup: str | None = None, root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs that this process's cgroup (or an ancestor) may use per second; None without a quota.
    ``proc_cgroup``: the text of ``/proc/self/cgroup`` (read when None)."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    quotas = []
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            mounts, read = [root], _quota_v2
        elif "cpu" in controllers.split(","):
            mounts, read = [root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu"], _quota_v1
        else:
            continue
        for mount in mounts:
            directory = mount / path.lstrip("/")
            while True:  # the cgroup and each ancestor up to the mount
                quota = read(directory)
                if quota is not None:
                    quotas.append(quota)
                if directory == mount or mount not in directory.parents:
                    break
                directory = directory.parent
    return min(quotas) if quotas else None


def usable_cores() -> tuple[int, str]:
    """This process's cores (the affinity, capped by a CPU quota) and how they were found, in words."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cpu_quota()
    if quota is None or quota >= affinity:
        return affinity, f"{affinity} core{'s' if affinity != 1 else ''} usable"
    cores = max(1, math.ceil(quota))
    return cores, f"{affinity} cores usable, a CPU quota of {quota:g}"


def choose_threads(processes: int = 1) -> tuple[str, Callable[[], None]]:
    """Give each of this node's ``processes`` training processes an equal share of the usable cores (unless
    ``OMP_NUM_THREADS`` is set), for this process now and, through the environment, the processes it starts.
    Returns the line :func:`describe` makes and what puts the thread count and the environment back (a test
    or a notebook that ran the command goes on as before)."""
    import torch

    before = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")

    def restore() -> None:
        torch.set_num_threads(before[0])
        if before[1] is None:
            os.environ.pop("OMP_NUM_THREADS", None)

    cores, found = usable_cores()
    if before[1] is None:
        threads = max(1, cores // max(1, processes))
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
        share = f"{found}, {processes} process{'es' if processes != 1 else ''}"
    else:
        share = f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}; {found}"
    return describe(torch.get_num_threads(), share), restore


def describe(threads: int, share: str) -> str:
    wait = os.environ.get("OMP_WAIT_POLICY")
    spin = os.environ.get("GOMP_SPINCOUNT")
    if wait:
        how = f"OMP_WAIT_POLICY={wait}"
    elif spin:
        how = f"spin {spin} times, then sleep (GOMP_SPINCOUNT)"
    else:
        how = "OpenMP's default wait"
    return f"threads: {threads} a process ({share}); idle threads: {how}"
