"""RMSNorm, and NeoX RoPE fused with the per-head q/k RMSNorm (Qwen3), positions read from device
memory.

* `rms_norm`: out = x / sqrt(mean(x^2) + eps) * w, one block per row.
* `qk_norm_rope`: in place on q [n_tok, n_head*head_dim] and k [n_tok, n_head_kv*head_dim]; one warp
  per (token, head): optional per-head RMSNorm with its own weight, then NeoX rotation of the pairs
  (i, i + head_dim/2) by angle pos * theta^(-2i/head_dim). Fusing saves a read and a write of q
  and k and a launch per layer.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, types

from .intrinsics import block_sum, warp_sum
from .launch import check_array, flat, n_blocks, register_ptx

NORM_THREADS = 256
ROPE_WARPS = 4
F0 = np.float32(0.0)
F1 = np.float32(1.0)


@cuda.jit
def rms_norm_kernel(x, w, out, n, eps):
    # x, out: [n_rows * n] f32; w: [n] f32. One block per row.
    scratch = cuda.shared.array(32, np.float32)
    base = cuda.blockIdx.x * n
    ss = F0
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        v = x[base + i]
        ss += v * v
    total = block_sum(ss, scratch)
    inv = F1 / math.sqrt(total / np.float32(n) + eps)
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        out[base + i] = x[base + i] * inv * w[i]


def rms_norm(x, w, out, *, eps: float, stream=0) -> None:
    """out = rmsnorm(x) * w over the last axis; x, out [n_rows, n] float32 (out may alias x)."""
    check_array("x", x, np.float32, (None, None))
    n_rows, n = x.shape
    check_array("w", w, np.float32, (n,))
    check_array("out", out, np.float32, (n_rows, n))
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    rms_norm_kernel[n_rows, NORM_THREADS, stream](flat(x), w, flat(out), n, np.float32(eps))


@cuda.jit
def qk_norm_rope_kernel(qk, norm_w, has_norm, positions, n_tok, n_head, head_dim, theta_log2,
                        eps):
    # qk: [n_tok * n_head * head_dim] f32 (q or k, rotated in place); norm_w: [head_dim] f32;
    # positions: [n_tok] i32. One warp per (token, head).
    lane = cuda.threadIdx.x & 31
    item = cuda.blockIdx.x * ROPE_WARPS + (cuda.threadIdx.x >> 5)
    active = item < n_tok * n_head
    half = head_dim >> 1
    base = item * head_dim
    inv = F1
    if has_norm:
        ss = F0
        if active:
            for i in range(lane, head_dim, 32):
                v = qk[base + i]
                ss += v * v
        inv = F1 / math.sqrt(warp_sum(ss) / np.float32(head_dim) + eps)
    if active:
        pos = np.float32(positions[item // n_head])
        for i in range(lane, half, 32):
            a = qk[base + i]
            b = qk[base + i + half]
            if has_norm:
                a = a * inv * norm_w[i]
                b = b * inv * norm_w[i + half]
            # theta^(-2i/d) = 2^(-log2(theta) * 2i/d)
            ang = pos * math.exp2(-theta_log2 * np.float32(2 * i) / np.float32(head_dim))
            c = math.cos(ang)
            s = math.sin(ang)
            qk[base + i] = a * c - b * s
            qk[base + i + half] = b * c + a * s


def _rope_one(name, qk, norm_w, positions, n_head, head_dim, theta, eps, stream):
    check_array(name, qk, np.float32, (None, n_head * head_dim))
    n_tok = qk.shape[0]
    has_norm = norm_w is not None
    if has_norm:
        check_array(f"{name}_norm_w", norm_w, np.float32, (head_dim,))
    # without a norm weight any device array stands in (never read): positions
    w = norm_w if has_norm else positions
    n_items = n_tok * n_head
    qk_norm_rope_kernel[n_blocks(n_items, ROPE_WARPS), 32 * ROPE_WARPS, stream](
        flat(qk), w, has_norm, positions, n_tok, n_head, head_dim,
        np.float32(math.log2(theta)), np.float32(eps))


def qk_norm_rope(q, k, positions, *, n_head: int, n_head_kv: int, head_dim: int, theta: float,
                 q_norm_w=None, k_norm_w=None, eps: float = 1e-6, stream=0) -> None:
    """Per-head RMSNorm (when weights are given) and NeoX RoPE, in place on q [n_tok,
    n_head*head_dim] and k [n_tok, n_head_kv*head_dim] (float32); positions: int32 [n_tok] in
    device memory. Two launches (q, then k)."""
    if head_dim % 2 or head_dim <= 0:
        raise ValueError(f"head_dim must be even and positive, got {head_dim}")
    if not theta > 1:
        raise ValueError(f"rope theta must be > 1, got {theta}")
    check_array("positions", positions, np.int32, (q.shape[0],))
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k: {k.shape[0]} tokens, q has {q.shape[0]}")
    _rope_one("q", q, q_norm_w, positions, n_head, head_dim, theta, eps, stream)
    _rope_one("k", k, k_norm_w, positions, n_head_kv, head_dim, theta, eps, stream)


_F32 = types.float32[::1]
register_ptx("norm_rope", "rms_norm", lambda: (rms_norm_kernel.py_func,
                                               (_F32, _F32, _F32, types.int64, types.float32)))
register_ptx("norm_rope", "qk_norm_rope", lambda: (
    qk_norm_rope_kernel.py_func,
    (_F32, _F32, types.boolean, types.int32[::1], types.int64, types.int64, types.int64,
     types.float32, types.float32)))
