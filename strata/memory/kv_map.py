"""Streamed KV's memory: per layer and side (K, V), one device address range over the layer's
whole context, its first `resident` tokens' rows backed by VRAM and the others by host memory
(CUDA virtual memory management: a reserved range, device and host physical allocations mapped
into it piece by piece, readable and writable by the GPU).

Why one range: the attention and KV-write kernels index a layer's rows from one pointer, so a
layer whose rows live in two places needs no kernel of its own. Decode reads each key once and
takes the host rows over PCIe as they are (on an H100, 51-52 GB/s in the decode attention
kernel, the same bits as an all-VRAM layer: `bench/probes/kv_vmm.py`); the prompt path, whose
attention reads every key once per block of queries (30x slower over PCIe in that probe),
copies the layer into VRAM first (`strata.engine.cuda.prefill`).

The VRAM rows are the plan's `kv_mapped` region (priced beside the arena, not in it); the host
rows are host memory the plan reports (`kv.host_bytes`). Under the CUDA simulator each range is
a plain device array (there is no driver to map with).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from strata.cuda_kernels.intrinsics import SIMULATED
from strata.errors import StrataError


class KvMapError(StrataError):
    """The driver would not map the streamed KV as planned."""


def _check(res):
    from cuda.bindings import driver as drv
    err, *rest = res if isinstance(res, tuple) else (res,)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise KvMapError(f"mapping the streamed KV: {err.name}")
    return rest[0] if len(rest) == 1 else None


def _prop(host: bool, device: int):
    from cuda.bindings import driver as drv
    p = drv.CUmemAllocationProp()
    p.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.location.type = (drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST if host
                       else drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE)
    p.location.id = device
    return p


def map_granule(device: int = 0) -> int:
    """The driver's mapping granule for device and host memory (the larger of the two)."""
    from cuda.bindings import driver as drv
    flag = drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    return max(int(_check(drv.cuMemGetAllocationGranularity(_prop(h, device), flag)))
               for h in (False, True))


class KvMap:
    """`n_ranges` ranges of `side_bytes` each (a layer side's rows for the whole context), the
    first `resident_bytes` of each in VRAM. `views[i]`: uint8 [side_bytes] device array of range
    i. `close()` unmaps and frees (also on a failure part way)."""

    def __init__(self, n_ranges: int, side_bytes: int, resident_bytes: int, *, device: int = 0):
        if not 0 <= resident_bytes < side_bytes or n_ranges < 1:
            raise ValueError(f"streamed KV: {n_ranges} ranges of {side_bytes} B, "
                             f"{resident_bytes} B of each in VRAM")
        self.n_ranges, self.side_bytes, self.resident_bytes = n_ranges, side_bytes, resident_bytes
        self.host_bytes = 0
        self.views: list[Any] = []
        self._ptr = self._size = 0
        self._handles: list[Any] = []
        self._mapped: list[tuple[int, int]] = []
        if SIMULATED:
            self.how = "device arrays (simulator)"
            self.views = [cuda.device_array(side_bytes, np.uint8) for _ in range(n_ranges)]
            return
        try:
            self._map(device)
        except BaseException:
            self.close()
            raise
        self.how = "VRAM rows, then host rows, in one address range per layer side"

    def _map(self, device: int) -> None:
        from cuda.bindings import driver as drv
        from numba.cuda.cudadrv import devicearray
        from numba.cuda.cudadrv import driver as nbdrv

        g = map_granule(device)
        if self.resident_bytes % g:
            raise KvMapError(f"the plan's VRAM rows of a layer side ({self.resident_bytes} B) "
                             f"are not a multiple of this driver's mapping granule ({g} B)")
        host = -(-(self.side_bytes - self.resident_bytes) // g) * g  # padded to the granule
        span = self.resident_bytes + host
        self._size = span * self.n_ranges
        self._ptr = int(_check(drv.cuMemAddressReserve(self._size, 0, 0, 0)))
        # a physical allocation per piece: the driver maps an allocation whole (offset 0; an
        # offset into a larger one was CUDA_ERROR_NOT_SUPPORTED on an H100, R580)
        for i in range(self.n_ranges):
            at = self._ptr + i * span
            if self.resident_bytes:
                self._map_piece(at, self.resident_bytes, False, device)
            self._map_piece(at + self.resident_bytes, host, True, device)
        self.host_bytes = host * self.n_ranges
        acc = drv.CUmemAccessDesc()
        acc.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        acc.location.id = device
        acc.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        _check(drv.cuMemSetAccess(self._ptr, self._size, [acc], 1))
        ctx = cuda.current_context()
        for i in range(self.n_ranges):
            mp = nbdrv.MemoryPointer(ctx, drv.CUdeviceptr(self._ptr + i * span), self.side_bytes)
            self.views.append(devicearray.DeviceNDArray((self.side_bytes,), (1,), np.uint8,
                                                        gpu_data=mp))

    def _map_piece(self, at: int, n: int, host: bool, device: int) -> None:
        from cuda.bindings import driver as drv
        handle = _check(drv.cuMemCreate(n, _prop(host, device), 0))
        self._handles.append(handle)
        _check(drv.cuMemMap(at, n, 0, handle, 0))
        self._mapped.append((at, n))

    def close(self) -> None:
        """Unmap and free everything (idempotent)."""
        self.views = []
        if SIMULATED or not self._ptr:
            return
        from cuda.bindings import driver as drv
        cuda.synchronize()
        for at, n in self._mapped:
            drv.cuMemUnmap(at, n)
        for h in self._handles:
            drv.cuMemRelease(h)
        drv.cuMemAddressFree(self._ptr, self._size)
        self._mapped, self._handles, self._ptr = [], [], 0
