"""A process's resources from Linux's /proc: resident memory, its peak, CPU time, open files.

The harness that tests and benchmarks share to watch a running `llmtap serve` (tests/faultkit.py,
benchmarks/overhead_procs.py, benchmarks/soak.py); `pid` may be "self".
"""

from __future__ import annotations

import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _status_kib(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(f"no {field} for process {pid}")


def rss_kib(pid: int | str = "self") -> int:
    """Resident memory now (VmRSS)."""
    return _status_kib(pid, "VmRSS")


def peak_rss_kib(pid: int | str = "self") -> int:
    """The highest resident memory since `reset_peak` (VmHWM)."""
    return _status_kib(pid, "VmHWM")


def reset_peak(pid: int | str = "self") -> int:
    """Start measuring the peak from now (5 > /proc/<pid>/clear_refs); returns RSS now."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return rss_kib(pid)


def open_fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def children(pid: int) -> list[int]:
    """pid and its children (nginx's worker)."""
    pids = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                pids.extend(int(c) for c in f.read().split())
    except OSError:
        pass
    return pids


def cpu_times(pids: list[int]) -> tuple[float, float]:
    """(utime, stime) of the processes (all their threads), in seconds; a process gone counts 0."""
    user = system = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user += int(fields[11])  # fields 14 and 15 of stat(5)
        system += int(fields[12])
    return user / CLK_TCK, system / CLK_TCK
