"""Small-batch (2..8 tokens) matrix-vector products on the tensor cores, for the K-quant formats
of the usual mixes (Q4_K, Q6_K): y[t] = W x[t] with each weight dequantized once for the whole
batch.

Why: the lane kernels (`lanes_batch`) decode every weight again for each token and re-read x
from shared memory per token; at 8 tokens the dense matvecs of a batched step were compute bound
at 5-20% of the read bandwidth. Here a warp's `mma.m16n8k16` multiplies 16 weight rows (A, f16)
by the 8 tokens' x (B, one column per token), so a weight costs about one f16 operation however
many tokens share it, and the kernel is bound by the weight reads again.

Precision and fragment use: `tc_superblock` (f16 weights exact, x split into hi + lo f16 parts:
about 2^-22 relative, not bit for bit against the one-token lane kernels, which sum in another
order; columns never mix, so a token's result does not depend on the batch).

A block covers `rows_per_warp` (R) 16-row tiles; its warps take the row's super-blocks in turn
and meet in shared memory, summed in warp order (deterministic). With R = 2 a warp issues both
tiles' weight loads before any math and shares the x loads and the x split between them: twice
the bytes in flight per warp. Measured on the H200 with R = 1 (serve_matvec, 8 tokens): Q4_K
2048->4096 6.5 us (16% of the read ceiling), the Q6_K head 2048->151936 197 us (1.3 TB/s):
latency bound, each warp waiting out one super-block's loads at a time.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, types

from .intrinsics import SIMULATED
from .launch import check_array, flat, register_ptx
from .qformats import get_format
from .tc_superblock import F0, SB_VALUES, TC_FORMATS, put4

MAX_TOKENS = 8
TC_WARPS = 8            # warps of a block (fewer when the row has fewer super-blocks)
TILE_ROWS = 16
ROWS_PER_WARP = (1, 2)  # the variants: 16-row tiles a warp (and a block) covers
DEFAULT_ROWS_PER_WARP = 1
# Registers (ptxas 13.0, unbounded): one tile 70 (Q4_K) / 72 (Q6_K): three 256-thread blocks an
# SM; two tiles of Q4_K 104: two blocks. Two tiles of Q6_K took 134 and are bounded to two blocks
# (128, no spill); bounding Q4_K's two tiles the same way made ptxas spill 44 bytes.
_TWO_BLOCKS = {"launch_bounds": (32 * TC_WARPS, 2)}


def jit_options(name: str, rows_per_warp: int) -> dict:
    """The `cuda.jit` options of a variant (and of its compile-check entry)."""
    return _TWO_BLOCKS if (name, rows_per_warp) == ("Q6_K", 2) else {}


_CACHE: dict[tuple[str, int], object] = {}


@cuda.jit(device=True, inline="always")
def _offs(row0, n_rows, row_bytes, o):
    """Byte offsets of super-block byte o of this lane's rows a, b in the tile starting at row0
    (clamped to the last row: a partial tile's missing rows read a real row and are never
    written). Made per super-block: a loop-carried offset costs registers the tiles' words
    need."""
    return (min(row0, n_rows - 1) * row_bytes + o, min(row0 + 8, n_rows - 1) * row_bytes + o)


@cuda.jit(device=True, inline="always")
def _zeros4():
    return F0, F0, F0, F0


@cuda.jit(device=True, inline="always")
def _zeros8():
    return F0, F0, F0, F0, F0, F0, F0, F0


@cuda.jit(device=True, inline="always")
def _put8(red, i, acc):
    a0, a1, a2, a3, a4, a5, a6, a7 = acc
    put4(red, i, (a0, a1, a2, a3))
    put4(red, i + 4, (a4, a5, a6, a7))


def _tile_fns(name: str, rows_per_warp: int):
    """(zero accumulators, store to shared memory, one super-block of the warp's tiles) of a
    variant."""
    fmt = TC_FORMATS[name]
    load, math1, math2 = fmt.load, fmt.math1, fmt.math2
    if rows_per_warp == 1:
        @cuda.jit(device=True, inline="always")
        def sb1(w, row0, n_rows, row_bytes, o, x, xb, lane, acc):
            off_a, off_b = _offs(row0, n_rows, row_bytes, o)
            return math1(load(w, off_a, off_b, lane), x, xb, lane, acc)
        return _zeros4, put4, sb1

    @cuda.jit(device=True, inline="always")
    def sb2(w, row0, n_rows, row_bytes, o, x, xb, lane, acc):
        off_a, off_b = _offs(row0, n_rows, row_bytes, o)
        words0 = load(w, off_a, off_b, lane)
        off_a, off_b = _offs(row0 + TILE_ROWS, n_rows, row_bytes, o)
        words1 = load(w, off_a, off_b, lane)
        return math2(words0, words1, x, xb, lane, acc)
    return _zeros8, _put8, sb2


def _kernel(name: str, rows_per_warp: int):
    zeros, put, sb_fn = _tile_fns(name, rows_per_warp)
    sb_bytes = TC_FORMATS[name].sb_bytes
    n_acc = 4 * rows_per_warp                  # accumulators a lane holds
    red_floats = TC_WARPS * 32 * n_acc        # [warp, lane, n_acc] f32 partial sums
    block_rows = TILE_ROWS * rows_per_warp

    @cuda.jit(**({} if SIMULATED else jit_options(name, rows_per_warp)))
    def matvec_tc(w, row_bytes, n_sb, n_rows, n_tok, x, y):
        # w: [n_rows * row_bytes] u8; x: [n_tok * n_sb * 256] f32; y: [n_tok * n_rows] f32;
        # grid: one block per rows_per_warp 16-row tiles; block: warps taking super-blocks in turn
        red = cuda.shared.array(red_floats, types.float32)
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        n_warps = cuda.blockDim.x >> 5
        g = lane >> 2
        t = lane & 3
        row0 = cuda.blockIdx.x * block_rows + g
        n_cols = n_sb * SB_VALUES
        xb = min(g, n_tok - 1) * n_cols  # columns past n_tok repeat a token, never written
        acc = zeros()
        for sb in range(warp, n_sb, n_warps):
            acc = sb_fn(w, row0, n_rows, row_bytes, sb * sb_bytes, x, xb + sb * SB_VALUES, lane,
                        acc)
        put(red, (warp * 32 + lane) * n_acc, acc)
        cuda.syncthreads()
        if warp == 0:
            for q in range(n_acc):  # accumulator q: tile q >> 2, (row a|b, token 2t|2t+1)
                s = red[lane * n_acc + q]
                for k in range(1, n_warps):
                    s += red[(k * 32 + lane) * n_acc + q]
                tok = 2 * t + (q & 1)
                row = row0 + TILE_ROWS * (q >> 2) + 8 * ((q >> 1) & 1)
                if tok < n_tok and row < n_rows:
                    y[tok * n_rows + row] = s
    return matvec_tc


def tc_kernel(name: str, rows_per_warp: int = DEFAULT_ROWS_PER_WARP):
    """The compiled-on-first-use kernel of a format ("Q4_K", "Q6_K") and variant."""
    key = (name, rows_per_warp)
    k = _CACHE.get(key)
    if k is None:
        k = _CACHE[key] = _kernel(name, rows_per_warp)
    return k


def tc_fits(ggml_type, n_cols: int) -> bool:
    """Whether the tensor-core batch kernel takes rows of this format and width."""
    return get_format(ggml_type).name in TC_FORMATS and n_cols > 0 and n_cols % SB_VALUES == 0


def block_warps(n_sb: int) -> int:
    return max(1, min(TC_WARPS, n_sb))


def matvec_tc(w, ggml_type, x, y, *, stream=0,
              rows_per_warp: int = DEFAULT_ROWS_PER_WARP) -> None:
    """y[t] = W x[t] for 1..8 tokens on the tensor cores. `w`: uint8 rows (1-D or
    [n_rows, row_bytes], 16-byte aligned); x: float32 [n_tok, n_cols]; y: float32
    [n_tok, n_rows]. x must be finite and within f16 range (|x| < 65504): the kernels' inputs
    are normed activations and attention outputs. `rows_per_warp`: 16-row tiles a warp
    covers (1 or 2: the same arithmetic per row either way)."""
    if rows_per_warp not in ROWS_PER_WARP:
        raise ValueError(f"rows_per_warp {rows_per_warp!r}: the tensor-core batch matvec has "
                         f"variants {ROWS_PER_WARP}")
    check_array("x", x, np.float32)
    check_array("y", y, np.float32)
    if len(x.shape) != 2 or len(y.shape) != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"x {tuple(x.shape)} and y {tuple(y.shape)} must be [n_tok, n_cols] "
                         f"and [n_tok, n_rows]")
    n_tok, n_cols = x.shape
    n_rows = y.shape[1]
    fmt = get_format(ggml_type)
    if not 1 <= n_tok <= MAX_TOKENS:
        raise ValueError(f"x: {n_tok} tokens, the tensor-core batch matvec takes "
                         f"1..{MAX_TOKENS}")
    if not tc_fits(ggml_type, n_cols):
        raise ValueError(f"{fmt.name} [{n_rows}, {n_cols}]: the tensor-core batch matvec takes "
                         f"{', '.join(TC_FORMATS)} rows of a multiple of {SB_VALUES} values")
    n_sb = n_cols // SB_VALUES
    row_bytes = n_sb * TC_FORMATS[fmt.name].sb_bytes
    check_array("w", w, np.uint8)
    if w.size < n_rows * row_bytes:
        raise ValueError(f"w: {w.size} bytes, {fmt.name} [{n_rows}, {n_cols}] needs "
                         f"{n_rows * row_bytes}")
    if n_rows == 0:
        return
    grid = -(-n_rows // (TILE_ROWS * rows_per_warp))
    tc_kernel(fmt.name, rows_per_warp)[grid, 32 * block_warps(n_sb), stream](
        flat(w), row_bytes, n_sb, n_rows, n_tok, flat(x), flat(y))


def register_tc(family: str, name: str, rows_per_warp: int = DEFAULT_ROWS_PER_WARP) -> None:
    """Put a format's tensor-core batch kernel (one variant) in the compile registry."""
    def build():
        i64, f32 = types.int64, types.float32[::1]
        return (tc_kernel(name, rows_per_warp).py_func,
                (types.uint8[::1], i64, i64, i64, i64, f32, f32))
    suffix = "" if rows_per_warp == 1 else f"_r{rows_per_warp}"
    register_ptx(family, f"matvec_tc_{name}{suffix}", build,
                 options=jit_options(name, rows_per_warp))


for _name in TC_FORMATS:
    for _r in ROWS_PER_WARP:
        register_tc("batch", _name, _r)
