"""`HostStore`: every expert of a model in one host buffer the GPU can read, one blob per
(layer, expert), laid out as the MoE kernels read it: gate rows, then up rows, then down rows.

Why a repacked copy rather than the GGUF mapping itself: the file stores each layer's experts as
three stacked tensors (all gates, then all ups, then all downs), so one expert's bytes are three
distant pieces, and the decode kernel finds an expert from ONE base offset with fixed offsets to
up and down (`cuda_kernels.moe.ExpertLayout`). In a Q4_K_M file the down projections of some
layers are Q6_K, so the distance from an expert's gate to its down changes with the expert: the
file cannot be read in place. The copy is also what makes the memory registrable: a read-only
mmap cannot be page-locked, a private numpy buffer can (`mempin`, mapped), cheaply once it is
touched (REFERENCE.md: 0.3 s for 8 GiB).

The token embedding may live here too (`--embd-on-gpu` off, the default): the embedding kernel
reads one row per token over PCIe.

Pure numpy: the GPU side registers `buffer` (see `strata.engine.cuda.hostmem`).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

from strata.gguf import ModelFile
from strata.gguf.arch.qwen3moe import EXPERT_NAMES
from strata.gguf.shape import ModelShape
from strata.plan.host import STORE_ALIGN

# every blob starts on this boundary (the kernels' 16-byte vector loads); the plan prices the
# store with the same (`strata.plan.host.store_bytes`)
BLOB_ALIGN = STORE_ALIGN

Progress = Callable[[int, int], None]  # (bytes done, bytes total)

# Threads that fill a store (None: the machine's cores, at most MAX_FILL_THREADS). A store's
# pages are new memory: the copy's cost is mostly the kernel faulting them in and zeroing them,
# not the bytes (REFERENCE.md's 0.3 s for 8 GiB is registering pages already touched). numpy
# releases the GIL for the copies, so the (layer, tensor) pieces fault in on several cores at
# once. At most 8: each thread also reads its own stretch of the model file, and a file not yet
# in the page cache on a spinning disk would seek between that many streams. Read at fill time,
# so a benchmark can compare counts in one process.
FILL_THREADS: int | None = None
MAX_FILL_THREADS = 8


def fill_threads() -> int:
    """FILL_THREADS, or the machine's cores (at most MAX_FILL_THREADS) where it is None."""
    if FILL_THREADS is not None:
        if FILL_THREADS < 1:
            raise ValueError(f"FILL_THREADS must be at least 1, got {FILL_THREADS}")
        return FILL_THREADS
    return max(1, min(MAX_FILL_THREADS, os.cpu_count() or 1))


def _align(n: int, a: int = BLOB_ALIGN) -> int:
    return -(-n // a) * a


@dataclass(frozen=True, slots=True)
class BlobLayout:
    """One layer's expert blob: gate [n_ff, n_embd] in `gate_type`, up in `up_type` (the same
    format in most files; IQ_MIX / LEGACY_MIX files differ), down [n_embd, n_ff] in
    `down_type`, at byte offsets 0, `up_off`, `down_off`; `n_bytes` in all (the plan's slot
    size, `ModelShape.expert_slot_bytes`)."""

    gate_type: int
    down_type: int
    gate_bytes: int  # one expert's gate matrix
    down_bytes: int
    up_type: int = -1  # -1: gate_type
    up_bytes: int = -1  # -1: gate_bytes

    def __post_init__(self) -> None:
        if self.up_type < 0:
            object.__setattr__(self, "up_type", self.gate_type)
        if self.up_bytes < 0:
            object.__setattr__(self, "up_bytes", self.gate_bytes)

    @property
    def mixed(self) -> bool:
        """Gate and up in different formats (the fused gate/up kernels cannot read it)."""
        return self.up_type != self.gate_type

    @property
    def up_off(self) -> int:
        return self.gate_bytes

    @property
    def down_off(self) -> int:
        return self.gate_bytes + self.up_bytes

    @property
    def n_bytes(self) -> int:
        return self.down_off + self.down_bytes


def blob_layout(shape: ModelShape, layer: int) -> BlobLayout:
    """The blob of `layer`; ValueError when a part's size breaks the kernels' 16-byte loads."""
    gate, up, down = shape.layers[layer].experts
    n = shape.n_expert
    lay = BlobLayout(gate.ggml_type, down.ggml_type, gate.slice_bytes(n), down.slice_bytes(n),
                     up_type=up.ggml_type, up_bytes=up.slice_bytes(n))
    for name, size in (("gate", lay.gate_bytes), ("up", lay.up_bytes)):
        if size % 16:
            raise ValueError(f"layer {layer}: an expert's {name} matrix is {size} bytes, "
                             f"not a multiple of 16 (the kernels' aligned loads need it)")
    return lay


class HostStore:
    """Expert blobs (and optionally the token embedding) in one uint8 host buffer.

    `host_off[layer, expert]` is the byte offset of that blob in `buffer`; `embd_off` the offset
    of token_embd's rows (or -1). Without `experts` (a run whose VRAM cache holds every expert
    and never gives one back: `strata.plan.host.keeps_experts`) the buffer holds the embedding
    alone: the layouts and `host_off` stay (the kernels take the table, never reading it for a
    pair the cache holds), and `blob` refuses."""

    def __init__(self, shape: ModelShape, *, with_embd: bool, embd_bytes: int = 0,
                 experts: bool = True):
        self.shape = shape
        self.has_experts = experts
        self.layouts = tuple(blob_layout(shape, i) for i in range(shape.n_layer))
        strides = [_align(lay.n_bytes) for lay in self.layouts]
        off = np.zeros((shape.n_layer, shape.n_expert), np.int64)  # [n_layer, n_expert] int64
        pos = 0
        for i, stride in enumerate(strides):
            off[i] = pos + np.arange(shape.n_expert, dtype=np.int64) * stride
            pos += stride * shape.n_expert
        self.host_off = off
        self.layer_base = tuple(int(off[i, 0]) for i in range(shape.n_layer))
        self.strides = tuple(strides)
        self.expert_bytes = pos if experts else 0  # the experts' part, blobs aligned
        self.embd_off = self.expert_bytes if with_embd else -1
        self.n_bytes = self.expert_bytes + (_align(embd_bytes) if with_embd else 0)
        self.buffer = np.empty(max(self.n_bytes, BLOB_ALIGN), np.uint8)  # [n_bytes] uint8
        self.fill_seconds = 0.0

    def _check_experts(self) -> None:
        if not self.has_experts:
            raise RuntimeError("this host store keeps no experts (the VRAM cache holds them all "
                               "and never gives one back); an expert was asked of it")

    def blob(self, layer: int, expert: int) -> np.ndarray:
        """The blob of (layer, expert): a uint8 view of `buffer`."""
        self._check_experts()
        off = int(self.host_off[layer, expert])
        return self.buffer[off:off + self.layouts[layer].n_bytes]

    def layer_blobs(self, layer: int) -> np.ndarray:
        """[n_expert, stride] uint8 view: row e holds expert e's blob (and its alignment pad)."""
        self._check_experts()
        base, stride = self.layer_base[layer], self.strides[layer]
        return self.buffer[base:base + stride * self.shape.n_expert].reshape(-1, stride)

    def embd(self, n_rows: int, row_bytes: int) -> np.ndarray:
        """token_embd's rows [n_rows, row_bytes] (only when built with the embedding)."""
        if self.embd_off < 0:
            raise ValueError("this host store was built without the token embedding")
        return self.buffer[self.embd_off:self.embd_off + n_rows * row_bytes].reshape(
            n_rows, row_bytes)

    def fill_from(self, model: ModelFile, *, progress: Progress | None = None) -> float:
        """Copy every expert (and the embedding) out of the mapped file on `fill_threads()`
        threads, one (layer, tensor) piece a task; returns seconds. The bytes are the same
        whatever the thread count (each piece has one writer); progress is reported from the
        calling thread, in bytes of whole pieces."""
        t0 = time.perf_counter()
        tasks: list[tuple[Callable[[], None], int]] = []  # (copy, bytes it writes)
        for il in range(self.shape.n_layer if self.has_experts else 0):
            lay, rows = self.layouts[il], self.layer_blobs(il)
            n = self.shape.n_expert
            parts = ((0, lay.gate_bytes), (lay.up_off, lay.up_bytes),
                     (lay.down_off, lay.down_bytes))
            for name, (off, size) in zip(EXPERT_NAMES, parts):
                src = model.raw(f"blk.{il}.{name}.weight").reshape(n, size)
                tasks.append((_copier(rows[:, off:off + size], src), n * size))
        if self.embd_off >= 0:
            src = model.raw("token_embd.weight").reshape(-1)
            tasks.append((_copier(self.buffer[self.embd_off:self.embd_off + src.size], src),
                          src.size))
        # progress: the bytes copied scaled to n_bytes (the alignment pads in), ending there
        total, done, scale = self.n_bytes, 0, self.n_bytes / max(1, sum(b for _, b in tasks))
        n_threads = fill_threads()
        if n_threads == 1:
            for copy, n_bytes in tasks:
                copy()
                done += n_bytes
                if progress is not None:
                    progress(min(total, round(done * scale)), total)
        else:
            with ThreadPoolExecutor(n_threads, thread_name_prefix="store-fill") as pool:
                futures = [(pool.submit(copy), n_bytes) for copy, n_bytes in tasks]
                for fut, n_bytes in futures:  # in submission order: a failure is raised here
                    fut.result()
                    done += n_bytes
                    if progress is not None:
                        progress(min(total, round(done * scale)), total)
        if progress is not None:
            progress(total, total)
        self.fill_seconds = time.perf_counter() - t0
        return self.fill_seconds


def _copier(dst: np.ndarray, src: np.ndarray) -> Callable[[], None]:
    def copy() -> None:
        dst[...] = src
    return copy


def build_store(model: ModelFile, *, with_embd: bool, progress: Progress | None = None,
                experts: bool = True) -> HostStore:
    """A filled `HostStore` of `model` (without the experts where `experts` is False)."""
    embd = model.tensors["token_embd.weight"].n_bytes if with_embd else 0
    store = HostStore(model.shape, with_embd=with_embd, embd_bytes=embd, experts=experts)
    store.fill_from(model, progress=progress)
    return store
