"""KV caches filled on the host (independent of the write kernel) and float64 attention
references, for the attention kernel tests (simulator and GPU)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize
from numba import cuda

from strata.cuda_kernels.kvcache import KvLayout, KvSide


def encode_rows(fmt: str, x: np.ndarray):
    """(row bytes [n, row_bytes] uint8, scales [n] f16 or None) of rows x [n, head_dim]."""
    if fmt == "f16":
        return x.astype(np.float16).view(np.uint8), None
    if fmt == "int8":
        s = (np.abs(x).max(axis=1) / 127.0).astype(np.float16)
        inv = np.where(s > 0, 1.0 / s.astype(np.float64), 0.0)
        q = np.clip(np.floor(x * inv[:, None] + 0.5), -127, 127).astype(np.int8)
        return q.view(np.uint8), s
    return np.asarray(quantize(x.astype(np.float32), T.Q4_0)).reshape(x.shape[0], -1), None


def decode_rows(fmt: str, raw: np.ndarray, scale, head_dim: int) -> np.ndarray:
    """float64 [n, head_dim] values of encoded rows (gguf-py dequantizes Q4_0)."""
    if fmt == "f16":
        return raw.view(np.float16).astype(np.float64)
    if fmt == "int8":
        return raw.view(np.int8).astype(np.float64) * scale.astype(np.float64)[:, None]
    return np.asarray(dequantize(np.ascontiguousarray(raw), T.Q4_0), np.float64).reshape(-1, head_dim)


def filled_side(layout: KvLayout, x: np.ndarray, rng) -> tuple[KvSide, np.ndarray]:
    """A cache side holding x ([n, n_kv, head_dim], n <= n_ctx) at positions 0..n-1, random bytes
    elsewhere (stale memory must never leak into results); returns (side, values as stored)."""
    n, n_kv, hd = x.shape
    rows = x.reshape(n * n_kv, hd)
    raw, scale = encode_rows(layout.fmt, rows)
    data = rng.integers(0, 256, layout.n_ctx * n_kv * layout.row_bytes, dtype=np.uint8)
    data[:raw.size] = raw.reshape(-1)
    scales = np.ones(layout.n_ctx * n_kv if layout.fmt == "int8" else 1, np.float16)
    if scale is not None:
        scales[:n * n_kv] = scale
    stored = decode_rows(layout.fmt, raw, scale, hd).reshape(n, n_kv, hd)
    return KvSide(layout, cuda.to_device(data), cuda.to_device(scales)), stored


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> np.ndarray:
    """Causal GQA attention, float64: q [n_q, n_head, d] at positions start.., k/v [L, n_kv, d]."""
    n_q, n_head, d = q.shape
    group = n_head // k.shape[1]
    length = start + n_q
    masked = np.arange(length)[None, :] > (start + np.arange(n_q))[:, None]  # [n_q, L]
    out = np.zeros(q.shape)
    for h in range(n_head):
        s = q[:, h].astype(np.float64) @ k[:length, h // group].T / np.sqrt(d)
        s[masked] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:length, h // group]
    return out
