"""Row dot products of K-quant weights (Q4_K, Q5_K, Q6_K) with 8-bit activations.

One token's activations are quantized once per matmul (`quantize_x8`), then every row's dot
product runs in integers per 32-value sub-block (`simd8`): the decode path reads its weights at
memory speed instead of converting every nibble to f32. The 8-bit rounding of the activations
(per-32 absmax scales, |error| <= dx / 2 per value) is the only approximation: each dot is
exactly the dequantized row times the quantized activations (up to f32 rounding).

Shapes: `w` uint8[n_rows, row_bytes] (the whole matrix: the row is `r`, so that no row view, and
no reference count shared by the threads, is touched per row); `qx` int8[width]; `dx` float32[width // 32]; `qs16`
float32[width // 16] (sums of 16 quantized activations); `acc` float32 scratch of >= ACC_LANES.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as _T
from numba import njit

from strata.engine.cpu.simd import half_at
from strata.engine.cpu.simd8 import q4_k_idot, q5_k_idot, q6_k_idot, sum8

F32 = np.float32
Q4_K_T, Q5_K_T, Q6_K_T = int(_T.Q4_K), int(_T.Q5_K), int(_T.Q6_K)
ACC_LANES = 8  # one f32 vector: a super-block's work hides the latency of adding into it
FAST = {"contract", "reassoc", "nsz"}


@njit(cache=True, fastmath=FAST)
def quantize_x8(x, qx, dx, qs16):
    """x: float32[n_tok, n]; qx: int8[n_tok, n]; dx: float32[n_tok, n // 32]; qs16:
    float32[n_tok, n // 16]. Per 32 values, dx = absmax / 127 and qx = round(x / dx); qs16 holds
    the sums of 16 quantized values (dx * sum of qx), which the formats' offsets use so that a
    row's dot product is exactly its dequantized values times the quantized activations. A tail
    shorter than 32 gets qx = 0 (no format that reads qx has one)."""
    n_tok, n = x.shape
    n_blk = n // 32
    for t in range(n_tok):
        for b in range(n_blk):
            amax = F32(0.0)
            for i in range(32 * b, 32 * b + 32):
                amax = max(amax, abs(x[t, i]))
            d = amax / F32(127.0)
            inv = F32(1.0) / d if d > 0 else F32(0.0)
            dx[t, b] = d
            for i in range(32 * b, 32 * b + 32):
                qx[t, i] = np.int8(np.rint(x[t, i] * inv))
            for h in range(2):
                s = 0
                for i in range(32 * b + 16 * h, 32 * b + 16 * h + 16):
                    s += np.int32(qx[t, i])
                qs16[t, 2 * b + h] = d * F32(s)
        for i in range(32 * n_blk, n):
            qx[t, i] = 0


def x8_arrays(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The 8-bit form of x: float32[n_tok, n] -> (qx int8[n_tok, n], dx float32[n_tok, n // 32],
    qs16 float32[n_tok, n // 32 * 2], xq float32[n_tok, n]). xq = dx * qx, the activations
    the K-quants see, also when a batch of tokens shares each decoded row: a token's result
    then does not depend on whether it was computed alone or in a batch."""
    qx = np.empty(x.shape, np.int8)  # [n_tok, n] i8
    dx = np.empty((x.shape[0], x.shape[1] // 32), np.float32)  # [n_tok, n // 32] f32
    qs16 = np.empty((x.shape[0], 2 * dx.shape[1]), np.float32)  # [n_tok, n // 16] f32
    quantize_x8(x, qx, dx, qs16)
    xq = np.zeros_like(x)  # [n_tok, n] f32
    n32 = 32 * dx.shape[1]
    xq[:, :n32] = (qx[:, :n32].reshape(x.shape[0], -1, 32) * dx[:, :, None]).reshape(
        x.shape[0], n32)
    return qx, dx, qs16, xq


@njit(cache=True)
def takes_x8(fmt):
    """Whether rows of GGML type `fmt` multiply the 8-bit activations."""
    return fmt == Q4_K_T or fmt == Q5_K_T or fmt == Q6_K_T


@njit(cache=True, fastmath=FAST, inline="always")
def _zero(acc):
    for i in range(ACC_LANES):
        acc[i] = 0.0


@njit(cache=True, fastmath=FAST, inline="always")
def dot_q4_k_x8(w, r, qx, dx, qs16, acc):
    """Row r of Q4_K w (144-byte super-blocks: fp16 d, fp16 dmin, 12 bytes of 6-bit
    scales/minimums, 128 of nibbles) . x."""
    _zero(acc)
    o0 = r * w.shape[1]
    for b in range(w.shape[1] // 144):
        o = o0 + 144 * b
        q4_k_idot(acc, 0, w, o, b, half_at(w, o), half_at(w, o + 2), qx, dx, qs16)
    return sum8(acc)


@njit(cache=True, fastmath=FAST, inline="always")
def dot_q5_k_x8(w, r, qx, dx, qs16, acc):
    """Row r of Q5_K w (176-byte super-blocks: Q4_K's header, 32 bytes of fifth bits, 128 of
    nibbles) . x."""
    _zero(acc)
    o0 = r * w.shape[1]
    for b in range(w.shape[1] // 176):
        o = o0 + 176 * b
        q5_k_idot(acc, 0, w, o, b, half_at(w, o), half_at(w, o + 2), qx, dx, qs16)
    return sum8(acc)


@njit(cache=True, fastmath=FAST, inline="always")
def dot_q6_k_x8(w, r, qx, dx, qs16, acc):
    """Row r of Q6_K w (210-byte super-blocks, fp16 d last) . x."""
    _zero(acc)
    o0 = r * w.shape[1]
    for b in range(w.shape[1] // 210):
        o = o0 + 210 * b
        q6_k_idot(acc, 0, w, o, b, half_at(w, o + 208), qx, dx, qs16)
    return sum8(acc)


@njit(cache=True, fastmath=FAST)
def dots_x8(fmt, w, r0, r1, qx, dx, qs16, acc, out):
    """out[r - r0] = dot(row r of w, x) for r0 <= r < r1, w of K-quant type `fmt`
    (`takes_x8`): one call and one format test per run of rows, the row loop compiled whole."""
    if fmt == Q4_K_T:
        for r in range(r0, r1):
            out[r - r0] = dot_q4_k_x8(w, r, qx, dx, qs16, acc)
    elif fmt == Q6_K_T:
        for r in range(r0, r1):
            out[r - r0] = dot_q6_k_x8(w, r, qx, dx, qs16, acc)
    else:
        for r in range(r0, r1):
            out[r - r0] = dot_q5_k_x8(w, r, qx, dx, qs16, acc)
