"""The expert store, one host buffer, mapped into every stage's GPU.

A layer split runs one CUDA context per GPU, and a decode miss reads its expert zero-copy from
mapped host memory on whichever GPU runs its layer. numba's `mempin` registers a buffer for the
current context only (and a second registration of the same pages fails), so the store is
registered once with the portable flag and each context asks the driver for its own device
address of the same pages. Under the CUDA simulator the buffer itself stands in.
"""

from __future__ import annotations

import time
import weakref

import numpy as np
from numba import cuda

from strata.cuda_kernels.intrinsics import SIMULATED
from strata.engine.cuda.hostmem import MappedHost


class PortableHost:
    """One registration of `buffer` (uint8, C-contiguous) readable from every context."""

    def __init__(self, buffer: np.ndarray):
        if buffer.dtype != np.uint8 or buffer.ndim != 1 or not buffer.flags["C_CONTIGUOUS"]:
            raise ValueError("the host store must be a C-contiguous 1-D uint8 array")
        self.buffer = buffer
        self.seconds = 0.0
        self._ptr = None
        if SIMULATED:
            return
        from numba.cuda.cudadrv import driver as drv

        t0 = time.perf_counter()
        flags = (drv.binding.CU_MEMHOSTREGISTER_PORTABLE
                 | drv.binding.CU_MEMHOSTREGISTER_DEVICEMAP)
        self._ptr = drv.host_pointer(buffer)
        drv.driver.cuMemHostRegister(self._ptr, buffer.nbytes, flags)
        self.seconds = time.perf_counter() - t0

    def mapped(self) -> MappedHost:
        """The buffer as a device array of the CURRENT context (call inside `cuda.gpus[i]`)."""
        if SIMULATED:
            return MappedHost(self.buffer, self.buffer, "host array (simulator)", 0.0)
        from numba.cuda.cudadrv import devicearray
        from numba.cuda.cudadrv import driver as drv

        ctx = cuda.current_context()
        mem = drv.MappedMemory(weakref.proxy(ctx), self._ptr, self.buffer.nbytes)
        dev = devicearray.from_array_like(self.buffer, gpu_data=mem)
        return MappedHost(self.buffer, dev, "registered (mapped, portable)", self.seconds, mem)

    def close(self) -> None:
        if self._ptr is not None:
            from numba.cuda.cudadrv import driver as drv
            drv.driver.cuMemHostUnregister(self._ptr)
            self._ptr = None
