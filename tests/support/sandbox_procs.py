"""The live processes of this process's sandbox runs, for the sandbox tests' leak checks."""

from __future__ import annotations

import os

from collab.sandbox.processes import own_uids


def sandbox_pids() -> list[int]:
    """Live processes (not zombies waiting for init to reap them) with any uid (real, effective, saved, fs) among
    this process's sandbox uids (:func:`~collab.sandbox.processes.own_uids`; another pytest worker's runs are its
    own)."""
    uids, pids = own_uids(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if line[:4] in ("Stat", "Uid:"))
        except OSError:
            continue
        if any(int(u) in uids for u in fields["Uid"].split()) and not fields["State"].strip().startswith("Z"):
            pids.append(int(pid))
    return pids
