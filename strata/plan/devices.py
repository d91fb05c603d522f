"""The devices a plan is made for (plain numbers), byte-size parsing, driver-model defaults."""

from __future__ import annotations

import re
from dataclasses import dataclass

from strata.errors import UsageError

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
DRIVER_MODELS = ("linux", "wddm", "tcc", "mcdm")
# Free VRAM read before this process has a CUDA context (NVML, --gpu-mem) still has to pay for
# the context, its loaded kernels and the driver's own allocations: an estimate (numba's context
# took 527 MiB on an H200; cards with fewer SMs take less), checked by the arena, which re-reads
# free VRAM inside the live context.
CUDA_CONTEXT_BYTES = 512 * MiB
RESERVE_BYTES_DEFAULT = 512 * MiB  # left free after the arena is touched (Linux, TCC)
WDDM_RESERVE_MIN = 1 * GiB  # under WDDM/MCDM: max(1 GiB, 5% of the card) by default
WDDM_RESERVE_SHARE = 0.05


class SizeError(UsageError, ValueError):
    """A byte size the user wrote cannot be read."""


MAP_GRANULE_BYTES = 2 << 20


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One GPU as the planner sees it. `context_bytes` is the VRAM a CUDA context not yet created
    will take: 0 when `free_bytes` was read inside a live context."""

    index: int
    name: str
    free_bytes: int
    total_bytes: int
    driver_model: str = "linux"
    context_bytes: int = CUDA_CONTEXT_BYTES
    # the granule of the driver's address mappings (cuMemGetAllocationGranularity: 2 MiB on
    # every card so far): where KV streams, a layer side's VRAM rows end on one
    map_granule_bytes: int = MAP_GRANULE_BYTES

    def __post_init__(self) -> None:
        if self.driver_model not in DRIVER_MODELS:
            raise ValueError(f"driver model {self.driver_model!r} is not one of "
                             f"{', '.join(DRIVER_MODELS)}")
        if not 0 <= self.free_bytes <= self.total_bytes:
            raise ValueError(f"GPU {self.index}: free {self.free_bytes} B is not within "
                             f"0..total {self.total_bytes} B")
        if self.context_bytes < 0:
            raise ValueError(f"GPU {self.index}: negative context allowance")
        if self.map_granule_bytes < 1:
            raise ValueError(f"GPU {self.index}: mapping granule must be positive")

    @property
    def is_wddm(self) -> bool:
        """Windows display-driver models, where VRAM can be silently paged to system memory."""
        return self.driver_model in ("wddm", "mcdm")


def default_reserve_bytes(device: DeviceInfo) -> int:
    """The reserve when --vram-reserve-mib is not given: larger under WDDM, whose desktop grows
    and whose driver pages instead of failing."""
    if device.is_wddm:
        return max(WDDM_RESERVE_MIN, int(device.total_bytes * WDDM_RESERVE_SHARE) // MiB * MiB)
    return RESERVE_BYTES_DEFAULT


_UNITS = {
    "": None, "b": 1,
    "k": KiB, "kib": KiB, "m": MiB, "mib": MiB, "g": GiB, "gib": GiB, "t": TiB, "tib": TiB,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """'16GiB', '16G' (binary), '12000MiB', '1.5TiB', '16GB' (decimal) -> bytes."""
    m = _SIZE_RE.match(text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise SizeError(f"cannot read {text!r} as a size (examples: 16GiB, 16G, 12000MiB, 1.5TiB)")
    scale = _UNITS[unit]
    if float(m.group(1)) == 0:  # nothing to plan for, whatever the unit (or none)
        raise SizeError(f"size {text!r} must be positive")
    if scale is None:
        raise SizeError(f"size {text!r} needs a unit (examples: 16GiB, 12000MiB)")
    n = int(float(m.group(1)) * scale)
    if n <= 0:
        raise SizeError(f"size {text!r} must be positive")
    return n


def parse_gpu_mem(text: str, *, driver_model: str = "linux") -> list[DeviceInfo]:
    """`--gpu-mem 16GiB[,12GiB...]`: one device per size, free = total = that size."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise SizeError(f"--gpu-mem {text!r}: expected sizes separated by commas, e.g. 16GiB,12GiB")
    devices = []
    for i, p in enumerate(parts):
        try:
            n = parse_size(p)
        except SizeError as e:
            raise SizeError(f"--gpu-mem: {e}") from None
        devices.append(DeviceInfo(i, f"planned {p}", n, n, driver_model))
    return devices


def fmt_bytes(n: int) -> str:
    """Human bytes: '3.73 TiB', '1.50 GiB', '312.0 MiB'."""
    sign, n = ("-" if n < 0 else ""), abs(n)
    if n >= TiB:
        return f"{sign}{n / TiB:.2f} TiB"
    if n >= GiB:
        return f"{sign}{n / GiB:.2f} GiB"
    if n >= MiB:
        return f"{sign}{n / MiB:.1f} MiB"
    return f"{sign}{n / KiB:.1f} KiB"
