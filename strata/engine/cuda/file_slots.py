"""`FileSlots`: the expert cache's device side (`strata.experts.CacheDevice`) where the host store
keeps no experts: each slot's blob is assembled straight from the model file's memory map.

Why: a run whose VRAM cache holds every expert and never gives one back (its prompt path owns its
buffers, its cache does not re-rank: `strata.plan.host.keeps_experts`) reads no expert from host
memory, so a page-locked copy of all of them (17.7 GB for a 30B Q4_K_M) would only cost the
machine its memory and the load its time. The cache is filled from the file instead: blobs of
consecutive slots are assembled (gate | up | down, as the store would hold them) into one of two
pinned staging buffers, on `fill_threads()` threads, and each run of slots goes over in one copy
on the compute stream while the other buffer fills.

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
        """Copy every queued blob into its slot: runs of consecutive slots, one copy each."""
        if not self.pending:
            return
        stage_n = STAGE_BYTES
        biggest = max(self.layouts[layer].n_bytes for _, layer, _ in self.pending)
        if biggest > stage_n:
            stage_n = biggest
        if not self._stages or self._stages[0].size < stage_n:
            self._stages = [cuda.pinned_array(stage_n, np.uint8) for _ in range(2)]  # [n] u8
            self._done = [None, None]
        run: list[tuple[int, int, int]] = []
        with ThreadPoolExecutor(fill_threads(), thread_name_prefix="slot-fill") as pool:
            for item in sorted(self.pending):
                slot, layer, _ = item
                if run:
                    first = int(self.slot_offset[run[0][0]])
                    end = int(self.slot_offset[slot]) + self.layouts[layer].n_bytes
                    if slot != run[-1][0] + 1 or end - first > stage_n:
                        self._copy_run(run, pool)
                        run = []
                run.append(item)
            if run:
                self._copy_run(run, pool)
        self.pending = []

    def _copy_run(self, run: list[tuple[int, int, int]], pool: ThreadPoolExecutor) -> None:
        first = int(self.slot_offset[run[0][0]])
        last_slot, last_layer, _ = run[-1]
        n = int(self.slot_offset[last_slot]) + self.layouts[last_layer].n_bytes - first
        if self._done[self._turn] is not None:
            self._done[self._turn].synchronize()  # the copy that last read this buffer is done
        buf = self._stages[self._turn]

        def assemble(item: tuple[int, int, int]) -> None:
            slot, layer, expert = item
            pos = int(self.slot_offset[slot]) - first
            lay = self.layouts[layer]
            for part, off in zip(self.src[layer], (0, lay.up_off, lay.down_off)):
                size = part.shape[1]
                buf[pos + off:pos + off + size] = part[expert]

        list(pool.map(assemble, run))  # a failure is raised here
        self.cache[first:first + n].copy_to_device(buf[:n], stream=self.stream)
        ev = cuda.event()
        ev.record(self.stream)
        self._done[self._turn] = ev
        self._turn ^= 1
        self.n_bytes += sum(self.layouts[layer].n_bytes for _, layer, _ in run)
