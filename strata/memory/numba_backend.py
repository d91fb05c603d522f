"""The real device backend, through numba-cuda: one `cuda.device_array(n, uint8)`, pages
written with the driver's memset, typed views by slicing and `.view(dtype)` (no copy, no
allocation), free memory from the live context."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from numba import config as numba_config
from numba import cuda


class NumbaBackend:
    """GPU `index` (the current numba context's device). `memory_info` may be injected: the
    CUDA simulator reports infinite memory, which a plan cannot be validated against."""

    def __init__(self, index: int = 0, *,
                 memory_info: Callable[[], tuple[int, int]] | None = None):
        self.index = index
        cuda.select_device(index)
        self._memory_info = memory_info

    def memory_info(self) -> tuple[int, int]:
        ctx = cuda.current_context()
        # numba defers frees (device memory in its memory manager's queue): a released buffer
        # must not count as used
        for owner in (ctx, getattr(ctx, "memory_manager", None)):
            pending = getattr(owner, "deallocations", None)
            if pending is not None:
                pending.clear()
        if self._memory_info is not None:
            return self._memory_info()
        free, total = ctx.get_memory_info()
        return int(free), int(total)

    def allocate(self, n_bytes: int) -> Any:
        return cuda.device_array(n_bytes, dtype=np.uint8)  # [n_bytes] uint8, the whole arena

    def touch(self, buffer: Any) -> None:
        if numba_config.ENABLE_CUDASIM:
            buffer.copy_to_device(np.zeros(buffer.shape[0], dtype=np.uint8))
            return
        from numba.cuda.cudadrv.driver import device_memset
        device_memset(buffer, 0, buffer.shape[0])  # synchronous: every page written on return
        cuda.synchronize()

    def release(self, buffer: Any) -> None:
        """Nothing to call: numba frees the memory once the caller drops its last reference,
        and `memory_info` flushes numba's deferred frees before reading."""

    def view(self, buffer: Any, offset: int, dtype: str, shape: tuple[int, ...]) -> Any:
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return buffer[offset:offset + n].view(np.dtype(dtype)).reshape(shape)
