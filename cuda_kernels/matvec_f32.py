"""Matrix-vector products on float rows (F32 or F16 weights, e.g. the MoE router's F32
[n_expert, n_embd]) for 1..8 tokens: y[t] = W x[t] (or y[t] += W x[t]), x and y float32.

The generic kernels give such a matrix a warp per row and four rows per block: a 128-row router
is 32 blocks, and their batch kernel keeps its values in local memory. Here each row gets a block
whose 1-4 warps split the row into 16-byte chunks (4 f32 or 8 f16 values): thread i takes chunks
i, i + n_threads, ..., four per step, all four loads of a step issued before any is used. Weights
and x are read through the read-only path (`ld.global.nc`): x, 64 KiB for 8 tokens of 2048
columns, is served by L1/L2 rather than staged in shared memory. Each token has its own
accumulator in a register (a kernel per token count); the accumulators are summed over the warp
and then over the warps in warp order, a summation order that depends on the row width only, so
a token's result is bit-identical whatever the batch size or the other tokens (batch-invariant)
and from run to run.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, types

from .intrinsics import SIMULATED, h2f, ld_nc_u32x4, u2f, warp_sum
from .launch import check_array, flat, register_ptx
from .qformats import get_format

MAX_TOKENS = 8
MAX_WARPS = 4
PART_SLOTS = MAX_WARPS * MAX_TOKENS  # shared per-warp sums, [warp, token]
UNROLL = 4         # chunks per thread per step, loaded before any is used
CHUNK_BYTES = 16   # one ld.global.nc.v4 per chunk
VALUE_BYTES = {"F32": 4, "F16": 2}  # the weight formats taken, by GGML name
F0 = np.float32(0.0)

if SIMULATED:

    def ld_nc_f32x4(x, i):
        """x[i:i+4] of a float32 array (i a multiple of 4) through the read-only path."""
        if int(i) % 4:
            raise IndexError(f"misaligned 128-bit load at float32 index {i}")
        return np.float32(x[i]), np.float32(x[i + 1]), np.float32(x[i + 2]), np.float32(x[i + 3])

else:  # pragma: no cover - compiled for the device (PTX check and GPU tests)

    @cuda.jit(device=True, inline="always")
    def ld_nc_f32x4(x, i):
        a, b, c, d = ld_nc_u32x4(x, i * 4)
        return u2f(a), u2f(b), u2f(c), u2f(d)


@cuda.jit(device=True, inline="always")
def wdot_f32(wc, x0, x1, x2, x3):
    """One chunk: four f32 weights (the words of wc) dotted with the values x0..x3."""
    return u2f(wc[0]) * x0 + u2f(wc[1]) * x1 + u2f(wc[2]) * x2 + u2f(wc[3]) * x3


@cuda.jit(device=True, inline="always")
def wdot_f16(wc, x0, x1, x2, x3, x4, x5, x6, x7):
    """One chunk: eight f16 weights (two per word of wc, low half first) dotted with x0..x7."""
    lo = (h2f(wc[0] & 0xFFFF) * x0 + h2f(wc[0] >> 16) * x1 + h2f(wc[1] & 0xFFFF) * x2
          + h2f(wc[1] >> 16) * x3)
    hi = (h2f(wc[2] & 0xFFFF) * x4 + h2f(wc[2] >> 16) * x5 + h2f(wc[3] & 0xFFFF) * x6
          + h2f(wc[3] >> 16) * x7)
    return lo + hi


@cuda.jit(device=True, inline="always")
def dot_f32(wc, x, i):
    """One chunk: four f32 weights (the words of wc) dotted with x[i:i+4]."""
    x0, x1, x2, x3 = ld_nc_f32x4(x, i)
    return wdot_f32(wc, x0, x1, x2, x3)


@cuda.jit(device=True, inline="always")
def dot_f16(wc, x, i):
    """One chunk: eight f16 weights (two per word of wc, low half first) dotted with x[i:i+8]."""
    x0, x1, x2, x3 = ld_nc_f32x4(x, i)
    x4, x5, x6, x7 = ld_nc_f32x4(x, i + 4)
    return wdot_f16(wc, x0, x1, x2, x3, x4, x5, x6, x7)


@cuda.jit(device=True, inline="always")
def load_chunks4(w, off, c0, n_threads, last):
    """A thread's four chunks c0, c0 + n_threads, c0 + 2 n_threads, c0 + 3 n_threads of the row
    at byte `off`, all issued before any is used; a chunk past the row's end (index > last)
    loads the row's last chunk again (in bounds, never used)."""
    return (ld_nc_u32x4(w, off + CHUNK_BYTES * c0),
            ld_nc_u32x4(w, off + CHUNK_BYTES * min(c0 + n_threads, last)),
            ld_nc_u32x4(w, off + CHUNK_BYTES * min(c0 + 2 * n_threads, last)),
            ld_nc_u32x4(w, off + CHUNK_BYTES * min(c0 + 3 * n_threads, last)))


@cuda.jit(device=True, inline="always")
def put_warp_sum(part, k, v, lane):
    """The warp's sum of v into part[k] (every lane calls it; lane 0 writes)."""
    s = warp_sum(v)
    if lane == 0:
        part[k] = s


def _factory(name: str, n_tok: int):
    dot = dot_f32 if name == "F32" else dot_f16
    per_chunk = CHUNK_BYTES // VALUE_BYTES[name]  # values per chunk
    T = n_tok  # a compile-time constant: the branches on it fold away

    @cuda.jit(device=True, inline="always")
    def add_chunk(acc, wc, x, i, n_cols):
        # every token's accumulator plus its dot with one weight chunk (x[t] at t * n_cols + i)
        a0, a1, a2, a3, a4, a5, a6, a7 = acc
        a0 += dot(wc, x, i)
        if T > 1:
            a1 += dot(wc, x, i + n_cols)
        if T > 2:
            a2 += dot(wc, x, i + 2 * n_cols)
        if T > 3:
            a3 += dot(wc, x, i + 3 * n_cols)
        if T > 4:
            a4 += dot(wc, x, i + 4 * n_cols)
        if T > 5:
            a5 += dot(wc, x, i + 5 * n_cols)
        if T > 6:
            a6 += dot(wc, x, i + 6 * n_cols)
        if T > 7:
            a7 += dot(wc, x, i + 7 * n_cols)
        return a0, a1, a2, a3, a4, a5, a6, a7

    @cuda.jit(device=True, inline="always")
    def put_sums(acc, part, base, lane):
        a0, a1, a2, a3, a4, a5, a6, a7 = acc
        put_warp_sum(part, base, a0, lane)
        if T > 1:
            put_warp_sum(part, base + 1, a1, lane)
        if T > 2:
            put_warp_sum(part, base + 2, a2, lane)
        if T > 3:
            put_warp_sum(part, base + 3, a3, lane)
        if T > 4:
            put_warp_sum(part, base + 4, a4, lane)
        if T > 5:
            put_warp_sum(part, base + 5, a5, lane)
        if T > 6:
            put_warp_sum(part, base + 6, a6, lane)
        if T > 7:
            put_warp_sum(part, base + 7, a7, lane)

    @cuda.jit
    def matvec_float(w, n_rows, n_cols, x, y, accumulate):
        # w: [n_rows, n_cols] F32|F16 as u8 (rows of whole 16-byte chunks, 16-byte aligned);
        # x: [T * n_cols] f32; y: [T * n_rows] f32 (= or += W x); block b: row b
        part = cuda.shared.array(PART_SLOTS, types.float32)  # [warp, token]
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        n_threads = cuda.blockDim.x
        n_chunks = n_cols // per_chunk
        last = n_chunks - 1
        off = row * n_chunks * CHUNK_BYTES
        acc = (F0, F0, F0, F0, F0, F0, F0, F0)
        for c0 in range(tid, n_chunks, UNROLL * n_threads):
            c1 = c0 + n_threads
            c2 = c1 + n_threads
            c3 = c2 + n_threads
            w0, w1, w2, w3 = load_chunks4(w, off, c0, n_threads, last)
            acc = add_chunk(acc, w0, x, per_chunk * c0, n_cols)
            if c1 < n_chunks:
                acc = add_chunk(acc, w1, x, per_chunk * c1, n_cols)
            if c2 < n_chunks:
                acc = add_chunk(acc, w2, x, per_chunk * c2, n_cols)
            if c3 < n_chunks:
                acc = add_chunk(acc, w3, x, per_chunk * c3, n_cols)
        put_sums(acc, part, (tid >> 5) * MAX_TOKENS, tid & 31)
        cuda.syncthreads()
        if tid < T:
            s = part[tid]
            for k in range(1, n_threads >> 5):  # warp order: fixed by the row width alone
                s += part[k * MAX_TOKENS + tid]
            i = tid * n_rows + row
            y[i] = y[i] + s if accumulate else s
    return matvec_float


_CACHE: dict[tuple[str, int], object] = {}


def kernel_for(name: str, n_tok: int):
    """The compiled-on-first-use kernel for (weight format name "F32"|"F16", token count)."""
    key = (name, n_tok)
    k = _CACHE.get(key)
    if k is None:
        k = _CACHE[key] = _factory(name, n_tok)
    return k


def n_warps(n_chunks: int) -> int:
    """Warps per row: enough for one step to cover the row, at most MAX_WARPS (a function of the
    row width alone, which keeps the summation order batch-invariant)."""
    return max(1, min(MAX_WARPS, -(-n_chunks // (32 * UNROLL))))


def float_format(ggml_type) -> str | None:
    """"F32" or "F16" when `ggml_type` (a GGML type number or name) is one this module takes."""
    name = get_format(ggml_type).name
    return name if name in VALUE_BYTES else None


def _check_aligned(name: str, a) -> None:
    """The 16-byte vector loads need the array's start 16-byte aligned (every allocation is; an
    offset view may not be). The simulator checks offsets relative to the start instead."""
    if not SIMULATED and a.__cuda_array_interface__["data"][0] % 16:
        raise ValueError(f"{name}: device pointer not 16-byte aligned")


def matvec_float(w, ggml_type, x, y, *, accumulate: bool = False, stream=0) -> None:
    """y = W x (`accumulate`: y += W x) for F32 or F16 weights and 1..8 tokens. `w`: uint8,
    C-contiguous, 1-D or [n_rows, row_bytes], the rows' raw values, 16-byte aligned; `x`: float32
    [n_cols] or [n_tok, n_cols]; `y`: float32 [n_rows] or [n_tok, n_rows]. n_cols must be a
    positive multiple of 4 (F32) or 8 (F16). One launch, no allocation: graph-capturable. A
    token's result does not depend on n_tok or the other tokens (bit-identical)."""
    name = float_format(ggml_type)
    if name is None:
        raise ValueError(f"matvec_float takes F32 or F16 weights, got "
                         f"{get_format(ggml_type).name}")
    check_array("x", x, np.float32)
    if len(x.shape) not in (1, 2):
        raise ValueError(f"x: shape {tuple(x.shape)}, expected [n_cols] or [n_tok, n_cols]")
    n_tok = 1 if len(x.shape) == 1 else x.shape[0]
    n_cols = tuple(x.shape)[-1]  # a tuple: the simulator's shapes take no negative index
    if not 1 <= n_tok <= MAX_TOKENS:
        raise ValueError(f"x: {n_tok} tokens, matvec_float takes 1..{MAX_TOKENS}")
    per_chunk = CHUNK_BYTES // VALUE_BYTES[name]
    if n_cols <= 0 or n_cols % per_chunk:
        raise ValueError(f"x: {n_cols} columns, {name} rows take a positive multiple of "
                         f"{per_chunk}")
    check_array("y", y, np.float32)
    if len(y.shape) != len(x.shape) or (len(y.shape) == 2 and y.shape[0] != n_tok):
        raise ValueError(f"y: shape {tuple(y.shape)} does not match x {tuple(x.shape)}")
    n_rows = tuple(y.shape)[-1]
    check_array("w", w, np.uint8)
    need = n_rows * n_cols * VALUE_BYTES[name]
    if w.size < need:
        raise ValueError(f"w: {w.size} bytes, {name} [{n_rows}, {n_cols}] needs {need}")
    _check_aligned("w", w)
    _check_aligned("x", x)
    if n_rows == 0:
        return
    threads = 32 * n_warps(n_cols // per_chunk)
    kernel_for(name, n_tok)[n_rows, threads, stream](
        flat(w), n_rows, n_cols, flat(x), flat(y), bool(accumulate))


_SIG = (types.uint8[::1], types.int64, types.int64, types.float32[::1], types.float32[::1],
        types.boolean)

for _name in VALUE_BYTES:
    for _n in range(1, MAX_TOKENS + 1):
        register_ptx("matvec", f"matvec_float{_n}_{_name}",
                     lambda nm=_name, n=_n: (_factory(nm, n).py_func, _SIG))
