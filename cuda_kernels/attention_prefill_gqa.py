"""Causal prefill attention with K/V tiles shared by the query heads of one KV head.

Same contract as `attention_prefill.prefill_attention` (the chunk's n_q tokens at positions
start .. start + n_q - 1, start = seq_len[0] read on the device, their keys/values already in the
cache; token i attends to keys 0 .. start + i), organised for less work per staged tile and per mma:

* a block takes 16 * tw query tokens of hb query heads that share one KV head (hb divides the
  GQA group); warp w owns the 16 tokens (w // hb) of head (w % hb) as mma A fragments, so every
  K/V tile staged in shared memory feeds 16 * hb * tw query rows. At equal warps that is as many
  rows a tile as the base kernel's (one head, 16 * warps tokens), so K/V bytes per FLOP are
  the same; what changes is the diagonal (16 tokens a block at the 30B's group 8, not 64:
  fewer masked keys computed) and what staging a tile costs;
* K and V sit in shared memory row-major (one key per row, f16, rows padded by 16 bytes so the 8
  rows of an ldmatrix hit distinct banks): f16 caches are copied with cp.async straight from the
  cache rows, int8 / q4_0 ones dequantized through registers; B fragments are read with
  ldmatrix (K) and ldmatrix.trans (V: the key axis becomes the mma k axis), one instruction per
  two mma;
* two tile buffers: tile j + 1 is issued into the other buffer before the warps compute on tile
  j (cp.async: the copy runs under the compute), one barrier per tile;
* copies and fragments are addressed, not indexed: each thread works out its chunks' shared and
  cache offsets once (`_f16_stager`), each lane its ldmatrix rows once (`_tile_math`), and a
  tile adds a key offset or a constant (`cp_async16_at`, `ldsm_x4_at`): indexing the arrays at
  every copy and fragment took over half of the tile loop's instructions;
* scores are kept in base 2 (log2 e folded into the Q scale; exp2 in the softmax), tiles wholly
  below the block's first position skip the causal mask, and the token blocks run last to first
  (the longest rows start first, the short ones fill the tail).

Tiles past the block's last query position are never loaded; keys past the sequence are zeros in
shared memory, never stale cache bytes.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, int32, uint32, uint64

from .attention import _check_pair, _row_bytes
from .kvcache import KvSide, make_reader
from .launch import MAX_SHARED_BYTES, as_u32, cached_view
from .mma import (SIMULATED, cp_async16_at, cp_async_wait, gaddr, ldsm_x4_at, ldsm_x4_trans_at,
                  mma_16816, pack_half2, shfl_xor, smem_u32)

WARPS = 8
BKV = 32
# Launch bounds by block size (warps -> blocks an SM the registers must allow). 8-warp blocks
# bounded to 2 an SM (128 registers) measured fastest on the H200 at head_dim 128: 1.04 ms for a
# 4096-token f16 prompt of the 30B shape against 1.20 for 4-warp blocks at 3 an SM (168
# registers, unbounded 170 leaves room for 2) and 1.25 for 8 warps unbounded (one block an SM)
# (bench/results/2026-11-30_kernels_prefill_attn_gqa.json). Other shapes are unbounded.
MIN_BLOCKS = {4: 3, 8: 2}
SHARED_ALIGN = None if SIMULATED else 16  # ldmatrix rows and cp.async targets: 16-byte aligned
NEG_INF = float32(-np.inf)
LOG2E = 1.4426950408889634


@cuda.jit(device=True, inline="always")
def q_fragments(q, qf, h, r0, r1, t, n_q, qk_scale, n_kk):
    """The calling lane's mma A fragments of head h's query rows r0 and r1 = r0 + 8 (rows past
    n_q: zeros), scaled by qk_scale, into qf[4 * kk + j] for the n_kk k16 steps of head_dim:
    a0 (r0, 2t), a1 (r1, 2t), a2 (r0, 2t + 8), a3 (r1, 2t + 8), each an f16 pair."""
    for kk in range(n_kk):
        for j in range(4):
            r = r1 if j % 2 else r0
            d = kk * 16 + 2 * t + (8 if j >= 2 else 0)
            w = uint32(0)
            if r < n_q:
                w = pack_half2(q[r, h, d] * qk_scale, q[r, h, d + 1] * qk_scale)
            qf[kk * 4 + j] = w


@cuda.jit(device=True, inline="always")
def p_fragments(s, pf, n_kc):
    """The score C fragments of two n8 key tiles make the A fragment of P for one k16 chunk
    (the mma layouts line up): pf[4 kc + j] = f16 pairs of s, for the n_kc chunks."""
    for kc in range(n_kc):
        a, b = 8 * kc, 8 * kc + 4
        pf[kc * 4] = pack_half2(s[a], s[a + 1])
        pf[kc * 4 + 1] = pack_half2(s[a + 2], s[a + 3])
        pf[kc * 4 + 2] = pack_half2(s[b], s[b + 1])
        pf[kc * 4 + 3] = pack_half2(s[b + 2], s[b + 3])


@cuda.jit(device=True, inline="always")
def quad_sums(l0, l1):
    """Rows r0's and r1's softmax sums completed across the 4 lanes of a quad."""
    l0 += shfl_xor(l0, 1)
    l0 += shfl_xor(l0, 2)
    l1 += shfl_xor(l1, 1)
    l1 += shfl_xor(l1, 2)
    return l0, l1


@cuda.jit(device=True, inline="always")
def write_rows(o, l0, l1, out, h, r0, r1, t, n_q, n_o):
    """Rows r0 and r1 of head h: the quad's softmax sums completed across its 4 lanes, then the
    lane's O accumulators (n_o n8 dim tiles) divided by them; rows past n_q are not written."""
    l0, l1 = quad_sums(l0, l1)
    for nt in range(n_o):
        d = nt * 8 + 2 * t
        if r0 < n_q:
            out[r0, h, d] = o[nt * 4] / l0
            out[r0, h, d + 1] = o[nt * 4 + 1] / l0
        if r1 < n_q:
            out[r1, h, d] = o[nt * 4 + 2] / l1
            out[r1, h, d + 1] = o[nt * 4 + 3] / l1


@cuda.jit(device=True, inline="always")
def write_rows_half(o, l0, l1, out, h, r0, r1, t, n_q, n_o):
    """`write_rows` into f16 pairs: out u32 [n_q, n_head, head_dim / 2], each word two
    neighbouring values rounded to nearest (the rounding the f16-input GEMM after it would apply
    to f32 values)."""
    l0, l1 = quad_sums(l0, l1)
    for nt in range(n_o):
        w = nt * 4 + t
        if r0 < n_q:
            out[r0, h, w] = pack_half2(o[nt * 4] / l0, o[nt * 4 + 1] / l0)
        if r1 < n_q:
            out[r1, h, w] = pack_half2(o[nt * 4 + 2] / l1, o[nt * 4 + 3] / l1)


def block_shape(group: int, warps: int) -> tuple[int, int]:
    """(heads per block hb, 16-token groups per block tw) for `warps` warps at GQA group `group`:
    hb the largest divisor of the group not above `warps`, tw = warps // hb."""
    hb = max(d for d in range(1, min(group, warps) + 1) if group % d == 0)
    return hb, warps // hb


def shared_bytes(head_dim: int, bkv: int) -> int:
    """Static shared memory of one block: K and V, two tile buffers each."""
    return 2 * 2 * bkv * (head_dim // 2 + 4) * 4


def fit_bkv(head_dim: int) -> int:
    """Keys per tile: BKV, or 16 where BKV's two K/V buffers exceed the static shared memory
    (head_dim 256: 67,584 bytes at 32 keys, 33,792 at 16)."""
    return BKV if shared_bytes(head_dim, BKV) <= MAX_SHARED_BYTES else 16


def default_min_blocks(n_warps: int) -> int:
    """Blocks per SM the launch bounds ask for by default (0: none): `MIN_BLOCKS`."""
    return MIN_BLOCKS.get(n_warps, 0)


def jit_options(hb: int, tw: int, min_blocks: int) -> dict:
    """Compile options (also recorded in the PTX registry): launch bounds when min_blocks > 0."""
    return {"launch_bounds": (32 * hb * tw, min_blocks)} if min_blocks else {}


def _f16_stager(head_dim, bkv, n_threads):
    """(lane_chunks, stage) for f16 caches, whose rows are copied by cp.async straight into
    shared memory. lane_chunks(tid, hk, keys, sh_off, g_off) fills the calling thread's part of
    every tile once: the key (within a tile; -1: none), shared byte offset (within a buffer) and
    byte offset within the key's cache rows of each of its 16-byte chunks. stage(sh, sh_at, src,
    g0, kt0, length, kstride, keys, sh_off, g_off) then issues them for keys kt0 .. kt0 + bkv - 1
    into the buffer at shared address sh_at (zeros past `length`): src is the cache as u32
    [rows, row_words], g0 its address, kstride the bytes of one key's rows (all KV heads).
    Addresses are sums of these (`cp_async16_at`), not array indexing: the tile loop took ~200
    integer instructions a thread a tile to index the arrays at every copy."""
    rw_b, cpr = (head_dim // 2 + 4) * 4, head_dim // 8  # shared row bytes; 16-byte chunks a row
    n_chunks = bkv * cpr
    per = -(-n_chunks // n_threads)

    @cuda.jit(device=True, inline="always")
    def lane_chunks(tid, hk, keys, sh_off, g_off):
        for i in range(per):
            c = tid + i * n_threads
            key, ch = c // cpr, c % cpr
            keys[i] = int32(key) if c < n_chunks else int32(-1)
            sh_off[i] = uint32(key * rw_b + ch * 16)
            g_off[i] = uint32(hk * (2 * head_dim) + ch * 16)

    @cuda.jit(device=True, inline="always")
    def stage(sh, sh_at, src, g0, kt0, length, kstride, keys, sh_off, g_off):
        for i in range(per):
            if keys[i] >= 0:
                key = int32(kt0 + keys[i])
                valid = key < length
                key = min(key, int32(length - 1))  # never an address past the cache
                cp_async16_at(sh, sh_at + sh_off[i], src,
                              g0 + uint64(key) * uint64(kstride) + uint64(g_off[i]), valid)
    return lane_chunks, stage


def _reg_stager(fmt, head_dim, bkv, n_threads):
    """Device function stage(src, scale, sh, off, kt0, length, n_kv, hk, tid, va): keys kt0 ..
    kt0 + bkv - 1 of KV head hk into sh[off:] (a word index) as f16 rows of RW words (zeros
    past `length`), dequantized from the cache's bytes `src` through va (8 f32): int8 / q4_0."""
    rw, cpr = head_dim // 2 + 4, head_dim // 8  # row words in shared; 8-value chunks per row
    read = make_reader(fmt, 8, _row_bytes(fmt, head_dim))

    @cuda.jit(device=True, inline="always")
    def stage(src, scale, sh, off, kt0, length, n_kv, hk, tid, va):
        for c in range(tid, bkv * cpr, n_threads):
            key, ch = c // cpr, c % cpr
            at = off + key * rw + ch * 4
            if kt0 + key < length:
                read(src, scale, (kt0 + key) * n_kv + hk, ch * 8, va, 0)
                for w in range(4):
                    sh[at + w] = pack_half2(va[2 * w], va[2 * w + 1])
            else:  # NaN * 0 = NaN: never stale bytes
                for w in range(4):
                    sh[at + w] = uint32(0)
    return stage


def _side_stager(fmt, head_dim, bkv, n_threads):
    """One cache side's (stage, base), whichever the format: stage(src, scale, g0, sh, sh_base,
    sh_at, kt0, length, n_kv, hk, tid, va, keys, sh_off, g_off) the f16 cp.async copies or the
    dequantizing path into the buffer at shared address sh_at (word (sh_at - sh_base) / 4 of
    sh, sh_base = smem_u32(sh)); base(src) the g0 it takes (the f16 cache's address)."""
    if fmt == "f16":
        _, f16 = _f16_stager(head_dim, bkv, n_threads)

        @cuda.jit(device=True, inline="always")
        def stage(src, scale, g0, sh, sh_base, sh_at, kt0, length, n_kv, hk, tid, va, keys,
                  sh_off, g_off):
            f16(sh, sh_at, src, g0, kt0, length, n_kv * (2 * head_dim), keys, sh_off, g_off)

        @cuda.jit(device=True, inline="always")
        def base(src):
            return gaddr(src, 0, 0)
        return stage, base
    regs = _reg_stager(fmt, head_dim, bkv, n_threads)

    @cuda.jit(device=True, inline="always")
    def stage(src, scale, g0, sh, sh_base, sh_at, kt0, length, n_kv, hk, tid, va, keys, sh_off,
              g_off):
        regs(src, scale, sh, (sh_at - sh_base) // 4, kt0, length, n_kv, hk, tid, va)

    @cuda.jit(device=True, inline="always")
    def base(src):  # not read: the dequantizing path indexes the cache's bytes
        return uint64(0)
    return stage, base


def _row_update(ns, no):
    @cuda.jit(device=True, inline="always")
    def row_update(s, o, m_old, l_old, e0, kt0, pos, length, t, masked):
        """Mask (when `masked`), new row max, rescale O (only where the max moved) and l for
        one of the lane's two rows (e0 = 0: c0/c1, 2: c2/c3); scores in base 2."""
        mx = NEG_INF
        for nt in range(ns):
            for e in range(2):
                i = nt * 4 + e0 + e
                if masked:
                    key = kt0 + nt * 8 + 2 * t + e
                    if key > pos or key >= length:
                        s[i] = NEG_INF
                mx = max(mx, s[i])
        mx = max(mx, shfl_xor(mx, 1))
        mx = max(mx, shfl_xor(mx, 2))
        m_new = max(m_old, mx)
        ref = m_new if m_new != NEG_INF else float32(0.0)
        alpha = math.exp2(m_old - ref)
        total = float32(0.0)
        for nt in range(ns):
            for e in range(2):
                p = math.exp2(s[nt * 4 + e0 + e] - ref)
                s[nt * 4 + e0 + e] = p
                total += p
        if m_new != m_old:  # alpha is 1 otherwise: a warp whose rows all kept their max (most
            for nt in range(no):  # tiles past the first few) skips the multiplies
                o[nt * 4 + e0] *= alpha
                o[nt * 4 + e0 + 1] *= alpha
        return m_new, l_old * alpha + total
    return row_update


@cuda.jit(device=True, inline="always")
def mma_pair(af, fa, b0, b1, b2, b3, acc, a):
    """acc[a:a+4] += A B0 and acc[a+4:a+8] += A B1 (m16n8k16): A the fragment af[fa:fa+4], B0
    (b0, b1) and B1 (b2, b3) two n8 tiles from one ldmatrix x4."""
    d = mma_16816(af[fa], af[fa + 1], af[fa + 2], af[fa + 3], b0, b1,
                  acc[a], acc[a + 1], acc[a + 2], acc[a + 3])
    for e in range(4):
        acc[a + e] = d[e]
    d = mma_16816(af[fa], af[fa + 1], af[fa + 2], af[fa + 3], b2, b3,
                  acc[a + 4], acc[a + 5], acc[a + 6], acc[a + 7])
    for e in range(4):
        acc[a + 4 + e] = d[e]


def _tile_math(head_dim, bkv):
    """(lane_rows, scores, accumulate): lane_rows(lane) the byte offsets of the calling lane's
    ldmatrix rows in a K and a V buffer; S = Q K^T of one tile into s (f32 C fragments of
    bkv // 8 key tiles) from the K buffer's lane row at shared address k_at; O += P V with P as
    A fragments pf, from the V buffer's lane row at v_at. Every fragment's address is k_at or
    v_at plus a constant (one ldmatrix instruction with an immediate offset)."""
    kk_n, ns, kc_n, no = head_dim // 16, bkv // 8, bkv // 16, head_dim // 8
    rw_b = (head_dim // 2 + 4) * 4  # bytes of a shared row (one key)

    @cuda.jit(device=True, inline="always")
    def lane_rows(lane):
        # K: two key tiles per ldmatrix (b0 b1 of keys +0..7, of +8..15), the lane's row key
        # (lane & 7) + 8 (lane >> 4) at column 8 ((lane >> 3) & 1); V (.trans): two dim tiles,
        # key (lane & 7) + 8 ((lane >> 3) & 1) at column 8 (lane >> 4)
        k_row = uint32(((lane & 7) + ((lane >> 4) << 3)) * rw_b + ((lane >> 3) & 1) * 16)
        v_row = uint32(((lane & 7) + ((lane >> 3) & 1) * 8) * rw_b + (lane >> 4) * 16)
        return k_row, v_row

    @cuda.jit(device=True, inline="always")
    def scores(qf, sK, k_at, s):
        for i in range(ns * 4):
            s[i] = float32(0.0)
        for p in range(ns // 2):
            for kk in range(kk_n):
                b0, b1, b2, b3 = ldsm_x4_at(sK, k_at + uint32(p * 16 * rw_b + kk * 32))
                mma_pair(qf, kk * 4, b0, b1, b2, b3, s, 8 * p)

    @cuda.jit(device=True, inline="always")
    def accumulate(pf, sV, v_at, o):
        for nd in range(no // 2):
            for kc in range(kc_n):
                b0, b1, b2, b3 = ldsm_x4_trans_at(sV, v_at + uint32(kc * 16 * rw_b + nd * 32))
                mma_pair(pf, kc * 4, b0, b1, b2, b3, o, 8 * nd)
    return lane_rows, scores, accumulate


@functools.cache
def gqa_kernel(k_fmt: str, v_fmt: str, head_dim: int, hb: int, tw: int, bkv: int,
               min_blocks: int = 0, out_half: bool = False):
    """The kernel for grid (token blocks of 16 * tw, n_head // hb), 32 * hb * tw threads;
    out_half: out is u32 [n_q, n_head, head_dim / 2] (f16 pairs), else f32 [n_q, n_head,
    head_dim]."""
    write = write_rows_half if out_half else write_rows
    n_warps = hb * tw
    n_threads, tb_len = 32 * n_warps, 16 * tw
    kk_n, ns, kc_n, no = head_dim // 16, bkv // 8, bkv // 16, head_dim // 8
    tile = bkv * (head_dim // 2 + 4)  # words of one buffer of one side
    sh_words = 2 * tile
    n_qf, n_s, n_o, n_p = kk_n * 4, ns * 4, no * 4, kc_n * 4  # fragment registers of a lane
    stage_k, base_k = _side_stager(k_fmt, head_dim, bkv, n_threads)
    stage_v, base_v = _side_stager(v_fmt, head_dim, bkv, n_threads)
    lane_chunks, _ = _f16_stager(head_dim, bkv, n_threads)
    n_per = max(1, -(-bkv * (head_dim // 8) // n_threads))  # a thread's chunks of a tile
    row_update = _row_update(ns, no)
    lane_rows, scores, accumulate = _tile_math(head_dim, bkv)
    tile_b = 4 * tile  # bytes of one buffer of one side

    @cuda.jit(**({} if SIMULATED else jit_options(hb, tw, min_blocks)))
    def kernel(q, kd, ks, vd, vs, seq_len, n_ctx, n_kv, qk_scale, out):
        n_q, n_head = q.shape[0], q.shape[1]
        tb = (n_q + tb_len - 1) // tb_len - 1 - cuda.blockIdx.x  # longest rows first
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        g, t = lane >> 2, lane & 3
        h = cuda.blockIdx.y * hb + warp % hb
        hk = h // (n_head // n_kv)
        r0 = tb * tb_len + (warp // hb) * 16 + g
        r1 = r0 + 8
        start = seq_len[0]
        length = min(start + n_q, n_ctx)
        # [2 buffers, bkv keys, head_dim / 2 + 4] f16 pairs each
        sK = cuda.shared.array(sh_words, uint32, alignment=SHARED_ALIGN)
        sV = cuda.shared.array(sh_words, uint32, alignment=SHARED_ALIGN)
        qf = cuda.local.array(n_qf, uint32)
        s = cuda.local.array(n_s, float32)
        o = cuda.local.array(n_o, float32)
        pf = cuda.local.array(n_p, uint32)
        va = cuda.local.array(8, float32)
        keys = cuda.local.array(n_per, int32)
        sh_off = cuda.local.array(n_per, uint32)
        g_off = cuda.local.array(n_per, uint32)
        q_fragments(q, qf, h, r0, r1, t, n_q, qk_scale, kk_n)
        for i in range(n_o):
            o[i] = float32(0.0)
        m0, m1 = NEG_INF, NEG_INF
        l0, l1 = float32(0.0), float32(0.0)
        pos0, pos1 = start + r0, start + r1
        first = start + tb * tb_len  # the block's first position: tiles below it see no mask
        kv_end = min(length, start + min(n_q, (tb + 1) * tb_len))
        n_tiles = (kv_end + bkv - 1) // bkv
        sk0, sv0 = smem_u32(sK), smem_u32(sV)  # the buffers' shared addresses
        gk0, gv0 = base_k(kd), base_v(vd)  # the f16 caches' addresses (u32 rows)
        lane_chunks(tid, hk, keys, sh_off, g_off)
        k_row, v_row = lane_rows(lane)
        stage_k(kd, ks, gk0, sK, sk0, sk0, 0, length, n_kv, hk, tid, va, keys, sh_off, g_off)
        stage_v(vd, vs, gv0, sV, sv0, sv0, 0, length, n_kv, hk, tid, va, keys, sh_off, g_off)
        for j in range(n_tiles):
            kt0, buf = j * bkv, uint32((j & 1) * tile_b)
            cp_async_wait()
            cuda.syncthreads()  # tile j visible; every warp is done with tile j - 1's buffer
            if j + 1 < n_tiles:
                nxt = uint32(tile_b) - buf
                stage_k(kd, ks, gk0, sK, sk0, sk0 + nxt, kt0 + bkv, length, n_kv, hk, tid, va,
                        keys, sh_off, g_off)
                stage_v(vd, vs, gv0, sV, sv0, sv0 + nxt, kt0 + bkv, length, n_kv, hk, tid, va,
                        keys, sh_off, g_off)
            scores(qf, sK, sk0 + buf + k_row, s)
            masked = kt0 + bkv - 1 > first
            m0, l0 = row_update(s, o, m0, l0, 0, kt0, pos0, length, t, masked)
            m1, l1 = row_update(s, o, m1, l1, 2, kt0, pos1, length, t, masked)
            p_fragments(s, pf, kc_n)
            accumulate(pf, sV, sv0 + buf + v_row, o)
        write(o, l0, l1, out, h, r0, r1, t, n_q, no)

    return kernel


def check_args(q, k: KvSide, v: KvSide, seq_len, out, bkv: int, *, half_ok: bool = False):
    """The shared launcher checks of both prefill attention kernels (ValueError naming what);
    half_ok: out may be float16."""
    _check_pair(k, v)
    lay = k.layout
    if q.dtype != np.float32 or q.ndim != 3 or q.shape[2] != lay.head_dim \
            or q.shape[1] % lay.n_kv_head:
        raise ValueError(f"q must be float32 [n_q, n_head, {lay.head_dim}] with n_head a "
                         f"multiple of {lay.n_kv_head}, got {q.dtype} {tuple(q.shape)}")
    dtypes = (np.float32, np.float16) if half_ok else (np.float32,)
    if out.dtype not in dtypes or tuple(out.shape) != tuple(q.shape):
        raise ValueError(f"out must be {' or '.join(np.dtype(d).name for d in dtypes)} "
                         f"{tuple(q.shape)}, got {out.dtype} {tuple(out.shape)}")
    if lay.head_dim % 16 or bkv % 16:
        raise ValueError(f"head_dim and bkv must be multiples of 16 (got {lay.head_dim}, {bkv})")
    if seq_len.dtype != np.int32 or tuple(seq_len.shape) != (1,):
        raise ValueError("seq_len must be an int32 [1] device array")


def cache_operand(side: KvSide):
    """What the kernel reads of one cache side: f16 rows as u32 [rows, row_words] (cp.async
    sources), other formats their bytes."""
    if side.layout.fmt != "f16":
        return side.data
    words = side.layout.row_bytes // 4
    return cached_view(side.data, f"u32_rows_{words}",
                       lambda d: d.view(np.uint32).reshape(-1, words))


def prefill_attention_gqa(q, k: KvSide, v: KvSide, seq_len, out, *, warps: int = WARPS,
                          bkv: int | None = None, min_blocks: int | None = None, stream=0):
    """Causal attention of a chunk (the contract of `attention_prefill.prefill_attention`), each
    staged K/V tile shared by the heads of one KV head. warps: warps per block (split into heads
    and 16-token groups by `block_shape`); bkv: keys per tile (None: `fit_bkv`); min_blocks:
    launch bounds (blocks per SM the registers must allow; 0: none; None:
    `default_min_blocks`). out: float32, or float16 (what the output projection's f16-input
    GEMM reads)."""
    bkv = bkv or fit_bkv(k.layout.head_dim)
    check_args(q, k, v, seq_len, out, bkv, half_ok=True)
    lay = k.layout
    if warps < 1 or (min_blocks or 0) < 0:
        raise ValueError(f"warps must be >= 1 and min_blocks >= 0 (got {warps}, {min_blocks})")
    if shared_bytes(lay.head_dim, bkv) > MAX_SHARED_BYTES:
        raise ValueError(f"bkv {bkv} at head_dim {lay.head_dim} needs "
                         f"{shared_bytes(lay.head_dim, bkv)} bytes of shared memory "
                         f"(at most {MAX_SHARED_BYTES})")
    n_q, n_head = q.shape[0], q.shape[1]
    hb, tw = block_shape(n_head // lay.n_kv_head, warps)
    if min_blocks is None:
        min_blocks = default_min_blocks(hb * tw)
    half = out.dtype == np.float16
    kernel = gqa_kernel(lay.fmt, v.layout.fmt, lay.head_dim, hb, tw, bkv, min_blocks, half)
    scale = np.float32(LOG2E / math.sqrt(lay.head_dim))
    grid = (-(-n_q // (16 * tw)), n_head // hb)
    kernel[grid, 32 * hb * tw, stream](q, cache_operand(k), k.scale, cache_operand(v), v.scale,
                                       seq_len, lay.n_ctx, lay.n_kv_head, scale,
                                       as_u32(out) if half else out)
