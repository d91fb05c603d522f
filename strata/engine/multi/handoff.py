"""The hidden state handed from one stage's GPU to the next (and the sampled token back to the
first stage): peer-to-peer where the two GPUs can reach each other's memory, else through pinned
host memory (a device-to-host copy, then host-to-device, ordered by events). Which one is used is
decided by asking the driver (`--handoff host` forces the pinned-host path), and its speed is
measured and printed, never assumed.

The pinned staging buffer is allocated portable: memory pinned for one context only counts as
pageable in another, and a copy from pageable memory is staged when it is issued, before the
event it waits for (the device-to-host copy) has completed.

Ordering: the copy is enqueued on the receiving stage's stream after it waits for an event the
sending stage recorded after its work, so a copy never reads a hidden state still being written;
and the sending stage's stream waits for the copy in turn, so its next step (or chunk) never
overwrites a hidden state (or the pinned staging buffer) before it has been read.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from numba import cuda

from strata.cuda_kernels.intrinsics import SIMULATED
from strata.engine.cuda.hostmem import device_address

_PEER: dict[tuple[int, int], bool] = {}  # (a, b) -> peer access enabled both ways


def peer_reachable(a: int, b: int) -> bool:
    """Whether kernels on GPU `a` can read GPU `b`'s memory (and `b` `a`'s): true on one device
    (and under the simulator, whose one device every stage shares); else peer access is enabled
    both ways where the hardware allows it (once per pair), false where it does not."""
    if SIMULATED or a == b:
        return True
    key = (min(a, b), max(a, b))
    if key not in _PEER:
        with cuda.gpus[a]:
            ok = cuda.current_context().can_access_peer(b)
        if ok:
            _enable(a, b)
            _enable(b, a)
        _PEER[key] = bool(ok)
    return _PEER[key]


def _enable(a: int, b: int) -> None:
    """Let GPU `a`'s context read GPU `b`'s memory."""
    from numba.cuda.cudadrv.driver import CudaAPIError

    with cuda.gpus[b]:
        peer = cuda.current_context()
    with cuda.gpus[a]:
        try:
            cuda.current_context().enable_peer_access(peer.handle)
        except CudaAPIError as e:  # already enabled (by numba or an earlier caller)
            if "PEER_ACCESS_ALREADY_ENABLED" not in str(e) and "704" not in str(e):
                raise


def portable_pinned(n_bytes: int) -> np.ndarray:
    """[n_bytes] uint8 host memory pinned for every context (a plain array under the
    simulator). Freed when the array goes."""
    if SIMULATED:
        return np.zeros(n_bytes, np.uint8)
    mem = cuda.current_context().memhostalloc(n_bytes, portable=True)
    return np.ndarray((n_bytes,), np.uint8, buffer=mem)


class Link:
    """Copies from GPU `src` (stream `src_stream`) to GPU `dst` (stream `dst_stream`).
    `handoff`: "auto" (peer-to-peer where possible, else pinned host) or "host" (pinned host,
    also between two stages on one GPU); `how` says which was taken."""

    def __init__(self, src: int, dst: int, src_stream, dst_stream, *, max_bytes: int,
                 handoff: str = "auto"):
        if handoff not in ("auto", "host"):
            raise ValueError(f"handoff {handoff!r}: expected 'auto' or 'host'")
        self.src, self.dst = src, dst
        self.src_stream, self.dst_stream = src_stream, dst_stream
        self.how = "pinned host" if handoff == "host" else self._choose()
        self._stage = None
        if self.how == "pinned host":
            with _on(src):
                self._stage = portable_pinned(max(1, max_bytes))  # [max_bytes] u8

    def _choose(self) -> str:
        if SIMULATED or self.src == self.dst:
            return "same device"
        return "peer-to-peer" if peer_reachable(self.dst, self.src) else "pinned host"

    def _staged(self, arr: Any) -> np.ndarray:
        """The staging buffer's first bytes as a host array of `arr`'s shape and type."""
        n = int(arr.nbytes)
        if n > self._stage.size:
            raise ValueError(f"handoff of {n} B through a {self._stage.size} B staging buffer")
        return self._stage[:n].view(arr.dtype).reshape(arr.shape)

    def copy(self, dst: Any, src: Any) -> None:
        """Enqueue dst[:] = src[:] (device arrays of one size on the two GPUs) after everything
        already enqueued on the source stream."""
        n = int(src.nbytes)
        if n != int(dst.nbytes):
            raise ValueError(f"handoff of {n} B into a {int(dst.nbytes)} B buffer")
        if self.how == "same device":
            ev = cuda.event()
            ev.record(self.src_stream)
            ev.wait(self.dst_stream)
            dst.copy_to_device(src, stream=self.dst_stream)
            done = cuda.event()
            done.record(self.dst_stream)
            done.wait(self.src_stream)
            return
        if self.how == "pinned host":
            self._through_host(dst, src)
            return
        from numba.cuda.cudadrv import driver as drv

        with cuda.gpus[self.src]:
            src_ctx = cuda.current_context()
            ev = cuda.event()
            ev.record(self.src_stream)
        with cuda.gpus[self.dst]:
            dst_ctx = cuda.current_context()
            ev.wait(self.dst_stream)
            drv.driver.cuMemcpyPeerAsync(device_address(dst), dst_ctx.handle,
                                         device_address(src), src_ctx.handle, n,
                                         drv._stream_handle(self.dst_stream))
            done = cuda.event()
            done.record(self.dst_stream)
        with cuda.gpus[self.src]:
            done.wait(self.src_stream)

    def _through_host(self, dst: Any, src: Any) -> None:
        """src -> staging on the source stream; staging -> dst on the receiving stream after
        it; the source stream waits for the second copy before its next write (of src or of
        the staging buffer)."""
        with _on(self.src):
            src.copy_to_host(self._staged(src), stream=self.src_stream)
            ev = cuda.event()
            ev.record(self.src_stream)
        with _on(self.dst):
            ev.wait(self.dst_stream)
            dst.copy_to_device(self._staged(dst), stream=self.dst_stream)
            done = cuda.event()
            done.record(self.dst_stream)
        with _on(self.src):
            done.wait(self.src_stream)

    def measure(self, dst: Any, src: Any, *, n_bytes: int, repeats: int = 50) -> dict:
        """Seconds per copy of `n_bytes` (after one warm-up), and GB/s."""
        d, s = dst.reshape(-1).view(np.uint8)[:n_bytes], src.reshape(-1).view(np.uint8)[:n_bytes]
        self.copy(d, s)
        self._sync()
        t0 = time.perf_counter()
        for _ in range(repeats):
            self.copy(d, s)
        self._sync()
        secs = (time.perf_counter() - t0) / repeats
        return {"how": self.how, "bytes": n_bytes, "seconds": secs,
                "gb_per_s": n_bytes / max(secs, 1e-12) / 1e9}

    def close(self) -> None:
        """Free the pinned staging buffer (idempotent; the streams must be drained)."""
        self._stage = None

    def _sync(self) -> None:
        with _on(self.dst):
            self.dst_stream.synchronize()


def _on(device: int):
    from strata.engine.multi.model import _on as on
    return on(device)
