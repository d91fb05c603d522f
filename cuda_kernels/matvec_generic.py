"""The generic matrix-vector kernels: one warp per row for every format, one token or a batch of
2..8 (`matvec.matvec` launches these where no lane decoding applies: formats without one,
batches, rows longer than the staged x fits).

Lane l takes the row's 32-value groups l, l+32, ... through the format's fused `dot32t` (one
token) or decodes each group once with `dq32t` and dots it with every token's x (batch), x staged
in shared memory per column tile (`xstage`). Each kernel is specialised per (format, batch size).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, from_dtype, types

from .intrinsics import ld_x4, warp_sum
from .launch import register_ptx
from .qformats import BY_NAME, FORMATS, get_format
from .xstage import XPAD, stage_x

WARPS = 4          # rows per block
THREADS = 32 * WARPS
MAX_TOKENS = 8
TILE_GROUPS = 128  # 4096 columns of x staged at a time (18 KiB of shared memory)
F0 = np.float32(0.0)

_CACHE: dict[tuple[int, int], object] = {}


def _table(fmt):
    """(staged table length, its dtype, whether to stage it) for a kernel factory."""
    return fmt.table.size, fmt.table.dtype.type, fmt.has_table


@cuda.jit(device=True, inline="always")
def stage_table(tab, tab_s, n):
    # a while loop: a range with the block size as its step costs a 64-bit division per thread
    i = cuda.threadIdx.x
    while i < n:
        tab_s[i] = tab[i]
        i += cuda.blockDim.x


def _single(fmt):
    dot32t = fmt.dot32t
    n_tab, tab_type, has_tab = _table(fmt)

    @cuda.jit
    def matvec1(w, row_bytes, n_groups, n_rows, x, y, accumulate, tab):
        # w: [n_rows * row_bytes] u8; x: [n_cols] f32|f16; y: [n_rows] f32 (= or += W x);
        # tab: the format's
        # table; dynamic shared: [TILE_GROUPS * XPAD] f32, x staged one column tile at a time
        tab_s = cuda.shared.array(n_tab, tab_type)
        if has_tab:
            stage_table(tab, tab_s, n_tab)
        xs = cuda.shared.array(0, types.float32)
        lane = cuda.threadIdx.x & 31
        row = cuda.blockIdx.x * WARPS + (cuda.threadIdx.x >> 5)
        off = row * row_bytes
        acc = F0
        for g0 in range(0, n_groups, TILE_GROUPS):
            ng = min(TILE_GROUPS, n_groups - g0)
            cuda.syncthreads()
            stage_x(x, g0 * 32, ng * 32, xs, 0)
            cuda.syncthreads()
            if row < n_rows:
                for j in range(lane, ng, 32):
                    acc += dot32t(w, off, g0 + j, xs, j * XPAD, tab_s)
        s = warp_sum(acc)
        if lane == 0 and row < n_rows:
            y[row] = y[row] + s if accumulate else s
    return matvec1


def _batched(fmt, n_tok):
    dq32t = fmt.dq32t
    tile = batch_tile_groups(n_tok)
    n_tab, tab_type, has_tab = _table(fmt)

    @cuda.jit
    def matvec_batch(w, row_bytes, n_groups, n_rows, x, y, tab):
        # w: [n_rows * row_bytes] u8; x: [n_tok * n_cols] f32|f16; y: [n_tok * n_rows] f32;
        # dynamic shared: [n_tok, tile * XPAD] f32
        tab_s = cuda.shared.array(n_tab, tab_type)
        if has_tab:
            stage_table(tab, tab_s, n_tab)
        xs = cuda.shared.array(0, types.float32)
        lane = cuda.threadIdx.x & 31
        row = cuda.blockIdx.x * WARPS + (cuda.threadIdx.x >> 5)
        n_cols = n_groups * 32
        off = row * row_bytes
        acc = cuda.local.array(n_tok, np.float32)
        vals = cuda.local.array(32, np.float32)
        for t in range(n_tok):
            acc[t] = F0
        for g0 in range(0, n_groups, tile):
            ng = min(tile, n_groups - g0)
            cuda.syncthreads()
            for t in range(n_tok):
                stage_x(x, t * n_cols + g0 * 32, ng * 32, xs, t * tile * XPAD)
            cuda.syncthreads()
            if row < n_rows:
                for j in range(lane, ng, 32):
                    dq32t(w, off, g0 + j, vals, 0, tab_s)
                    for t in range(n_tok):
                        s = F0
                        for i in range(8):
                            x0, x1, x2, x3 = ld_x4(xs, t * tile * XPAD + j * XPAD + 4 * i)
                            s += (vals[4 * i] * x0 + vals[4 * i + 1] * x1
                                  + vals[4 * i + 2] * x2 + vals[4 * i + 3] * x3)
                        acc[t] += s
        for t in range(n_tok):
            s = warp_sum(acc[t])
            if lane == 0 and row < n_rows:
                y[t * n_rows + row] = s
    return matvec_batch


def batch_tile_groups(n_tok: int) -> int:
    """Column groups staged per tile for n_tok tokens (shared memory <= ~37 KiB)."""
    return TILE_GROUPS if n_tok == 1 else 32


def kernel_for(ggml_type, n_tok: int):
    """The compiled-on-first-use kernel for (format, batch size)."""
    fmt = get_format(ggml_type)
    key = (fmt.ggml_type, n_tok)
    k = _CACHE.get(key)
    if k is None:
        k = _single(fmt) if n_tok == 1 else _batched(fmt, n_tok)
        _CACHE[key] = k
    return k


def _ptx(fmt, n_tok, x_type):
    def build():
        k = _single(fmt) if n_tok == 1 else _batched(fmt, n_tok)
        tab = types.Array(from_dtype(fmt.table.dtype), 1, "C")
        one = (types.boolean,) if n_tok == 1 else ()  # accumulate
        return k.py_func, (types.uint8[::1], types.int64, types.int64, types.int64,
                           x_type[::1], types.float32[::1]) + one + (tab,)
    return build


for _f in FORMATS.values():
    register_ptx("matvec", f"matvec1_{_f.name}_f32", _ptx(_f, 1, types.float32))
    register_ptx("matvec", f"matvec1_{_f.name}_f16", _ptx(_f, 1, types.float16))
    register_ptx("matvec", f"matvec8_{_f.name}_f32", _ptx(_f, 8, types.float32))
for _n in range(2, MAX_TOKENS):
    register_ptx("matvec", f"matvec{_n}_Q4_K_f32", _ptx(BY_NAME["Q4_K"], _n, types.float32))
