"""Grouping a chunk's (token, expert) pairs by expert, on the device, and bringing results back.

A prefill chunk of `n_tokens` tokens routed to `k_top` experts each has `n_entries = n_tokens *
k_top` entries; entry `i` is token `i // k_top`, slot `i % k_top`. Three kernels group them:

1. count:   counts[e] = number of entries routed to expert e (ids out of range go to counts[-1])
2. scan:    offsets = exclusive scan of counts; the GEMM tile schedule (one tile of `tile_rows`
            rows per started block of each expert's rows: tile_group, tile_m0, n_tiles)
3. scatter: perm[p] = the entry at permuted position p (entries of expert e occupy
            offsets[e]:offsets[e+1]); inv[i] = the position of entry i (-1 for a bad id)

`combine` then gathers the per-position expert outputs back: out[t] = sum_s w[t, s] *
y[inv[t * k_top + s]]. Nothing here is host-synchronised: a CUDA graph can capture it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import cuda

from .launch import flat

MAX_EXPERTS = 1024  # the scan runs in one block of at most 1024 threads
GRID_THREADS = 256


@cuda.jit
def _zero_counts(counts):
    i = cuda.grid(1)
    if i < counts.shape[0]:
        counts[i] = 0


@cuda.jit
def _count(ids, n_experts, counts):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, ids.shape[0], stride):
        e = ids[i]
        if e < 0 or e >= n_experts:
            e = n_experts  # the bad-id cell: never placed, never read by the GEMMs
        cuda.atomic.add(counts, e, 1)


@cuda.jit
def _scan(counts, n_experts, tile_rows, offsets, cursor, tile_group, tile_m0, n_tiles):
    s_rows = cuda.shared.array(MAX_EXPERTS, np.int32)
    s_tiles = cuda.shared.array(MAX_EXPERTS, np.int32)
    e = cuda.threadIdx.x
    n = counts[e] if e < n_experts else 0
    t = (n + tile_rows - 1) // tile_rows
    s_rows[e] = n
    s_tiles[e] = t
    cuda.syncthreads()
    step = 1
    while step < cuda.blockDim.x:  # Hillis-Steele inclusive scan of both columns
        add_rows = s_rows[e - step] if e >= step else 0
        add_tiles = s_tiles[e - step] if e >= step else 0
        cuda.syncthreads()
        s_rows[e] += add_rows
        s_tiles[e] += add_tiles
        cuda.syncthreads()
        step *= 2
    first_row = s_rows[e] - n
    first_tile = s_tiles[e] - t
    if e < n_experts:
        offsets[e] = first_row
        cursor[e] = first_row
        for i in range(t):
            tile_group[first_tile + i] = e
            tile_m0[first_tile + i] = i * tile_rows
    if e == n_experts - 1:
        offsets[n_experts] = s_rows[e]
        n_tiles[0] = s_tiles[e]


@cuda.jit
def _scatter(ids, n_experts, cursor, perm, inv):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, ids.shape[0], stride):
        e = ids[i]
        if e < 0 or e >= n_experts:
            inv[i] = -1
        else:
            p = cuda.atomic.add(cursor, e, 1)
            perm[p] = i
            inv[i] = p


@cuda.jit
def _combine(y, inv, weights, accumulate, out):
    t = cuda.blockIdx.x
    k_top = weights.shape[1]
    for c in range(cuda.threadIdx.x + cuda.blockIdx.y * cuda.blockDim.x, out.shape[1],
                   cuda.blockDim.x * cuda.gridDim.y):
        s = np.float32(0.0)
        for j in range(k_top):
            p = inv[t * k_top + j]
            if p >= 0:
                s += weights[t, j] * y[p, c]
        if accumulate:
            s += out[t, c]
        out[t, c] = s


@dataclass(frozen=True, slots=True)
class Routing:
    """Device arrays describing one chunk's entries grouped by expert (see the module docstring)."""

    n_tokens: int
    k_top: int
    n_experts: int
    tile_rows: int
    counts: object      # [n_experts + 1] int32 (last: entries with an out-of-range id)
    offsets: object     # [n_experts + 1] int32
    cursor: object      # [n_experts] int32 (scratch of the scatter)
    perm: object        # [n_entries] int32: entry at each permuted position
    inv: object         # [n_entries] int32: permuted position of each entry, -1 if dropped
    tile_group: object  # [max_tiles] int32: expert of each GEMM row tile
    tile_m0: object     # [max_tiles] int32: first row of the tile within its expert's rows
    n_tiles: object     # [1] int32: tiles in use

    def __post_init__(self):
        for name in ("n_tokens", "k_top", "n_experts", "tile_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"Routing.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_experts > MAX_EXPERTS:
            raise ValueError(f"Routing supports at most {MAX_EXPERTS} experts, got {self.n_experts}")

    @property
    def n_entries(self) -> int:
        return self.n_tokens * self.k_top

    @property
    def max_tiles(self) -> int:
        return max_tiles(self.n_entries, self.n_experts, self.tile_rows)


def max_tiles(n_entries: int, n_experts: int, tile_rows: int) -> int:
    """Upper bound of the row tiles of any grouping: every expert adds at most one partial tile."""
    return math.ceil(n_entries / tile_rows) + min(n_experts, n_entries)


def allocate_routing(n_tokens: int, k_top: int, n_experts: int, *, tile_rows: int) -> Routing:
    """Allocate the device arrays of a Routing (outside any CUDA graph capture)."""
    n_entries = n_tokens * k_top
    n_max = max_tiles(n_entries, n_experts, tile_rows)
    i32 = np.int32
    return Routing(
        n_tokens, k_top, n_experts, tile_rows,
        counts=cuda.device_array(n_experts + 1, i32), offsets=cuda.device_array(n_experts + 1, i32),
        cursor=cuda.device_array(n_experts, i32), perm=cuda.device_array(n_entries, i32),
        inv=cuda.device_array(n_entries, i32), tile_group=cuda.device_array(n_max, i32),
        tile_m0=cuda.device_array(n_max, i32), n_tiles=cuda.device_array(1, i32))


def _grid(n: int) -> int:
    return max(1, min(1024, math.ceil(n / GRID_THREADS)))


def route_tokens(topk_ids, routing: Routing, *, stream=0) -> Routing:
    """Group the entries of `topk_ids` ([n_tokens, k_top] int32, device) into `routing`."""
    want = (routing.n_tokens, routing.k_top)
    if tuple(topk_ids.shape) != want or topk_ids.dtype != np.int32:
        raise ValueError(f"topk_ids must be int32 {want}, got {topk_ids.dtype} "
                         f"{tuple(topk_ids.shape)}")
    ids = flat(topk_ids)  # [n_entries]
    n_exp = routing.n_experts
    _zero_counts[_grid(n_exp + 1), GRID_THREADS, stream](routing.counts)
    _count[_grid(routing.n_entries), GRID_THREADS, stream](ids, n_exp, routing.counts)
    scan_threads = max(32, 1 << (n_exp - 1).bit_length())
    _scan[1, scan_threads, stream](routing.counts, n_exp, routing.tile_rows, routing.offsets,
                                   routing.cursor, routing.tile_group, routing.tile_m0,
                                   routing.n_tiles)
    _scatter[_grid(routing.n_entries), GRID_THREADS, stream](ids, n_exp, routing.cursor,
                                                            routing.perm, routing.inv)
    return routing


def combine(y, routing: Routing, topk_weights, out, *, accumulate: bool = False, stream=0):
    """out[t] (+)= sum over slots s of topk_weights[t, s] * y[routing.inv[t * k_top + s]].

    y: [n_entries, n] f32 in permuted order (the down projection's output); topk_weights:
    [n_tokens, k_top] f32; out: [n_tokens, n] f32. With `accumulate` the sum is added to `out`
    (the residual stream) instead of replacing it.
    """
    n_tok, k_top = routing.n_tokens, routing.k_top
    if tuple(topk_weights.shape) != (n_tok, k_top) or topk_weights.dtype != np.float32:
        raise ValueError(f"topk_weights must be float32 {(n_tok, k_top)}, got "
                         f"{topk_weights.dtype} {tuple(topk_weights.shape)}")
    if y.ndim != 2 or y.shape[0] != routing.n_entries or y.dtype != np.float32:
        raise ValueError(f"y must be float32 [{routing.n_entries}, n], got {y.dtype} "
                         f"{tuple(y.shape)}")
    if tuple(out.shape) != (n_tok, y.shape[1]) or out.dtype != np.float32:
        raise ValueError(f"out must be float32 {(n_tok, y.shape[1])}, got {out.dtype} "
                         f"{tuple(out.shape)}")
    threads = 128
    col_blocks = max(1, min(8, math.ceil(y.shape[1] / threads)))
    _combine[(n_tok, col_blocks), threads, stream](y, routing.inv, topk_weights,
                                                   1 if accumulate else 0, out)
