"""Normalisation, rotary embedding and causal attention kernels of the CPU backend (f32).

Shapes: activations are float32[n_tok, width]; q/k/v are viewed as [n_tok, n_head, head_dim];
the KV cache of one layer is float32[n_ctx, n_head_kv, head_dim].
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

F32 = np.float32


@njit(cache=True)
def rms_norm(x, w, eps, out):
    """out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, row by row (x: [n_tok, n], w: [n])."""
    n = x.shape[1]
    for t in range(x.shape[0]):
        ss = F32(0.0)
        for i in range(n):
            ss += x[t, i] * x[t, i]
        scale = F32(1.0) / np.sqrt(ss / F32(n) + F32(eps))
        for i in range(n):
            out[t, i] = x[t, i] * scale * w[i]


@njit(cache=True)
def head_norm_rope(x, w, eps, cos, sin):
    """In place on x: [n_tok, n_head, head_dim]: RMSNorm of every head with weight w
    [head_dim], then NeoX rotary embedding (dimension i pairs with i + head_dim/2) with
    cos, sin: [n_tok, head_dim/2]."""
    n_tok, n_head, hd = x.shape
    half = hd // 2
    for t in range(n_tok):
        for h in range(n_head):
            ss = F32(0.0)
            for i in range(hd):
                ss += x[t, h, i] * x[t, h, i]
            scale = F32(1.0) / np.sqrt(ss / F32(hd) + F32(eps))
            for i in range(hd):
                x[t, h, i] = x[t, h, i] * scale * w[i]
            for i in range(half):
                a = x[t, h, i]
                b = x[t, h, i + half]
                x[t, h, i] = a * cos[t, i] - b * sin[t, i]
                x[t, h, i + half] = b * cos[t, i] + a * sin[t, i]


def rope_tables(positions: np.ndarray, head_dim: int, freq_base: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin: float32[n_tok, head_dim/2] of angle pos * base^(-2i/head_dim), computed in
    float64 so long positions lose no accuracy."""
    inv = freq_base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.outer(positions.astype(np.float64), inv)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@njit(cache=True, parallel=True)
def attention(q, k_cache, v_cache, start, out):
    """Causal GQA attention for queries at positions start..start+n_tok-1, reading keys and
    values 0..start+t from the cache (the new tokens' k, v already stored).

    q: [n_tok, n_head, hd]; k_cache, v_cache: [n_ctx, n_head_kv, hd]; out: [n_tok, n_head, hd].
    Head h reads kv head h // (n_head / n_head_kv); scores are scaled by 1/sqrt(hd)."""
    n_tok, n_head, hd = q.shape
    group = n_head // k_cache.shape[1]
    scale = F32(1.0 / math.sqrt(hd))
    n_ctx_max = start + n_tok
    for item in prange(n_tok * n_head):
        t = item // n_head
        h = item % n_head
        kvh = h // group
        n_ctx = start + t + 1
        s = np.empty(n_ctx_max, F32)
        mx = F32(-np.inf)
        for j in range(n_ctx):
            acc = F32(0.0)
            for i in range(hd):
                acc += q[t, h, i] * k_cache[j, kvh, i]
            s[j] = acc * scale
            mx = max(mx, s[j])
        total = F32(0.0)
        for j in range(n_ctx):
            s[j] = np.exp(s[j] - mx)
            total += s[j]
        for i in range(hd):
            out[t, h, i] = 0.0
        for j in range(n_ctx):
            p = s[j] / total
            for i in range(hd):
                out[t, h, i] += p * v_cache[j, kvh, i]
