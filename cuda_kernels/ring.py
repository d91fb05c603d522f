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

The stream/event/copy primitives are injected (`RingOps`): `CudaRingOps` uses numba's driver
(async host->device copies; the host blob must be pinned or registered memory for the copy to
be asynchronous), and tests substitute a recording fake to check the ordering without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class RingOps(Protocol):
    """The stream operations the ring orders (all asynchronous with respect to the host)."""

    def copy(self, dst: Any, dst_offset: int, src: np.ndarray, stream: Any) -> None: ...
    def record(self, stream: Any) -> Any: ...
    def wait(self, stream: Any, event: Any) -> None: ...


class CudaRingOps:
    """RingOps on numba CUDA streams and events."""

    def copy(self, dst, dst_offset, src, stream):
        dst[dst_offset:dst_offset + src.nbytes].copy_to_device(src.reshape(-1).view(np.uint8),
                                                               stream=stream)

    def record(self, stream):
        from numba import cuda
        ev = cuda.event()
        ev.record(stream)
        return ev

    def wait(self, stream, event):
        event.wait(stream)


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
        self._loaded: list[Any] = [None] * n_slots
        self._freed: list[Any] = [None] * n_slots
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
        if self._freed[s] is not None:
            self.ops.wait(self.copy_stream, self._freed[s])
        offset = s * self.slot_bytes
        self.ops.copy(self.buf, offset, blob, self.copy_stream)
        self._loaded[s] = self.ops.record(self.copy_stream)
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
        self._freed[slot.index] = self.ops.record(stream)
        self._busy[slot.index] = False

    def _check(self, slot: RingSlot) -> None:
        if not (0 <= slot.index < self.n_slots) or not self._busy[slot.index]:
            raise RuntimeError(f"ring slot {slot.index} is not staged")
