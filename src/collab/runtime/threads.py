"""A run's threads: how many, and how they wait, chosen once for the cores this process gets.

- **Cores** (:func:`usable_cores`): the CPUs of this process's affinity, fewer when a CPU quota of its cgroup or an
  ancestor allows less (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), the quota rounded up: a thread throttled
  for part of each period still does more than no thread. Lightning counts the affinity alone.
- **Threads** (:func:`choose_threads`): those cores divided among the node's training processes, unless
  ``OMP_NUM_THREADS`` says otherwise; set before Lightning starts the processes, which inherit it.
- **Waiting** (:func:`choose_wait`): after each parallel region libgomp's threads spin 300,000 times before they
  sleep. Alone on its cores a run wants that (on the quick start's 2 cores a step took ~20 s against ~27 s with
  1,000 spins: the threads sleep between a decoding step's small products and must be woken again); beside
  another busy process the spinning threads hold the cores the other's threads wait for (the quick start's
  evaluation 119 s against 65 s with 1,000 spins). So the wait is chosen from the cores' load at start: when other
  processes keep at least :data:`BUSY` of a core busy over a short look at ``/proc/stat``, when another collab run
  is alive (:func:`register`: two runs started together are both idle while they look), or when a CPU quota is
  spent by spinning, ``GOMP_SPINCOUNT`` = :data:`SPIN_COUNT`; otherwise libgomp's own. It must be in the
  environment before torch is imported, so the command-line entries call this first; ``OMP_WAIT_POLICY`` or
  ``GOMP_SPINCOUNT`` already set are left alone, and so are runs of one thread (``OMP_NUM_THREADS=1``) and runs
  started in a process that imported torch.

The run prints one line saying what was chosen (:func:`describe`).
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
SPIN_COUNT = "1000"
"""libgomp's spins after a parallel region before its thread sleeps when the cores are shared."""
LIBGOMP_SPIN_COUNT = "300000"
"""libgomp's own count, kept when the cores are idle."""
BUSY = 0.5
"""Cores kept busy by other processes, at or above which this run's threads spin briefly."""
LOOK = 0.3
"""Seconds the cores' load is looked at before the choice."""
RUNS = Path(tempfile.gettempdir()) / f"collab-runs-{os.getuid()}"
"""Where the collab runs of this user that chose their wait are registered, a file named by each one's pid."""
chosen = ""
"""Why the wait is what it is, in words, once :func:`choose_wait` chose it in this process."""


def register(folder: Path = RUNS) -> None:
    """Register this process as a run (its pid's file in ``folder``, removed at exit; a run killed before that
    leaves one that :func:`others_running` removes)."""
    mine = folder / str(os.getpid())
    try:
        folder.mkdir(exist_ok=True)
        mine.touch()
    except OSError:  # a folder of the name that another user made: the look at the load still counts
        return
    atexit.register(mine.unlink, missing_ok=True)


def others_running(folder: Path = RUNS) -> int:
    """Registered runs other than this process that are alive."""
    alive = 0
    for entry in folder.glob("*") if folder.is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            os.kill(int(entry.name), 0)
        except ProcessLookupError:
            entry.unlink(missing_ok=True)
            continue
        except PermissionError:  # alive, another user's pid now
            pass
        alive += 1
    return alive


def busy_cores(before: str, after: str, cpus: set[int]) -> float:
    """Cores of ``cpus`` busy between two readings of ``/proc/stat`` (``before``, ``after``): each CPU's time
    that was neither idle nor waiting for I/O, over all its time; time stolen by a hypervisor counts as busy."""

    def times(text: str) -> tuple[int, int]:
        busy = total = 0
        for line in text.splitlines():
            name, *fields = line.split()
            if name[:3] == "cpu" and name[3:].isdigit() and int(name[3:]) in cpus:
                user, nice, system, idle, iowait, irq, softirq, steal = (int(f) for f in fields[:8])
                total += user + nice + system + idle + iowait + irq + softirq + steal
                busy += user + nice + system + irq + softirq + steal
        return busy, total

    (busy0, total0), (busy1, total1) = times(before), times(after)
    return len(cpus) * (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0


def busy_elsewhere(look: float = LOOK) -> float | None:
    """Cores of this process's affinity that other processes keep busy, over ``look`` seconds in which this one
    sleeps; None where ``/proc/stat`` cannot be read."""
    import time

    stat = Path("/proc/stat")
    try:
        before = stat.read_text()
        time.sleep(look)
        after = stat.read_text()
    except OSError:
        return None
    return busy_cores(before, after, affinity())


def choose_wait(
    environ: dict | None = None,
    busy: Callable[[], float | None] = busy_elsewhere,
    registry: Path | None = RUNS,
) -> bool:
    """Set ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` when the cores are shared (``busy()`` cores busy elsewhere, at
    least :data:`BUSY`; another live run in ``registry``, this one registered there before the look; a CPU
    quota) and to libgomp's own count when they are not, unless a wait is configured or torch (and its OpenMP) is
    already loaded, or the run has one thread (no other thread waits); True when set here. :data:`chosen` says
    why."""
    global chosen
    environ = os.environ if environ is None else environ
    configured = any(name in environ for name in WAIT_VARIABLES) or environ.get("OMP_NUM_THREADS") == "1"
    if configured or "torch" in sys.modules:
        return False
    if registry is not None:
        register(registry)
    if cpu_quota() is not None:  # no look needed: spinning would spend the quota, shared or not
        environ["GOMP_SPINCOUNT"], chosen = SPIN_COUNT, "a CPU quota, which spinning would spend"
        return True
    elsewhere = busy()
    beside = 0 if registry is None else others_running(registry)
    if beside:
        count, chosen = SPIN_COUNT, f"{beside} other collab run{'s' if beside > 1 else ''} at start"
    elif elsewhere is None:
        count, chosen = SPIN_COUNT, "the cores' load unknown"
    elif elsewhere >= BUSY:
        count, chosen = SPIN_COUNT, f"{elsewhere:.1f} cores busy elsewhere at start"
    else:
        count, chosen = LIBGOMP_SPIN_COUNT, f"cores idle at start, {elsewhere:.1f} busy elsewhere"
    environ["GOMP_SPINCOUNT"] = count
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


def affinity() -> set[int]:
    """The CPUs this process may run on."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def usable_cores() -> tuple[int, str]:
    """This process's cores (the affinity, capped by a CPU quota) and how they were found, in words."""
    cpus = len(affinity())
    quota = cpu_quota()
    if quota is None or quota >= cpus:
        return cpus, f"{cpus} core{'s' if cpus != 1 else ''} usable"
    cores = max(1, math.ceil(quota))
    return cores, f"{cpus} cores usable, a CPU quota of {quota:g}"


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
        how = f"spin {spin} times, then sleep (GOMP_SPINCOUNT{'; ' + chosen if chosen else ''})"
    else:
        how = "OpenMP's default wait"
    return f"threads: {threads} a process ({share}); idle threads: {how}"
