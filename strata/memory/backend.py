"""The device backend the arena is written against, and `HostBackend`: an arena in host memory
(the CPU engine's device, and a simulated card for the post-touch tests).

A backend does four things: read (free, total) memory, allocate one byte buffer, write every page
of it, and give typed views at byte offsets. The arena never calls an allocator directly.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np

PAGE_BYTES = 4096  # host page; device pages are larger, so touching every 4 KiB covers them


class DeviceBackend(Protocol):
    """What the arena needs from a device."""

    index: int

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes, read now."""

    def allocate(self, n_bytes: int) -> Any:
        """One buffer of `n_bytes` uint8; raises MemoryError-like errors when it cannot."""

    def touch(self, buffer: Any) -> None:
        """Write every page, so the driver must back all of it now (not lazily, not paged)."""

    def release(self, buffer: Any) -> None:
        """Give the buffer back."""

    def view(self, buffer: Any, offset: int, dtype: str, shape: tuple[int, ...]) -> Any:
        """A typed view of `buffer[offset : offset + size]` with `shape`."""


class HostBackend:
    """A simulated device of `total_bytes` in host memory. `others_bytes` is what other processes
    use (a desktop, another program); `on_touch` runs after every touch, so a test can make the
    desktop grow exactly when the arena is being validated."""

    def __init__(self, total_bytes: int, *, others_bytes: int = 0, index: int = 0,
                 on_touch: Callable[["HostBackend"], None] | None = None):
        if not 0 <= others_bytes <= total_bytes:
            raise ValueError(f"others_bytes {others_bytes} not within 0..{total_bytes}")
        self.index = index
        self.total_bytes = total_bytes
        self.others_bytes = others_bytes
        self.on_touch = on_touch
        self.allocated_bytes = 0
        self.n_allocations = 0  # every allocate() call, for the one-allocation proof
        self.n_touched_pages = 0

    def memory_info(self) -> tuple[int, int]:
        free = self.total_bytes - self.others_bytes - self.allocated_bytes
        return max(0, free), self.total_bytes

    def allocate(self, n_bytes: int) -> np.ndarray:
        free, _ = self.memory_info()
        if n_bytes > free:
            raise MemoryError(f"simulated device {self.index}: {n_bytes} B asked, {free} B free")
        self.n_allocations += 1
        self.allocated_bytes += n_bytes
        return np.empty(n_bytes, dtype=np.uint8)  # [n_bytes] uint8

    def touch(self, buffer: np.ndarray) -> None:
        buffer[::PAGE_BYTES] = 0
        self.n_touched_pages += -(-len(buffer) // PAGE_BYTES)
        if self.on_touch is not None:
            self.on_touch(self)

    def release(self, buffer: np.ndarray) -> None:
        self.allocated_bytes -= len(buffer)

    def view(self, buffer: np.ndarray, offset: int, dtype: str,
             shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return buffer[offset:offset + n].view(dtype).reshape(shape)
