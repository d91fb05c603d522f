"""Host memory the GPU reads: the expert store registered (page-locked and mapped into the
device's address space), and the dense weights' upload through pinned staging buffers.

Choice of host memory for the experts (REFERENCE.md's measurements): `cuda.pinned_array` of
32 GiB takes ~20 s to allocate and touch, registering an already-filled numpy buffer with
`mempin(mapped=True)` ~0.3 s per 8 GiB, and a read-only mmap of the GGUF cannot be registered at
all. So the store is a private numpy buffer filled from the mapping (`strata.experts.store`),
then registered mapped: the decode kernel reads missed experts from it zero-copy over PCIe,
and the prefill ring copies blobs from it asynchronously (page-locked memory is what lets
`cuMemcpyHtoDAsync` overlap with compute).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
from numba import cuda

from strata.cuda_kernels.intrinsics import SIMULATED

STAGE_BYTES = 64 << 20  # each of the two pinned staging buffers of the weight upload
SPLIT_BYTES = 4 << 20  # a staged chunk at least this large is filled on several threads


@dataclass(slots=True)
class MappedHost:
    """A host buffer and the device array that reads it (zero-copy)."""

    host: np.ndarray  # uint8 [n_bytes]
    device: Any  # uint8 [n_bytes] device array over the same pages
    how: str  # "registered (mapped)" or, under the simulator, "host array (simulator)"
    seconds: float
    _pin: Any = None  # keeps the registration alive


def map_host(buffer: np.ndarray) -> MappedHost:
    """Register `buffer` (uint8, C-contiguous, touched) page-locked and mapped."""
    if buffer.dtype != np.uint8 or buffer.ndim != 1 or not buffer.flags["C_CONTIGUOUS"]:
        raise ValueError("the host store must be a C-contiguous 1-D uint8 array")
    t0 = time.perf_counter()
    if SIMULATED:
        return MappedHost(buffer, buffer, "host array (simulator)", 0.0)
    from numba.cuda.cudadrv import devicearray, driver

    pin = cuda.current_context().mempin(buffer, driver.host_pointer(buffer), buffer.nbytes,
                                        mapped=True)
    dev = devicearray.from_array_like(buffer, gpu_data=pin)
    return MappedHost(buffer, dev, "registered (mapped)", time.perf_counter() - t0, pin)


@contextmanager
def progress_bar(label: str, total: int, enabled: bool) -> Iterator[Any]:
    """A rich progress bar on stderr (a no-op callable when disabled): yields update(done)."""
    if not enabled:
        yield lambda done: None
        return
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                               TransferSpeedColumn)

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), console=Console(stderr=True), transient=True) as p:
        task = p.add_task(label, total=total)
        yield lambda done: p.update(task, completed=done)


def upload(pieces: list[tuple[Any, np.ndarray]], stream, *, progress: bool = True,
           label: str = "dense weights", n_threads: int | None = None) -> tuple[int, float]:
    """Copy each (device uint8 view, host uint8 array) pair through two pinned staging buffers
    (one fills while the other's copy runs), a large chunk filled on `n_threads` threads
    (default `fill_threads()`: one thread reads a memory-mapped file's cold pages at a fraction
    of what several do). Returns (bytes, seconds)."""
    from strata.experts.store import fill_threads

    total = sum(int(src.nbytes) for _, src in pieces)
    stage_n = max(1, min(STAGE_BYTES, total))
    stages = [cuda.pinned_array(stage_n, np.uint8) for _ in range(2)]  # [stage_n] u8 pinned
    done_ev: list[Any] = [None, None]
    t0 = time.perf_counter()
    done, turn = 0, 0
    n_threads = fill_threads() if n_threads is None else n_threads
    with progress_bar(label, total, progress) as update, \
            ThreadPoolExecutor(n_threads, thread_name_prefix="upload") as pool:
        for dst, src in pieces:
            flat = src.reshape(-1)
            for off in range(0, flat.size, stage_n):
                m = min(stage_n, flat.size - off)
                if done_ev[turn] is not None:
                    done_ev[turn].synchronize()  # the copy that last read this buffer is done
                buf = stages[turn]
                _fill(buf[:m], flat[off:off + m], pool, n_threads)
                dst[off:off + m].copy_to_device(buf[:m], stream=stream)
                ev = cuda.event()
                ev.record(stream)
                done_ev[turn] = ev
                turn ^= 1
                done += m
                update(done)
        stream.synchronize()
    return total, time.perf_counter() - t0


def _fill(buf: np.ndarray, src: np.ndarray, pool: ThreadPoolExecutor, n_threads: int) -> None:
    """buf[:] = src, in n_threads slices at once where src is past SPLIT_BYTES (numpy drops the
    GIL for the copy)."""
    if n_threads < 2 or src.size < SPLIT_BYTES:
        np.copyto(buf, src)
        return
    step = -(-src.size // n_threads)
    list(pool.map(lambda a: np.copyto(buf[a:a + step], src[a:a + step]),
                  range(0, src.size, step)))  # a failure is raised here


def device_address(a: Any) -> int:
    """The address of a device array's first byte (host address under the simulator)."""
    iface = getattr(a, "__cuda_array_interface__", None)
    if iface is None:
        iface = a.__array_interface__
    return int(iface["data"][0])
