"""What the host's CPUs are, asked in ways every OS Strata runs on answers: Linux's affinity
mask and load average have no Windows counterparts (`os.sched_getaffinity` and `os.getloadavg`
are missing there, and calling them raised on a Windows desktop)."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask where the OS has one (Linux; a
    container or `taskset` narrows it), else every logical CPU (Windows, macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, rounded; None where the OS keeps none (Windows)."""
    if not hasattr(os, "getloadavg"):
        return None
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:  # the OS could not say
        return None
