"""The memory picture per device, for `/metrics` and the monitor page.

GPU cards pair the engine's own regions — read from the accepted `Plan`, the one definition of
every VRAM byte — with what NVML measures (used and free, all processes). The CPU backend gets
one card with its host regions: the mapped weights and each slot's KV cache.
"""

from __future__ import annotations

import platform
from typing import Any, Callable, Iterable

from strata.serve.metrics import DeviceReport, Region

# index -> (total, used, free) bytes, or None when NVML cannot say
NvmlReader = Callable[[int], "tuple[int, int, int] | None"]


def nvml_memory(index: int) -> tuple[int, int, int] | None:
    """(total, used, free) bytes of GPU `index` from NVML; None where NVML is unavailable."""
    try:
        import pynvml
        pynvml.nvmlInit()
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
        return int(info.total), int(info.used), int(info.free)
    except Exception:  # no driver, no device, no library: the card shows the plan alone
        return None


def cpu_report(weights_bytes: int, engines: Iterable[Any]) -> DeviceReport:
    """The CPU backend's card: mapped weights and the KV caches of every slot's engine."""
    kv = [e.kv.n_bytes for e in engines if hasattr(e, "kv")]
    regions = [Region("weights (mapped)", int(weights_bytes))]
    if kv:
        regions.append(Region(f"kv ({len(kv)} slots)", int(sum(kv))))
    return DeviceReport(device="cpu", label=platform.processor() or platform.machine() or "CPU",
                        regions=tuple(regions))


def plan_reports(plan: Any, *, nvml: NvmlReader = nvml_memory,
                 hit_rates: dict[int, float] | None = None) -> list[DeviceReport]:
    """One card per planned GPU: the plan's regions and layer range, NVML's used/free, the
    expert cache's slots and (when the engine reports it) its hit rate."""
    out = []
    for d in plan.devices:
        index = d.device.index
        mem = nvml(index)
        total, used, free = mem if mem is not None else (None, None, None)
        regions = tuple(Region(name, int(n)) for name, n in d.regions.items() if n)
        out.append(DeviceReport(
            device=f"cuda:{index}", label=d.device.name, regions=regions,
            layers=(int(d.layers[0]), int(d.layers[1])), total_bytes=total, used_bytes=used,
            free_bytes=free, expert_slots=int(d.cache.n_slots),
            expert_hit_rate=(hit_rates or {}).get(index)))
    return out
