"""`FileSlots`: the expert cache's device side (`strata.experts.CacheDevice`) where the host store
keeps no experts: each slot's blob is assembled straight from the model file's memory map.

Why: a run whose VRAM cache holds every expert and never gives one back (its prompt path owns its
buffers, its cache does not re-rank: `strata.plan.host.keeps_experts`) reads no expert from host
memory, so a page-locked copy of all of them (17.7 GB for a 30B Q4_K_M) would only cost the
machine its memory and the load its time. The cache is filled from the file instead: blobs are
assembled (gate | up | down, as the store would hold them) into one of two pinned staging
buffers, on `fill_threads()` threads, in the file's order (see `flush`), and each run of
consecutive slots goes over in one copy on the compute stream while the other buffer fills.

Loads are queued and land at the next `write_table`, which every change of the cache makes after
its loads (fill, refill, swap), so no kernel sees a slot before its bytes.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from numba import cuda

from strata.experts.store import fill_threads
from strata.gguf import ModelFile
from strata.gguf.arch.qwen3moe import EXPERT_NAMES

STAGE_BYTES = 64 << 20  # each of the two pinned staging buffers


class FileSlots:
    """Writes the slot table and fills slots from the model file (see the module doc)."""

    def __init__(self, model: ModelFile, layouts, table, cache, slot_offset: np.ndarray, stream,
                 layers: tuple[int, int]):
        self.table, self.cache, self.stream = table, cache, stream
        self.model = model
        self.slot_offset = np.asarray(slot_offset, np.int64)
        self.layouts = layouts
        n = model.shape.n_expert
        lo, hi = layers
        # per layer: its three stacked expert tensors as [n_expert, bytes of one expert]
        self.src: dict[int, tuple[np.ndarray, ...]] = {}
        for il in range(lo, hi):
            lay = layouts[il]
            sizes = (lay.gate_bytes, lay.up_bytes, lay.down_bytes)
            self.src[il] = tuple(model.raw(f"blk.{il}.{name}.weight").reshape(n, size)
                                 for name, size in zip(EXPERT_NAMES, sizes))
        self.pending: list[tuple[int, int, int]] = []  # (slot, layer, expert)
        self._stages: list[Any] = []
        self._done: list[Any] = [None, None]
        self._turn = 0
        self.n_bytes = 0  # blob bytes copied

    def release(self) -> None:
        """Give the staging buffers back once the queued copies are done (made again by a later
        load, which a run that keeps no experts in host memory never makes)."""
        for ev in self._done:
            if ev is not None:
                ev.synchronize()
        self._stages, self._done = [], [None, None]

    def write_table(self, table: np.ndarray) -> None:
        self.flush()
        self.table.copy_to_device(np.ascontiguousarray(table, np.int32), stream=self.stream)

    def load(self, slot: int, layer: int, expert: int) -> None:
        if layer not in self.src:
            raise ValueError(f"layer {layer} is not one this cache holds")
        self.pending.append((int(slot), int(layer), int(expert)))

    def flush(self) -> None:
        """Copy every queued blob into its slot. Read in the file's order, (layer, expert), not
        the slots' (rank order, random within a layer), for a file not in the page cache: a
        disk serves sequential reads best. (On the H100 machine's virtual disk a cold 30B file
        came in at 1.4-1.5 GB/s either way, its disk's rate; warm, 9.6 GB/s.) A staging
        buffer's worth at a time: assembled on the fill threads while the next one's bytes are
        prefetched, then one copy per run of consecutive slots."""
        if not self.pending:
            return
        stage_n = max(STAGE_BYTES, max(self.layouts[layer].n_bytes
                                       for _, layer, _ in self.pending))
        if not self._stages or self._stages[0].size < stage_n:
            self._stages = [cuda.pinned_array(stage_n, np.uint8) for _ in range(2)]  # [n] u8
            self._done = [None, None]
        chunks: list[list[tuple[int, int, int]]] = [[]]
        size = 0
        for item in sorted(self.pending, key=lambda i: (i[1], i[2], i[0])):
            n = self.layouts[item[1]].n_bytes
            if chunks[-1] and size + n > stage_n:
                chunks.append([])
                size = 0
            chunks[-1].append(item)
            size += n
        self._prefetch(chunks[0])
        with ThreadPoolExecutor(fill_threads(), thread_name_prefix="slot-fill") as pool:
            for i, chunk in enumerate(chunks):
                if i + 1 < len(chunks):
                    self._prefetch(chunks[i + 1])  # read ahead while this one is copied
                self._copy_chunk(chunk, pool)
        self.pending = []

    def _prefetch(self, chunk: list[tuple[int, int, int]]) -> None:
        """Have the OS read the file's bytes of `chunk`'s experts (a range per tensor)."""
        for layer in sorted({layer for _, layer, _ in chunk}):
            ex = [e for _, lay, e in chunk if lay == layer]
            for name, part in zip(EXPERT_NAMES, self.src[layer]):
                size = part.shape[1]
                self.model.prefetch(f"blk.{layer}.{name}.weight", min(ex) * size,
                                    (max(ex) + 1) * size)

    def _copy_chunk(self, chunk: list[tuple[int, int, int]], pool: ThreadPoolExecutor) -> None:
        """Assemble `chunk`'s blobs (in file order) back to back in a staging buffer, then copy
        each run of them whose slots are consecutive in the cache in one go."""
        if self._done[self._turn] is not None:
            self._done[self._turn].synchronize()  # the copy that last read this buffer is done
        buf = self._stages[self._turn]
        pos = np.cumsum([0] + [self.layouts[layer].n_bytes for _, layer, _ in chunk])
        tasks = []  # tensor-major, so the threads walk each tensor's bytes in order
        for k in range(3):
            for (_, layer, expert), at in zip(chunk, pos):
                lay = self.layouts[layer]
                tasks.append((int(at) + (0, lay.up_off, lay.down_off)[k],
                              self.src[layer][k][expert]))

        def put(task: tuple[int, np.ndarray]) -> None:
            at, src = task
            buf[at:at + src.size] = src

        list(pool.map(put, tasks))  # a failure is raised here
        first = 0
        for i in range(1, len(chunk) + 1):
            if i < len(chunk):
                (slot0, layer0, _), (slot1, _, _) = chunk[i - 1], chunk[i]
                end = int(self.slot_offset[slot0]) + self.layouts[layer0].n_bytes
                if slot1 == slot0 + 1 and int(self.slot_offset[slot1]) == end:
                    continue  # the next blob follows this one in the cache and in the buffer
            at = int(self.slot_offset[chunk[first][0]])
            n = int(pos[i] - pos[first])
            self.cache[at:at + n].copy_to_device(buf[pos[first]:pos[i]], stream=self.stream)
            first = i
        ev = cuda.event()
        ev.record(self.stream)
        self._done[self._turn] = ev
        self._turn ^= 1
        self.n_bytes += int(pos[-1])
