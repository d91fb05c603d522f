"""The expert store, one host buffer, mapped into every stage's GPU.

A layer split runs one CUDA context per GPU, and a decode miss reads its expert zero-copy from
mapped host memory on whichever GPU runs its layer. numba's `mempin` registers a buffer for the
current context only (and a second registration of the same pages fails), so the store is
registered once with the portable flag and each context asks the driver for its own device
address of the same pages. Under the CUDA simulator the buffer itself stands in.

Teardown: the registration must end before the buffer's pages go back to the allocator (a
numpy buffer of gigabytes is an mmap that is unmapped when its last reference goes; unmapping
registered pages, then letting the driver unpin them at process exit, is what corrupted the
heap at a split bench's exit). So the registration holds a reference to the buffer, and ends
exactly once: at `close()`, or else from a finalizer that runs at garbage collection or in
Python's exit hooks, before module teardown frees the buffer and while the driver is alive.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import numpy as np
from numba import cuda

from strata.cuda_kernels.intrinsics import SIMULATED
from strata.engine.cuda.hostmem import MappedHost

# cuMemHostRegister flags (the CUDA driver API's values)
REGISTER_PORTABLE = 0x01  # every context may use the registration
REGISTER_DEVICEMAP = 0x02  # mapped into the device address space


def _unregister(driver: Any, ptr: int, buffer: np.ndarray, log: list | None) -> None:
    """End the registration of `buffer` (kept alive by this call's arguments until now)."""
    driver.cuMemHostUnregister(ptr)
    if log is not None:
        log.append(("unregister", ptr, buffer.nbytes))


class PortableHost:
    """One registration of `buffer` (uint8, C-contiguous) readable from every context.

    `driver`: the CUDA driver API object (numba's by default; tests pass a recording stand-in,
    which also makes the simulator take the registered path). `events`, when given, records
    ("register" | "unregister", pointer, bytes) in order."""

    def __init__(self, buffer: np.ndarray, *, driver: Any = None, events: list | None = None):
        if buffer.dtype != np.uint8 or buffer.ndim != 1 or not buffer.flags["C_CONTIGUOUS"]:
            raise ValueError("the host store must be a C-contiguous 1-D uint8 array")
        self.buffer = buffer
        self.seconds = 0.0
        self._ptr = None
        self._finalizer = None
        if SIMULATED and driver is None:
            return
        from numba.cuda.cudadrv import driver as drv

        t0 = time.perf_counter()
        driver = driver if driver is not None else drv.driver
        flags = REGISTER_PORTABLE | REGISTER_DEVICEMAP
        self._ptr = int(buffer.ctypes.data)
        driver.cuMemHostRegister(self._ptr, buffer.nbytes, flags)
        if events is not None:
            events.append(("register", self._ptr, buffer.nbytes))
        self._finalizer = weakref.finalize(self, _unregister, driver, self._ptr, buffer, events)
        self.seconds = time.perf_counter() - t0

    @property
    def registered(self) -> bool:
        return self._finalizer is not None and self._finalizer.alive

    def mapped(self) -> MappedHost:
        """The buffer as a device array of the CURRENT context (call inside `cuda.gpus[i]`)."""
        if self._finalizer is None:
            return MappedHost(self.buffer, self.buffer, "host array (simulator)", 0.0)
        if not self._finalizer.alive:
            raise RuntimeError("the host store's registration has ended (closed)")
        from numba.cuda.cudadrv import devicearray
        from numba.cuda.cudadrv import driver as drv

        ctx = cuda.current_context()
        mem = drv.MappedMemory(weakref.proxy(ctx), self._ptr, self.buffer.nbytes)
        dev = devicearray.from_array_like(self.buffer, gpu_data=mem)
        return MappedHost(self.buffer, dev, "registered (mapped, portable)", self.seconds, mem)

    def close(self) -> None:
        """End the registration (idempotent). Every kernel and copy that reads the store must
        be finished, and device arrays from `mapped()` must not be used afterwards."""
        if self._finalizer is not None:
            self._finalizer()
