"""Parallel drivers over quantized weight matrices: `linear` (y = W x for a few tokens) and
`gather_rows` (embedding lookup).

A weight is its raw bytes as rows, `w`: uint8[n_rows, row_bytes] (C-contiguous, read-only: a view
of the mapped GGUF file), with its GGML type `fmt` and `block_size`. Threads split the rows into
chunks and each chunk allocates its scratch once. With one token the row is dotted straight from
its bytes; with several, each row is decoded once into f32 and dotted with every token, so the
decode cost is shared by the batch.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from strata.engine.cpu.idot import takes_x8
from strata.engine.cpu.qdot import ACC_SIZE, FAST, decode_row, dot_f32, rows_dot

F32 = np.float32
CHUNKS_PER_THREAD = 4  # a few chunks per thread even out rows of uneven cost (page faults)


def n_chunks_for(n_items: int) -> int:
    """How many chunks the drivers split n_items rows into (an argument of each driver: asking
    numba for the thread count inside a kernel would keep it out of the disk cache)."""
    return max(1, min(n_items, CHUNKS_PER_THREAD * numba.get_num_threads()))


@njit(cache=True, fastmath=FAST)
def dot4_f32(w, x, t, acc, out):
    """out[t..t+3] = dot(w, x[t+j]) for four tokens at once: w is loaded once per four."""
    n = w.shape[0]
    for j in range(4):
        out[j] = 0.0
    n_full = n - n % 16
    for j in range(4):
        for i in range(16):
            acc[16 * j + i] = 0.0
    for b in range(0, n_full, 16):
        for i in range(16):
            wv = w[b + i]
            acc[i] += wv * x[t, b + i]
            acc[16 + i] += wv * x[t + 1, b + i]
            acc[32 + i] += wv * x[t + 2, b + i]
            acc[48 + i] += wv * x[t + 3, b + i]
    for j in range(4):
        s = F32(0.0)
        for i in range(16):
            s += acc[16 * j + i]
        for i in range(n_full, n):
            s += w[i] * x[t + j, i]
        out[j] = s


@njit(cache=True, fastmath=FAST)
def decoded_dots(buf, x, acc, four, out, r):
    """out[t, r] = dot(buf, x[t]) for every token t, four tokens per pass over buf."""
    n_tok = x.shape[0]
    t = 0
    while t + 4 <= n_tok:
        dot4_f32(buf, x, t, acc, four)
        for j in range(4):
            out[t + j, r] = four[j]
        t += 4
    while t < n_tok:
        out[t, r] = dot_f32(buf, x[t], acc)
        t += 1


@njit(cache=True, parallel=True, fastmath=FAST)
def linear(w, fmt, block_size, x, x8, out, n_chunks):
    """out[t, r] = dot(row r of w, x[t]) for every token t and row r.

    x: float32[n_tok, n_in]; x8: its 8-bit form, the tuple `idot.x8_arrays(x)` (read by one
    token's K-quant dots); out: float32[n_tok, n_rows]; n_chunks: `n_chunks_for(n_rows)`."""
    n_rows = w.shape[0]
    n_tok, n_in = x.shape
    qx, dx, qs16, xq = x8
    x8_rows = takes_x8(fmt)  # a batch's decoded rows then multiply xq, as one token's do
    for c in prange(n_chunks):
        acc = np.empty(ACC_SIZE, F32)
        four = np.empty(4, F32)
        buf = np.empty(n_in, F32)
        r0 = c * n_rows // n_chunks
        r1 = (c + 1) * n_rows // n_chunks
        if n_tok == 1:
            rows_dot(fmt, block_size, w, r0, r1, x[0], qx[0], dx[0], qs16[0], acc, buf,
                     out[0, r0:r1])
        else:
            for r in range(r0, r1):
                decode_row(fmt, block_size, w[r], buf)
                if x8_rows:
                    decoded_dots(buf, xq, acc, four, out, r)
                else:
                    decoded_dots(buf, x, acc, four, out, r)


@njit(cache=True, parallel=True)
def gather_rows(w, fmt, block_size, ids, out):
    """out[t] = row ids[t] of w, decoded: the embedding lookup. ids: int64[n_tok]."""
    for t in prange(ids.shape[0]):
        decode_row(fmt, block_size, w[ids[t]], out[t])
