"""Decode attention and KV write for a batch of sequences in one launch each (`strata serve
--batch N`), over an f16 KV region that holds one context of `row_ctx` tokens per sequence:
layer side [n_rows * row_ctx, n_kv_head, head_dim] f16, sequence r's tokens at r * row_ctx.

* `kv_write_rows`: block (sequence, kv head, side): the sequence's new key / value at its own
  position seq_len[r] (the cache value `kvcache.kv_write` stores: f16 by `pack_half2`).
* `attention_rows`: pass 1, block (kv head, split of `split_len` keys, sequence), the G query
  heads of the kv head: a thread per key scores it against the staged queries (each thread loads
  its whole key row, 16 bytes at a time), each warp takes the softmax statistics of a head, and
  threads (dimension pair, key phase) sum P V over the split's keys (16-byte-coalesced V rows);
  pass 2, block (head, sequence), merges the used splits. seq_len[r] + 1 keys are valid (the new
  key written), read on the device, so one graph serves every position.

The arithmetic differs from the one-sequence kernels (`attention`), so a sequence decoded in a
batch agrees with itself decoded alone to float32 rounding, not bit for bit.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, types

from .intrinsics import h2f, ld_nc_u32x4, ld_u32, ld_x4
from .launch import check_array, register_ptx
from .mma import pack_half2, shfl_xor

THREADS = 128
WARPS = THREADS // 32
HEAD_DIMS = (64, 128)
MAX_GROUP = 8
PV_UNROLL = 4            # V rows in flight per thread
NEG_INF = float32(-np.inf)


def supports(fmt: str, head_dim: int, group: int) -> bool:
    """Whether these kernels take the cache (else the engine runs the one-sequence kernels per
    sequence)."""
    return fmt == "f16" and head_dim in HEAD_DIMS and 1 <= group <= MAX_GROUP


@functools.cache
def _write_kernel(head_dim: int):
    row_bytes = 2 * head_dim

    @cuda.jit
    def kv_write_rows(k, v, seq_len, row_ctx, n_kv, kd, vd):
        # k, v: [n_rows, n_kv * head_dim] f32; kd, vd: u8 [n_rows * row_ctx * n_kv * row_bytes]
        r, h = cuda.blockIdx.x, cuda.blockIdx.y
        i = cuda.threadIdx.x  # a pair of values
        pos = seq_len[r]
        if pos >= row_ctx or 2 * i >= head_dim:
            return  # past the sequence's region (the engine refuses this first): dropped
        src = k if cuda.blockIdx.z == 0 else v
        dst = kd if cuda.blockIdx.z == 0 else vd
        w = pack_half2(src[r, h * head_dim + 2 * i], src[r, h * head_dim + 2 * i + 1])
        base = ((r * row_ctx + pos) * n_kv + h) * row_bytes + 4 * i
        for b in range(4):
            dst[base + b] = (w >> (8 * b)) & 0xFF
    return kv_write_rows


@cuda.jit(device=True, inline="always")
def _h2(w):
    return h2f(w & 0xFFFF), h2f(w >> 16)


@functools.cache
def _attn_kernel(head_dim: int, group: int, split_len: int):
    row_bytes = 2 * head_dim
    n_seg = head_dim // 8          # 16-byte segments of a key row
    n_pair = head_dim // 2         # threads per key phase in P V
    n_phase = THREADS // n_pair
    n_q, n_p = group * head_dim, group * split_len   # shared array sizes (compile-time)

    @cuda.jit
    def attention_rows(q, kd, vd, seq_len, row_ctx, n_kv, qk_scale, part_o, part_ml):
        # q: [n_rows, n_head * head_dim] f32; kd, vd: the layer's f16 K / V region (u8);
        # part_o: [n_rows, n_split_max, n_head, head_dim] f32; part_ml: [..., n_head, 2] f32
        hk, split, r = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
        tid = cuda.threadIdx.x
        length = min(seq_len[r] + 1, row_ctx)
        k0 = split * split_len
        n_keys = min(split_len, length - k0)
        if n_keys <= 0:
            return
        s_q = cuda.shared.array(n_q, float32)     # scaled queries [G, head_dim]
        s_p = cuda.shared.array(n_p, float32)     # scores, then probabilities [G, split_len]
        s_o = cuda.shared.array(n_q, float32)     # P V of key phases > 0 [G, head_dim]
        for i in range(tid, group * head_dim, THREADS):
            s_q[i] = q[r, hk * group * head_dim + i] * qk_scale
        cuda.syncthreads()
        first_row = (r * row_ctx + k0) * n_kv + hk
        acc = cuda.local.array(group, float32)
        for kk in range(tid, n_keys, THREADS):
            for g in range(group):
                acc[g] = float32(0.0)
            base = (first_row + kk * n_kv) * row_bytes
            for sg in range(n_seg):
                w0, w1, w2, w3 = ld_nc_u32x4(kd, base + 16 * sg)
                a0, a1 = _h2(w0)
                a2, a3 = _h2(w1)
                a4, a5 = _h2(w2)
                a6, a7 = _h2(w3)
                for g in range(group):
                    o = g * head_dim + 8 * sg
                    x0, x1, x2, x3 = ld_x4(s_q, o)
                    y0, y1, y2, y3 = ld_x4(s_q, o + 4)
                    acc[g] += (a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3
                               + a4 * y0 + a5 * y1 + a6 * y2 + a7 * y3)
            for g in range(group):
                s_p[g * split_len + kk] = acc[g]
        cuda.syncthreads()
        warp, lane = tid >> 5, tid & 31
        for g in range(warp, group, WARPS):
            m = NEG_INF
            for k in range(lane, n_keys, 32):
                m = max(m, s_p[g * split_len + k])
            for sh in (16, 8, 4, 2, 1):
                m = max(m, shfl_xor(m, sh))
            total = float32(0.0)
            for k in range(lane, n_keys, 32):
                p = math.exp(s_p[g * split_len + k] - m)
                s_p[g * split_len + k] = p
                total += p
            for sh in (16, 8, 4, 2, 1):
                total += shfl_xor(total, sh)
            if lane == 0:
                part_ml[r, split, hk * group + g, 0] = m
                part_ml[r, split, hk * group + g, 1] = total
        cuda.syncthreads()
        # P V: thread (pair of dims d, d + 1; key phase ph) over keys ph, ph + n_phase, ...
        pair, ph = tid % n_pair, tid // n_pair
        lo = cuda.local.array(group, float32)
        hi = cuda.local.array(group, float32)
        for g in range(group):
            lo[g] = float32(0.0)
            hi[g] = float32(0.0)
        vbase = first_row * row_bytes + 4 * pair
        step = n_phase * PV_UNROLL
        words = cuda.local.array(PV_UNROLL, types.uint32)
        for k_base in range(ph, n_keys, step):
            for u in range(PV_UNROLL):  # past the split: re-read its last key, weighted 0
                key = min(k_base + u * n_phase, n_keys - 1)
                words[u] = ld_u32(vd, vbase + key * n_kv * row_bytes)
            for u in range(PV_UNROLL):
                key = k_base + u * n_phase
                if key < n_keys:
                    v0, v1 = _h2(words[u])
                    for g in range(group):
                        p = s_p[g * split_len + key]
                        lo[g] += p * v0
                        hi[g] += p * v1
        for f in range(1, n_phase):  # phases > 0 hand their sums to phase 0, in a fixed order
            if ph == f:
                for g in range(group):
                    o = g * head_dim + 2 * pair
                    s_o[o] = lo[g]
                    s_o[o + 1] = hi[g]
            cuda.syncthreads()
            if ph == 0:
                for g in range(group):
                    o = g * head_dim + 2 * pair
                    lo[g] += s_o[o]
                    hi[g] += s_o[o + 1]
            cuda.syncthreads()
        if ph == 0:
            for g in range(group):
                part_o[r, split, hk * group + g, 2 * pair] = lo[g]
                part_o[r, split, hk * group + g, 2 * pair + 1] = hi[g]
    return attention_rows


@cuda.jit
def _combine_rows(part_o, part_ml, seq_len, row_ctx, split_len, out):
    """Block (head, sequence), a thread per dimension: the used splits merged."""
    h, r, d = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    head_dim = part_o.shape[3]
    length = min(seq_len[r] + 1, row_ctx)
    n_used = (length + split_len - 1) // split_len
    m = NEG_INF
    for s in range(n_used):
        m = max(m, part_ml[r, s, h, 0])
    den = float32(0.0)
    acc = float32(0.0)
    for s in range(n_used):
        w = math.exp(part_ml[r, s, h, 0] - m)
        den += w * part_ml[r, s, h, 1]
        acc += w * part_o[r, s, h, d]
    if d < head_dim:
        out[r, h * head_dim + d] = acc / den


def kv_write_rows(k, v, seq_len, kd, vd, *, row_ctx: int, n_kv: int, head_dim: int,
                  stream=0) -> None:
    """Each sequence's new key and value (k, v: float32 [n_rows, n_kv * head_dim]) into its f16
    region of the layer's K / V (kd, vd: uint8 [n_rows * row_ctx * n_kv * 2 * head_dim] at
    least) at position seq_len[r] (int32 [n_rows])."""
    n_rows = k.shape[0]
    check_array("k", k, np.float32, (n_rows, n_kv * head_dim))
    check_array("v", v, np.float32, (n_rows, n_kv * head_dim))
    _check_region(seq_len, kd, vd, n_rows, row_ctx, n_kv, head_dim)
    _write_kernel(head_dim)[(n_rows, n_kv, 2), 32 * max(1, head_dim // 64), stream](
        k, v, seq_len, row_ctx, n_kv, kd, vd)


def attention_rows(q, kd, vd, seq_len, out, partials, *, row_ctx: int, n_kv: int,
                   head_dim: int, split_len: int, stream=0) -> None:
    """out[r, h] = softmax(q[r, h] . K_r[0:L_r, h // G] / sqrt(head_dim)) @ V_r[0:L_r, h // G]
    for every sequence r, L_r = seq_len[r] + 1 (the new key already written). q, out: float32
    [n_rows, n_head * head_dim]; partials: (part_o float32 [n_rows, n_split_max, n_head,
    head_dim], part_ml float32 [n_rows, n_split_max, n_head, 2]) with n_split_max at least the
    splits of row_ctx."""
    n_rows = q.shape[0]
    n_head = q.shape[1] // head_dim if q.ndim == 2 else 0
    group = n_head // n_kv if n_kv else 0
    if not supports("f16", head_dim, group) or n_head != group * n_kv:
        raise ValueError(f"batched attention: head_dim {head_dim} (of {HEAD_DIMS}), {n_head} "
                         f"query heads over {n_kv} KV heads (group 1..{MAX_GROUP}) not supported")
    check_array("q", q, np.float32, (n_rows, n_head * head_dim))
    check_array("out", out, np.float32, (n_rows, n_head * head_dim))
    _check_region(seq_len, kd, vd, n_rows, row_ctx, n_kv, head_dim)
    part_o, part_ml = partials
    n_split = -(-row_ctx // split_len)
    check_array("part_o", part_o, np.float32, (n_rows, None, n_head, head_dim))
    check_array("part_ml", part_ml, np.float32, (n_rows, part_o.shape[1], n_head, 2))
    if part_o.shape[1] < n_split:
        raise ValueError(f"partials hold {part_o.shape[1]} splits, {row_ctx} positions need "
                         f"{n_split} of {split_len}")
    scale = np.float32(1.0 / math.sqrt(head_dim))
    _attn_kernel(head_dim, group, split_len)[(n_kv, n_split, n_rows), THREADS, stream](
        q, kd, vd, seq_len, row_ctx, n_kv, scale, part_o, part_ml)
    _combine_rows[(n_head, n_rows), head_dim, stream](part_o, part_ml, seq_len, row_ctx,
                                                      split_len, out)


def _check_region(seq_len, kd, vd, n_rows, row_ctx, n_kv, head_dim) -> None:
    if not 1 <= n_rows <= 64:
        raise ValueError(f"{n_rows} sequences: expected 1..64")
    check_array("seq_len", seq_len, np.int32, (n_rows,))
    need = n_rows * row_ctx * n_kv * 2 * head_dim
    for name, a in (("kd", kd), ("vd", vd)):
        check_array(name, a, np.uint8, (None,))
        if a.size < need:
            raise ValueError(f"{name}: {a.size} bytes, {n_rows} sequences of {row_ctx} "
                             f"positions need {need}")


_F2, _U8, _I32, _I = types.float32[:, ::1], types.uint8[::1], types.int32[::1], types.int64
_F4 = types.float32[:, :, :, ::1]
for _hd in HEAD_DIMS:
    register_ptx("batch", f"kv_write_rows_hd{_hd}",
                 lambda hd=_hd: (_write_kernel(hd).py_func, (_F2, _F2, _I32, _I, _I, _U8, _U8)))
register_ptx("batch", "attention_rows_hd128_g8_s256",
             lambda: (_attn_kernel(128, 8, 256).py_func,
                      (_F2, _U8, _U8, _I32, _I, _I, types.float32, _F4, _F4)))
register_ptx("batch", "attention_rows_combine",
             lambda: (_combine_rows.py_func, (_F4, _F4, _I32, _I, _I, _F2)))
