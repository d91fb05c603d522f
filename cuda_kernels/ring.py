"""The prompt path's VRAM ring: expert blobs copied host -> VRAM slots on a copy stream, ordered
with events so that the copy of the next blob overlaps the compute on the previous one.

Protocol, per blob (the engine's MoE loop over a layer's experts during a chunk):

    slot = ring.stage(blob)            # copy stream: wait until the slot's last reader finished,
                                       #   copy the blob in, record "loaded"
    ring.acquire(slot, compute)        # compute stream: wait for "loaded" (no host sync)
    ... kernels reading ring.buf[slot.offset : slot.offset + slot.n_bytes] on `compute` ...
    ring.release(slot, compute)        # compute stream: record "freed" (the slot's next copy waits)

Slots are used round-robin, so with n slots the copy of blob i + n - 1 can run while blob i is
being computed on. Staging a slot that was never released raises: overwriting a slot whose reader
is not yet ordered before the copy would corrupt that reader's input.

Each slot has two events, made once (`RingOps.events`) and recorded again at every use: a wait
takes the event's latest record at the time it is enqueued, as CUDA's stream waits do, so a
re-record never changes a wait already enqueued.
The stream/event/copy primitives are injected (`RingOps`): `CudaRingOps` calls the driver
directly (async host->device copies; the host blob must be pinned or registered memory for the
copy to be asynchronous), and tests substitute a recording fake to check the ordering without a
GPU.

Why direct driver calls and events made once: through numba (a device-array slice, its
`copy_to_device` checks and a new event per record) a stage cost the host 140-200 us on the
H200 machine (`bench/probes/ring_stage.py`), more than the 2.65 MB copy itself (~50 us at
52 GB/s). A 64-token prompt of the 30B model at --gpu-mem 8GiB stages ~4,330 blobs: 0.74-0.93 s
of its 1.06-1.35 s went into staging, and the copy engine and the GPU waited on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .graph import _check, _drv, _stream_handle
from .intrinsics import SIMULATED


class RingOps(Protocol):
    """The stream operations the ring orders (all asynchronous with respect to the host)."""

    def events(self, n: int) -> list: ...

    def copy(self, dst: Any, dst_offset: int, src: np.ndarray, stream: Any) -> None: ...

    def record(self, event: Any, stream: Any) -> None: ...

    def wait(self, stream: Any, event: Any) -> None: ...


class CudaRingOps:
    """RingOps on the CUDA driver (numba's under the simulator). Keep one per model: its events
    are made once and serve each later prompt's ring (one ring at a time uses them)."""

    def __init__(self):
        self._events: list = []

    def events(self, n: int) -> list:
        from numba import cuda
        while len(self._events) < n:
            self._events.append(cuda.event() if SIMULATED else cuda.event(timing=False))
        return self._events[:n]

    if SIMULATED:
        def copy(self, dst, dst_offset, src, stream):
            dst[dst_offset:dst_offset + src.nbytes].copy_to_device(
                src.reshape(-1).view(np.uint8), stream=stream)

        def record(self, event, stream):
            event.record(stream)

        def wait(self, stream, event):
            event.wait(stream)
    else:
        def copy(self, dst, dst_offset, src, stream):
            if not src.flags["C_CONTIGUOUS"]:
                raise ValueError("a ring blob must be C-contiguous host memory")
            _check(_drv().cuMemcpyHtoDAsync(dst.device_ctypes_pointer.value + dst_offset,
                                            src.ctypes.data, src.nbytes, _stream_handle(stream)),
                   "ring copy (cuMemcpyHtoDAsync)")

        def record(self, event, stream):
            _check(_drv().cuEventRecord(int(event.handle), _stream_handle(stream)),
                   "ring event record")

        def wait(self, stream, event):
            _check(_drv().cuStreamWaitEvent(_stream_handle(stream), int(event.handle), 0),
                   "ring stream wait")


@dataclass(frozen=True, slots=True)
class RingSlot:
    """A staged blob: slot `index`, at byte `offset` of the ring buffer, `n_bytes` long."""

    index: int
    offset: int
    n_bytes: int


class ExpertRing:
    """Round-robin VRAM slots of `slot_bytes` inside `buf` (a uint8 device array)."""

    def __init__(self, buf, slot_bytes: int, copy_stream, *, ops: RingOps | None = None,
                 align: int = 256):
        if slot_bytes < 1 or slot_bytes % align:
            raise ValueError(f"slot_bytes must be a positive multiple of {align}, got {slot_bytes}")
        n_slots = buf.shape[0] // slot_bytes
        if n_slots < 2:
            raise ValueError(f"a ring needs at least 2 slots to overlap copy and compute; "
                             f"{buf.shape[0]} bytes hold {n_slots} of {slot_bytes}")
        self.buf, self.slot_bytes, self.n_slots = buf, slot_bytes, n_slots
        self.copy_stream = copy_stream
        self.ops = ops if ops is not None else CudaRingOps()
        events = self.ops.events(2 * n_slots)
        self._loaded, self._freed = events[:n_slots], events[n_slots:]
        self._was_freed = [False] * n_slots  # a slot's first copy waits for no reader
        self._busy = [False] * n_slots  # staged and not yet released
        self._next = 0
        self.n_staged = 0
        self.bytes_staged = 0

    def stage(self, blob: np.ndarray) -> RingSlot:
        """Enqueue the copy of `blob` (host bytes) into the next slot; returns where it lands."""
        if blob.nbytes > self.slot_bytes:
            raise ValueError(f"blob of {blob.nbytes} bytes exceeds the ring's {self.slot_bytes}-byte "
                             "slots")
        s = self._next
        if self._busy[s]:
            raise RuntimeError(f"ring slot {s} is still in use: release() it before staging "
                               f"{self.n_slots} blobs ahead")
        if self._was_freed[s]:
            self.ops.wait(self.copy_stream, self._freed[s])
        offset = s * self.slot_bytes
        self.ops.copy(self.buf, offset, blob, self.copy_stream)
        self.ops.record(self._loaded[s], self.copy_stream)
        self._busy[s] = True
        self._next = (s + 1) % self.n_slots
        self.n_staged += 1
        self.bytes_staged += blob.nbytes
        return RingSlot(s, offset, blob.nbytes)

    def acquire(self, slot: RingSlot, stream) -> None:
        """Make `stream` wait until the slot's copy has landed."""
        self._check(slot)
        self.ops.wait(stream, self._loaded[slot.index])

    def release(self, slot: RingSlot, stream) -> None:
        """Record on `stream` that the work reading the slot has been enqueued; the slot's next
        copy waits for it."""
        self._check(slot)
        self.ops.record(self._freed[slot.index], stream)
        self._was_freed[slot.index] = True
        self._busy[slot.index] = False

    def _check(self, slot: RingSlot) -> None:
        if not (0 <= slot.index < self.n_slots) or not self._busy[slot.index]:
            raise RuntimeError(f"ring slot {slot.index} is not staged")
