"""A counting numba External Memory Management plugin: every device allocation numba makes goes
through `memalloc`, so counting there proves the engine allocates device memory once per GPU
(the arena) and nowhere else. Install it before the first CUDA context exists.
"""

from __future__ import annotations

from numba import cuda
from numba.cuda.cudadrv.driver import NumbaCUDAMemoryManager


class CountingMemoryManager(NumbaCUDAMemoryManager):
    """numba's own device allocator, with each allocation's size recorded (per process)."""

    sizes: list[int] = []

    def memalloc(self, size):
        CountingMemoryManager.sizes.append(int(size))
        return super().memalloc(size)


def install_counting_manager() -> type[CountingMemoryManager]:
    """Route numba's device allocations through the counter; call before any CUDA context."""
    CountingMemoryManager.sizes.clear()
    cuda.set_memory_manager(CountingMemoryManager)
    return CountingMemoryManager


def allocation_sizes() -> list[int]:
    """Sizes of the device allocations made since `install_counting_manager`."""
    return list(CountingMemoryManager.sizes)
