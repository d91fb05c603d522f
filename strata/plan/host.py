"""Host memory a GPU run takes: the expert store (every expert, pinned, read by decode misses and
the prompt path; `strata.experts.store`) and whether this machine has it.

The VRAM plan decides every GPU byte; the store is the one large host allocation beside it, and
it is new memory that is then page-locked: a store past what the machine can give is not a slow
run but a process the kernel kills mid-load (Linux's OOM killer) or a desktop that pages
everything else out. So its size is priced here, from the shape alone, and checked against the
memory the OS says is available (free plus reclaimable: the model file's own page cache counts,
since the fill can evict it) before a byte is allocated.

`store_bytes` is pure; `probe_host_memory` asks the OS (Linux /proc/meminfo and the process's
memory cgroup, Windows GlobalMemoryStatusEx, else POSIX sysconf for the total alone).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from strata.gguf.shape import ModelShape
from strata.plan.devices import fmt_bytes

STORE_ALIGN = 256  # every blob of the store starts on this boundary (the kernels' vector loads)


def _align(n: int, a: int = STORE_ALIGN) -> int:
    return -(-n // a) * a


def store_bytes(shape: ModelShape, embd_on_host: bool, experts: bool = True) -> int:
    """Bytes of the host expert store of `shape`: each layer's blobs (gate | up | down, the
    plan's slot size) aligned, times the experts (where the store keeps them: `keeps_experts`),
    then token_embd's bytes where the plan looks it up in host memory."""
    n = 0
    if experts:
        n = sum(_align(shape.expert_slot_bytes(il)) * shape.n_expert
                for il in range(shape.n_layer))
    if embd_on_host:
        n += _align(shape.tensors["token_embd.weight"].n_bytes)
    return n


def keeps_experts(n_slots: int, n_pairs: int, prompt_mode: str | None, lend_slots: int,
                  adaptive: bool = False) -> bool:
    """Whether a single-GPU run's store must hold the experts: unless its VRAM cache holds every
    (layer, expert) pair, its prompt path owns its buffers (never borrowing slots, so nothing is
    evicted and refilled) and the cache never re-ranks (`--adaptive-cache`) — then no expert is
    ever read from host memory, and the cache is filled straight from the model file. A 30B
    Q4_K_M with 22 GiB of VRAM free then takes no 17.7 GB of page-locked memory."""
    return n_slots < n_pairs or prompt_mode == "borrowed" or lend_slots > 0 or adaptive


@dataclass(frozen=True, slots=True)
class HostMemory:
    """This machine's memory as the OS reports it; available None where it does not say."""

    total_bytes: int
    available_bytes: int | None


def probe_host_memory() -> HostMemory | None:
    """The machine's total and available memory, or None where neither can be read."""
    try:
        if sys.platform.startswith("linux"):
            return _linux()
        if sys.platform == "win32":
            return _windows()
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return HostMemory(int(total), None)
    except (OSError, ValueError, AttributeError):
        return None


def _linux(meminfo: str = "/proc/meminfo", cgroup: tuple[str, str] | None = None) -> HostMemory:
    """/proc/meminfo's figures, the available one capped by the memory cgroup (`cgroup_room`;
    `cgroup`: its (root, proc) paths, a test's stand-ins)."""
    fields = {}
    with open(meminfo, encoding="ascii") as f:
        for line in f:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                fields[name] = int(parts[0]) * 1024  # kB
    total = fields["MemTotal"]
    avail = fields.get("MemAvailable")  # kernels before 3.14 lack it
    if avail is None and "MemFree" in fields:
        avail = fields["MemFree"] + fields.get("Cached", 0)
    room = cgroup_room(*cgroup) if cgroup else cgroup_room()
    if room is not None:  # a container's limit: /proc/meminfo shows the whole machine
        avail = room if avail is None else min(avail, room)
    return HostMemory(total, avail)


def _read(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read().strip()


def _stat(path: str, key: str) -> int:
    for line in _read(path).splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def cgroup_room(root: str = "/sys/fs/cgroup", proc: str = "/proc/self/cgroup") -> int | None:
    """Bytes this process's memory cgroup still lets it take (Docker's, Kubernetes', systemd's
    limits), or None without a limit or where none can be read: the limit less the usage, plus
    the inactive file pages the usage counts (the page cache, which the kernel reclaims within
    the limit before it kills). cgroup v1 (memory.limit_in_bytes) or v2 (memory.max), at the
    path /proc/self/cgroup names, or at the root where a container mounts its own there."""
    try:
        lines = _read(proc).splitlines()
    except OSError:
        return None
    v1 = v2 = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    places = []
    if v1 is not None:  # a memory controller on v1 (hybrid hosts too) holds the limit
        places += [(f"{root}/memory{v1}", True), (f"{root}/memory", True)]
    if v2 is not None:
        places += [(f"{root}{v2}", False), (root, False)]
    for base, is_v1 in places:
        limit_file, usage_file, inactive = (
            ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file") if is_v1
            else ("memory.max", "memory.current", "inactive_file"))
        try:
            limit = _read(f"{base}/{limit_file}")
            if limit == "max":
                return None
            usage = int(_read(f"{base}/{usage_file}"))
            reclaimable = _stat(f"{base}/memory.stat", inactive)
        except (OSError, ValueError):
            continue
        return max(0, int(limit) - usage + reclaimable)
    return None


def _windows() -> HostMemory:
    import ctypes

    class MemoryStatusEx(ctypes.Structure):
        _fields_ = [("dwLength", ctypes.c_ulong), ("dwMemoryLoad", ctypes.c_ulong),
                    ("ullTotalPhys", ctypes.c_ulonglong), ("ullAvailPhys", ctypes.c_ulonglong),
                    ("ullTotalPageFile", ctypes.c_ulonglong),
                    ("ullAvailPageFile", ctypes.c_ulonglong),
                    ("ullTotalVirtual", ctypes.c_ulonglong),
                    ("ullAvailVirtual", ctypes.c_ulonglong),
                    ("ullAvailExtendedVirtual", ctypes.c_ulonglong)]

    st = MemoryStatusEx()
    st.dwLength = ctypes.sizeof(MemoryStatusEx)
    if not ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(st)):  # type: ignore[attr-defined]
        raise OSError("GlobalMemoryStatusEx failed")
    return HostMemory(int(st.ullTotalPhys), int(st.ullAvailPhys))


def store_shortfall(n_bytes: int, mem: HostMemory | None) -> str | None:
    """Why a store of n_bytes cannot be allocated on this machine, or None where it can (or
    where the OS does not say: nothing to check against)."""
    if mem is None:
        return None
    have, what = ((mem.available_bytes, "available") if mem.available_bytes is not None
                  else (mem.total_bytes, "in all"))
    if n_bytes <= have:
        return None
    return (f"the expert store needs {fmt_bytes(n_bytes)} of host memory (every expert, "
            f"page-locked, for decode misses and the prompt path), but this machine has "
            f"{fmt_bytes(have)} {what} of {fmt_bytes(mem.total_bytes)}: close other programs, "
            f"or run a smaller quantization of the model (or the CPU backend, which reads the "
            f"experts from the file)")
