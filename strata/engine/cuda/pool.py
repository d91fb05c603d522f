"""`CpuPool`: decode experts missed in VRAM computed on the CPU, beside the GPU.

The CPU engine's quantized expert path (`strata.engine.cpu.experts.CpuExperts`, reading the
experts' blocks in place from the mapped GGUF file) computes a layer's missed experts for the
one decode token while the GPU computes its cached ones. Per layer: the normed input and the
router's choice are copied to pinned host memory after the routing kernel (an event marks them
ready), the GPU's MoE kernel runs the hits with the misses skipped, the host picks the misses
from the slot table's host mirror (the cache's one owner keeps both in sync), computes them, and
adds their weighted sum into the residual (a host->device copy and an add on the stream, after
the GPU's hits).

Measured, not assumed: seconds and bytes of the CPU's work are counted (`seconds`, `n_bytes`),
so the bench can hold this path against mapped reads (`strata bench --backend cuda --miss-sweep`).

With a `MissShare` (the "hybrid" path, `strata.engine.cuda.miss_split`) the pool computes only
its share of a layer's misses; `wait` hands the others to the GPU's second MoE launch, which
reads them from mapped host memory while the pool computes.
"""

from __future__ import annotations

import time

import numpy as np
from numba import cuda

from strata.cuda_kernels.elementwise import add


class CpuPool:
    """The CPU side of the "cpu" miss path for one `CudaModel`."""

    def __init__(self, m, *, split=None):
        from strata.engine.cpu.experts import CpuExperts
        from strata.engine.cuda.miss_split import MappedShare

        s = m.shape
        self.experts = CpuExperts(m.file)
        self.x = cuda.pinned_array((1, s.n_embd), np.float32)  # [1, n_embd] f32, the normed input
        self.ids = cuda.pinned_array(s.n_expert_used, np.int32)  # [k] i32, the router's top-k
        self.w = cuda.pinned_array(s.n_expert_used, np.float32)  # [k] f32, their weights
        self.out = cuda.pinned_array(s.n_embd, np.float32)  # [n_embd] f32, the misses' sum
        self.ready = cuda.event()
        self.seconds = 0.0
        self.n_experts = 0
        self.n_bytes = 0
        self.split = split  # a MissShare: the CPU's part of the misses; None: all of them
        self.mapped = MappedShare(m, split) if split is not None else None
        self._mine = np.zeros(0, np.int64)  # positions in the top-k the pool computes next
        self.n_gpu_bytes = 0  # hybrid: bytes of the GPU's parts

    def fetch(self, xn, ids, weights, stream) -> None:
        """Queue the copies of the layer's normed input, top-k ids and weights to the host."""
        xn.copy_to_host(self.x.reshape(-1), stream=stream)
        ids.copy_to_host(self.ids, stream=stream)
        weights.copy_to_host(self.w, stream=stream)
        self.ready.record(stream)

    def wait(self, layer: int, table_row: np.ndarray, stream=None) -> int:
        """Wait for the fetched values; pick the layer's misses the pool computes (all, or its
        share) and, hybrid, send the table of the GPU's part on `stream`. Returns the bytes of
        the GPU's part (0: no second launch)."""
        self.ready.synchronize()
        missed = np.flatnonzero(table_row[self.ids] < 0)
        if self.split is None:
            self._mine = missed
            return 0
        cpu, gpu = self.split.pick(missed)
        self._mine = missed[cpu]
        if gpu.size == 0:
            return 0
        self.mapped.send(layer, self.ids[missed[gpu]].astype(np.int32), stream)
        n = int(gpu.size) * self.experts.layers[layer].expert_bytes
        self.n_gpu_bytes += n
        return n

    def compute(self, layer: int, table_row: np.ndarray | None = None) -> bool:
        """Compute the picked misses (`wait` first, or pass `table_row` to wait here and take
        them all) into `out`; False when there is nothing to add."""
        if table_row is not None:
            self.wait(layer, table_row)
        n = int(self._mine.size)
        if n == 0:
            return False
        t0 = time.perf_counter()
        ids = self.ids[self._mine].astype(np.int64).reshape(1, n)
        w = np.ascontiguousarray(self.w[self._mine]).reshape(1, n)
        self.out[:] = self.experts.forward(self.x, layer, ids, w)[0]
        dt = time.perf_counter() - t0
        n_bytes = n * self.experts.layers[layer].expert_bytes
        self.seconds += dt
        self.n_experts += n
        self.n_bytes += n_bytes
        if self.split is not None:
            self.split.record_cpu(n_bytes, dt)
        return True

    def add_into(self, x, scratch, stream) -> None:
        """x += the misses' sum, through `scratch` (a device [n_embd] f32 free until the next
        layer's attention), ordered after the GPU's hits on `stream`."""
        scratch.copy_to_device(self.out, stream=stream)
        add(x, scratch, x, stream=stream)
