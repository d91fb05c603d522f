"""One decode token's q/k per-head RMSNorm and NeoX RoPE and its K/V cache write, in one launch.

The decode step otherwise launches four tiny kernels per layer for this (`norm_rope.qk_norm_rope`:
q, then k; `kvcache.kv_write`: K, then V), each a few warps of work whose cost is the launch and
the wait on the one before. Here one warp takes one head of q, of k or of v (n_head + 2 n_kv
items): q and k heads are normalised (when weights are given) and rotated in place, as
`qk_norm_rope` does, and k's and v's heads are written to their f16 cache rows at position
seq_len[0] (read from device memory, so a CUDA graph replays it at every position). f16 rows hold
the same values `kv_write` stores (round to nearest even of the f32 value); int8 rows and their
scales the same bytes `kv_write` stores (`rope_kv_int8_kernel`: the head's absolute maximum over
the warp, the scale rounded to f16 first, each value rounded half up and clamped to +-127).

q4_0 keeps the separate launches (`rope_kv_fits`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, types

from .intrinsics import warp_max, warp_sum
from .kvcache import KvSide, i8_byte, i8_scale
from .launch import check_array, n_blocks, register_ptx
from .mma import pack_half2, syncwarp

WARPS = 4
F0 = np.float32(0.0)
F1 = np.float32(1.0)


@cuda.jit(device=True, inline="always")
def _store_f16(data, off, v):
    """The f16 of v at data[off], data[off + 1] (uint8, little-endian)."""
    bits = pack_half2(v, F0) & 0xFFFF
    data[off] = bits & 0xFF
    data[off + 1] = bits >> 8


@cuda.jit(device=True, inline="always")
def _norm_rotate(buf, base, nw, has_norm, eps, pos, theta_log2, head_dim, lane, active, data, row,
                 f16_rows):
    """The q or k head at buf[base:]: RMSNorm (weights nw, where has_norm) and NeoX RoPE at
    position pos, in place; with f16_rows the rotated values also go to f16 cache row `row` of
    data. Every lane of the warp takes part (the norm's warp sum), active or not."""
    half = head_dim >> 1
    inv = F1
    if has_norm:
        ss = F0
        if active:
            for i in range(lane, head_dim, 32):
                x = buf[base + i]
                ss += x * x
        inv = F1 / math.sqrt(warp_sum(ss) / np.float32(head_dim) + eps)
    if active:
        fpos = np.float32(pos)
        for i in range(lane, half, 32):
            a = buf[base + i]
            b = buf[base + i + half]
            if has_norm:
                a = a * inv * nw[i]
                b = b * inv * nw[i + half]
            # theta^(-2i/d) = 2^(-log2(theta) * 2i/d)
            ang = fpos * math.exp2(-theta_log2 * np.float32(2 * i) / np.float32(head_dim))
            c = math.cos(ang)
            s = math.sin(ang)
            ra = a * c - b * s
            rb = b * c + a * s
            buf[base + i] = ra
            buf[base + i + half] = rb
            if f16_rows:
                _store_f16(data, row * 2 * head_dim + 2 * i, ra)
                _store_f16(data, row * 2 * head_dim + 2 * (i + half), rb)


@cuda.jit(device=True, inline="always")
def _item(seq_len, n_head, n_kv, head_dim):
    """This warp's item (q heads, then k heads, then v heads): (lane, is_q, is_v, active, the
    head's offset in its vector, the position, the cache row of a k or v head)."""
    lane = cuda.threadIdx.x & 31
    item = cuda.blockIdx.x * WARPS + (cuda.threadIdx.x >> 5)
    is_q = item < n_head
    is_v = item >= n_head + n_kv
    h = item if is_q else (item - n_head - n_kv if is_v else item - n_head)
    pos = seq_len[0]
    return lane, is_q, is_v, item < n_head + 2 * n_kv, h * head_dim, pos, pos * n_kv + h


@cuda.jit
def rope_kv_f16_kernel(q, k, v, q_norm_w, k_norm_w, has_norm, seq_len, n_head, n_kv, head_dim,
                       theta_log2, eps, n_ctx, k_data, v_data):
    # q: [n_head * head_dim] f32, k, v: [n_kv * head_dim] f32 (q, k normed and rotated in
    # place); *_norm_w: [head_dim] f32; seq_len: [1] i32; k_data, v_data: [n_ctx * n_kv *
    # 2 * head_dim] u8 f16 cache rows. One warp per item: q heads, then k heads, then v heads.
    lane, is_q, is_v, active, base, pos, row = _item(seq_len, n_head, n_kv, head_dim)
    buf = q if is_q else (v if is_v else k)
    nw = q_norm_w if is_q else k_norm_w
    writes = active and not is_q and row < n_ctx * n_kv  # past the cache: dropped
    data = v_data if is_v else k_data
    if is_v:
        if writes:
            for i in range(lane, head_dim, 32):
                _store_f16(data, row * 2 * head_dim + 2 * i, buf[base + i])
        return
    _norm_rotate(buf, base, nw, has_norm, eps, pos, theta_log2, head_dim, lane, active, data,
                 row, writes)


@cuda.jit
def rope_kv_int8_kernel(q, k, v, q_norm_w, k_norm_w, has_norm, seq_len, n_head, n_kv, head_dim,
                        theta_log2, eps, n_ctx, k_data, v_data, k_scale, v_scale):
    # rope_kv_f16_kernel's work for an int8 cache: k_data, v_data [n_ctx * n_kv * head_dim] u8,
    # k_scale, v_scale [n_ctx * n_kv] f16 (a row's scale). A k head is rotated in place first,
    # then quantized from what it holds, as kv_write quantizes it.
    lane, is_q, is_v, active, base, pos, row = _item(seq_len, n_head, n_kv, head_dim)
    buf = q if is_q else (v if is_v else k)
    nw = q_norm_w if is_q else k_norm_w
    if not is_v:
        _norm_rotate(buf, base, nw, has_norm, eps, pos, theta_log2, head_dim, lane, active,
                     k_data, row, False)
    if is_q or not active or row >= n_ctx * n_kv:  # a warp's item is one: the exit is uniform
        return
    syncwarp()  # a lane reads values other lanes rotated (head_dim / 2 not a multiple of 32)
    amax = F0
    for i in range(lane, head_dim, 32):
        amax = max(amax, abs(buf[base + i]))
    sc, inv_s = i8_scale(warp_max(amax))
    data = v_data if is_v else k_data
    for i in range(lane, head_dim, 32):
        data[row * head_dim + i] = i8_byte(buf[base + i], inv_s)
    if lane == 0:
        if is_v:
            v_scale[row] = sc
        else:
            k_scale[row] = sc


def rope_kv_fits(k_side: KvSide, v_side: KvSide) -> bool:
    """Whether `rope_kv` takes this layer's cache (both sides f16, or both int8, one shape)."""
    kl, vl = k_side.layout, v_side.layout
    return kl.fmt in ("f16", "int8") and kl == vl


def rope_kv(q, k, v, seq_len, k_side: KvSide, v_side: KvSide, *, n_head: int, theta: float,
            q_norm_w=None, k_norm_w=None, eps: float = 1e-6, stream=0) -> None:
    """One token: per-head RMSNorm (with weights) and NeoX RoPE at position seq_len[0], in place
    on q [n_head * head_dim] and k [n_kv * head_dim] (float32), then k and v [n_kv * head_dim]
    written to their f16 or int8 cache sides at seq_len[0] (not advanced here). One launch."""
    if not rope_kv_fits(k_side, v_side):
        raise ValueError(f"rope_kv takes two f16 or two int8 cache sides of one shape, got "
                         f"{k_side.layout} and {v_side.layout}")
    lay = k_side.layout
    n_kv, hd = lay.n_kv_head, lay.head_dim
    check_array("q", q, np.float32, (n_head * hd,))
    check_array("k", k, np.float32, (n_kv * hd,))
    check_array("v", v, np.float32, (n_kv * hd,))
    check_array("seq_len", seq_len, np.int32, (1,))
    if not theta > 1:
        raise ValueError(f"rope theta must be > 1, got {theta}")
    has_norm = q_norm_w is not None
    if has_norm != (k_norm_w is not None):
        raise ValueError("rope_kv: give both q_norm_w and k_norm_w, or neither")
    if has_norm:
        check_array("q_norm_w", q_norm_w, np.float32, (hd,))
        check_array("k_norm_w", k_norm_w, np.float32, (hd,))
    else:  # never read: v stands in (read-only here; a written array would be copied back
        q_norm_w = k_norm_w = v  # over itself where numba transfers host arrays)
    n_items = n_head + 2 * n_kv
    args = (q, k, v, q_norm_w, k_norm_w, has_norm, seq_len, n_head, n_kv, hd,
            np.float32(math.log2(theta)), np.float32(eps), lay.n_ctx, k_side.data, v_side.data)
    if lay.fmt == "int8":
        rope_kv_int8_kernel[n_blocks(n_items, WARPS), 32 * WARPS, stream](
            *args, k_side.scale, v_side.scale)
    else:
        rope_kv_f16_kernel[n_blocks(n_items, WARPS), 32 * WARPS, stream](*args)


_F32, _U8, _F16 = types.float32[::1], types.uint8[::1], types.float16[::1]
_SIG = (_F32, _F32, _F32, _F32, _F32, types.boolean, types.int32[::1], types.int64, types.int64,
        types.int64, types.float32, types.float32, types.int64, _U8, _U8)
register_ptx("rope_kv", "rope_kv_f16", lambda: (rope_kv_f16_kernel.py_func, _SIG))
register_ptx("rope_kv", "rope_kv_int8", lambda: (rope_kv_int8_kernel.py_func,
                                                 _SIG + (_F16, _F16)))
