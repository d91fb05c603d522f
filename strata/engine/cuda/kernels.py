"""The few kernels the engine needs beside the kernel families' (`strata.cuda_kernels`):

* `rms_norm_f16`: RMSNorm of a prefill chunk written as float16, the tensor-core GEMMs' input
  (the family's `rms_norm` writes float32);
* `fill_positions`: pos[i] = seq_len[0] + i, the RoPE positions of a chunk read from the device
  sequence length (no host round trip);
* `mask_ids`: the entries of one ring wave: ids[i] where the expert belongs to the wave, else -1
  (the grouping kernels drop -1 entries, and `combine` skips them).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, types

from strata.cuda_kernels.intrinsics import block_sum
from strata.cuda_kernels.launch import check_array, flat, n_blocks, register_ptx

NORM_THREADS = 256
THREADS = 256
F0 = np.float32(0.0)
F1 = np.float32(1.0)


@cuda.jit
def rms_norm_f16_kernel(x, w, out, n, eps):
    # x: [n_rows * n] f32; w: [n] f32; out: [n_rows * n] f16. One block per row.
    scratch = cuda.shared.array(32, np.float32)
    base = cuda.blockIdx.x * n
    ss = F0
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        v = x[base + i]
        ss += v * v
    total = block_sum(ss, scratch)
    inv = F1 / math.sqrt(total / np.float32(n) + eps)
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        out[base + i] = np.float16(x[base + i] * inv * w[i])


def rms_norm_f16(x, w, out, *, eps: float, stream=0) -> None:
    """out = rmsnorm(x) * w as float16; x [n_rows, n] float32, w [n] float32, out [n_rows, n]
    float16."""
    check_array("x", x, np.float32, (None, None))
    n_rows, n = x.shape
    check_array("w", w, np.float32, (n,))
    check_array("out", out, np.float16, (n_rows, n))
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    rms_norm_f16_kernel[n_rows, NORM_THREADS, stream](flat(x), w, flat(out), n, np.float32(eps))


@cuda.jit
def fill_positions_kernel(pos, seq_len, n):
    # pos: [>= n] i32; seq_len: [1] i32
    i = cuda.grid(1)
    if i < n:
        pos[i] = seq_len[0] + i


def fill_positions(pos, seq_len, *, stream=0) -> None:
    """pos[i] = seq_len[0] + i for every i < len(pos) (int32 device arrays)."""
    check_array("pos", pos, np.int32, (None,))
    check_array("seq_len", seq_len, np.int32, (1,))
    n = pos.shape[0]
    fill_positions_kernel[n_blocks(n, THREADS), THREADS, stream](pos, seq_len, n)


@cuda.jit
def mask_ids_kernel(ids, wave_of, wave, out, n):
    # ids, out: [n] i32 (flattened [n_tok, k]); wave_of: [n_expert] i32
    i = cuda.grid(1)
    if i < n:
        e = ids[i]
        out[i] = e if wave_of[e] == wave else -1


def mask_ids(ids, wave_of, wave: int, out, *, stream=0) -> None:
    """out[i] = ids[i] if wave_of[ids[i]] == wave else -1; ids, out int32 of one shape (the
    router's top-k, flattened or not), wave_of int32 [n_expert]."""
    check_array("ids", ids, np.int32)
    check_array("out", out, np.int32, tuple(ids.shape))
    check_array("wave_of", wave_of, np.int32, (None,))
    n = ids.size
    mask_ids_kernel[n_blocks(n, THREADS), THREADS, stream](flat(ids), wave_of, int(wave),
                                                           flat(out), n)


_F32, _I32 = types.float32[::1], types.int32[::1]
register_ptx("engine", "rms_norm_f16", lambda: (rms_norm_f16_kernel.py_func, (
    _F32, _F32, types.float16[::1], types.int64, types.float32)))
register_ptx("engine", "fill_positions", lambda: (fill_positions_kernel.py_func, (
    _I32, _I32, types.int64)))
register_ptx("engine", "mask_ids", lambda: (mask_ids_kernel.py_func, (
    _I32, _I32, types.int64, _I32, types.int64)))
