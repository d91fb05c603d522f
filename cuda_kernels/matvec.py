"""Matrix-vector products directly on quantized rows: y = W x for one token (decode) and for a small
batch of 2..8 tokens, every supported format; x float32 or float16, y float32.

One warp per output row: lane l takes the row's 32-value groups l, l+32, ... through the format's
fused `dot32t` (one token) or decodes each group once with `dq32t` and dots it with every token's
x (batch), then the warp reduces with shuffles. x is staged in shared memory (see `xstage`: read
from global memory, one warp load of x touched 32 cache lines) and so is the format's lookup table
(constant memory serialises lanes that read different entries). Each kernel is specialised per
(format, batch size), so the batch loop unrolls and the per-token sums stay in registers.

Measured on an H200 (bench/results/2026-11-29_kernels_decode.json) this reaches 10-30% of the HBM
read bandwidth, not the 70% aimed at: each lane decodes a whole 32-value group alone, so a warp's
weight loads are strided rather than contiguous and the per-value integer work (64-bit index
arithmetic from numba's int64 typing) are the likely limits (not yet profiled).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, from_dtype, types

from .intrinsics import ld_x4, warp_sum
from .xstage import XPAD, stage_x, staged_bytes
from .launch import check_array, device_table, flat, n_blocks, register_ptx
from .qformats import BY_NAME, FORMATS, get_format

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
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        tab_s[i] = tab[i]


def _single(fmt):
    dot32t = fmt.dot32t
    n_tab, tab_type, has_tab = _table(fmt)

    @cuda.jit
    def matvec1(w, row_bytes, n_groups, n_rows, x, y, tab):
        # w: [n_rows * row_bytes] u8; x: [n_cols] f32|f16; y: [n_rows] f32; tab: the format's
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
            y[row] = s
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


def matvec(w, ggml_type, x, y, *, stream=0) -> None:
    """y = W x on quantized rows. `w`: uint8, C-contiguous, 1-D or [n_rows, row_bytes], starting
    16-byte aligned; `x`: [n_cols] or [n_tok, n_cols] float32/float16 (n_tok <= 8); `y`: [n_rows]
    or [n_tok, n_rows] float32. n_cols must be a multiple of the format's block size."""
    fmt = get_format(ggml_type)
    check_array("x", x, (np.float32, np.float16))
    if len(x.shape) not in (1, 2):
        raise ValueError(f"x: shape {tuple(x.shape)}, expected [n_cols] or [n_tok, n_cols]")
    n_tok = 1 if len(x.shape) == 1 else x.shape[0]
    n_cols = tuple(x.shape)[-1]
    if not 1 <= n_tok <= MAX_TOKENS:
        raise ValueError(f"x: {n_tok} tokens, matvec takes 1..{MAX_TOKENS}")
    row_bytes = fmt.row_bytes(n_cols)
    check_array("y", y, np.float32)
    if len(y.shape) != len(x.shape) or (n_tok > 1 and y.shape[0] != n_tok):
        raise ValueError(f"y: shape {tuple(y.shape)} does not match x {tuple(x.shape)}")
    n_rows = tuple(y.shape)[-1]
    check_array("w", w, np.uint8)
    if w.size < n_rows * row_bytes:
        raise ValueError(f"w: {w.size} bytes, {fmt.name} [{n_rows}, {n_cols}] needs "
                         f"{n_rows * row_bytes}")
    n_groups = n_cols // 32
    tile = batch_tile_groups(n_tok)
    smem = staged_bytes(min(n_groups, tile) if n_tok == 1 else n_tok * tile)
    kernel_for(fmt.ggml_type, n_tok)[n_blocks(n_rows, WARPS), THREADS, stream, smem](
        flat(w), row_bytes, n_groups, n_rows, flat(x), flat(y), device_table(fmt))


def _ptx(fmt, n_tok, x_type):
    def build():
        k = _single(fmt) if n_tok == 1 else _batched(fmt, n_tok)
        tab = types.Array(from_dtype(fmt.table.dtype), 1, "C")
        return k.py_func, (types.uint8[::1], types.int64, types.int64, types.int64,
                           x_type[::1], types.float32[::1], tab)
    return build


for _f in FORMATS.values():
    register_ptx("matvec", f"matvec1_{_f.name}_f32", _ptx(_f, 1, types.float32))
    register_ptx("matvec", f"matvec1_{_f.name}_f16", _ptx(_f, 1, types.float16))
    register_ptx("matvec", f"matvec8_{_f.name}_f32", _ptx(_f, 8, types.float32))
for _n in range(2, MAX_TOKENS):
    register_ptx("matvec", f"matvec{_n}_Q4_K_f32", _ptx(BY_NAME["Q4_K"], _n, types.float32))
