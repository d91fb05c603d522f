"""Decode attention over the KV cache, split along the keys (flash-decoding).

One query token, `n_head` query heads sharing `n_kv_head` KV heads (GQA group G = n_head /
n_kv_head). Pass 1 (`decode_attention`): a block per (kv head, split) scores its keys for the G
query heads (the tensor-core kernel: `kv_blocks` blocks a kv head, 8 query heads each), takes the
split's softmax statistics (max m, sum l of exp(s - m)) and the unnormalised sum of exp(s - m) * v;
pass 2 (`_combine`) merges the splits. The sequence length L is read from device memory (seq_len[0]
+ n_new keys are valid) and so is the split length: both passes derive it from L by
`strata.plan.attn_split.split_len` (about SPLIT_K_BLOCKS blocks once L fills them, splits of at
least the kernel's floor, `min_split_for`, and at most `max_split` keys). A CUDA graph captured
once (grid sized for the most splits any length up to the cache's capacity can use; splits past the
length exit at once) replays at every position, with as many live blocks as the length calls for.

Work inside a block: a warp owns one key at a time; lane l holds dims l*D..l*D+D-1 (D =
head_dim/32) of the key and of all G query vectors (in registers). The G partial dot products
are reduced across the warp by a transposing butterfly (each step halves the values per lane),
9 shuffles for G = 8 instead of 40. Keys are loaded `UNROLL` at a time so several rows are in
flight per lane.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32

from strata.plan import attn_split

from . import attention_stream
from .kvcache import KvSide, make_reader
from .launch import factory_cache
from .mma import shfl_xor

WARPS = 4
THREADS = 32 * WARPS
UNROLL = 4
SPLIT_LEN = attn_split.SPLIT_K_TOKENS  # the longest split (the shared score buffer's length)
NEG_INF = float32(-np.inf)
_split_len = cuda.jit(device=True, inline="always")(attn_split.split_len)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@factory_cache
def _split_kernel(k_fmt, v_fmt, head_dim, group, max_split, min_split=attn_split.SPLIT_K_GRAIN):
    D = head_dim // 32
    GP = _pow2_at_least(group)  # padded group: the butterfly halves the value count
    STEPS_SCATTER = GP.bit_length() - 1  # butterfly steps that halve the values per lane
    REPL = 32 // GP  # lanes that end holding the same head's sum
    read_k = make_reader(k_fmt, D, _row_bytes(k_fmt, head_dim))
    read_v = make_reader(v_fmt, D, _row_bytes(v_fmt, head_dim))
    CAP = max_split  # scores per head in shared memory: the longest split
    N_SCORES, N_RED = group * CAP, group * head_dim
    N_Q, N_KV, N_ACC = GP * D, UNROLL * D, group * D
    STEP = WARPS * UNROLL  # keys per round of the block

    @cuda.jit(device=True, inline="always")
    def load_k(kd, ks, k0, base, n_keys, n_kv, hk, lane, dst):
        for u in range(UNROLL):  # past the split's end: re-read its last key, discarded later
            key = k0 + min(base + u, n_keys - 1)
            read_k(kd, ks, key * n_kv + hk, lane * D, dst, u * D)

    @cuda.jit(device=True, inline="always")
    def load_v(vd, vs, k0, base, n_keys, n_kv, hk, lane, dst):
        for u in range(UNROLL):
            key = k0 + min(base + u, n_keys - 1)
            read_v(vd, vs, key * n_kv + hk, lane * D, dst, u * D)

    @cuda.jit
    def kernel(q, kd, ks, vd, vs, seq_len, n_new, n_ctx, n_target, qk_scale, part_o, part_ml):
        hk, split = cuda.blockIdx.x, cuda.blockIdx.y
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        n_kv = q.shape[0] // group
        length = min(seq_len[0] + n_new, n_ctx)
        split_len = _split_len(length, n_target, CAP, min_split)  # <= CAP
        k0 = int32(split * split_len)  # positions fit 32 bits (seq_len is int32): fewer registers
        n_keys = int32(min(split_len, length - k0))
        if n_keys <= 0:
            return
        s_p = cuda.shared.array(N_SCORES, float32)  # scores, then probabilities [G, CAP]
        s_red = cuda.shared.array(N_RED, float32)   # [G, head_dim] cross-warp sum of P V
        qreg = cuda.local.array(N_Q, float32)
        kv = cuda.local.array(N_KV, float32)
        kv_next = cuda.local.array(N_KV, float32)  # the next round's rows, loading meanwhile
        part = cuda.local.array(GP, float32)
        acc = cuda.local.array(N_ACC, float32)
        for g in range(GP):
            for i in range(D):
                qreg[g * D + i] = float32(0.0)
                if g < group:
                    qreg[g * D + i] = q[hk * group + g, lane * D + i] * qk_scale
        # pass A: scores; rows of round r + 1 are requested before round r is computed
        load_k(kd, ks, k0, warp * UNROLL, n_keys, n_kv, hk, lane, kv_next)
        for base in range(warp * UNROLL, n_keys, STEP):
            for i in range(N_KV):
                kv[i] = kv_next[i]
            if base + STEP < n_keys:
                load_k(kd, ks, k0, base + STEP, n_keys, n_kv, hk, lane, kv_next)
            for u in range(UNROLL):
                for g in range(GP):
                    s = float32(0.0)
                    for i in range(D):
                        s += qreg[g * D + i] * kv[u * D + i]
                    part[g] = s
                half = GP // 2
                mask = 16
                for _ in range(STEPS_SCATTER):  # transposing butterfly: lane keeps one half
                    upper = (lane & mask) != 0
                    for i in range(half):
                        send = part[i] if upper else part[i + half]
                        keep = part[i + half] if upper else part[i]
                        part[i] = keep + shfl_xor(send, mask)
                    half //= 2
                    mask //= 2
                s = part[0]
                while mask >= 1:
                    s += shfl_xor(s, mask)
                    mask //= 2
                head = lane // REPL  # the head index bits are the lane's top bits
                if lane % REPL == 0 and head < group and base + u < n_keys:
                    s_p[head * CAP + base + u] = s
        load_v(vd, vs, k0, warp * UNROLL, n_keys, n_kv, hk, lane, kv_next)  # lands during pass B
        cuda.syncthreads()
        # pass B: softmax statistics per head
        for g in range(warp, group, WARPS):
            m = NEG_INF
            for k in range(lane, n_keys, 32):
                m = max(m, s_p[g * CAP + k])
            for sh in (16, 8, 4, 2, 1):
                m = max(m, shfl_xor(m, sh))
            total = float32(0.0)
            for k in range(lane, n_keys, 32):
                p = math.exp(s_p[g * CAP + k] - m)
                s_p[g * CAP + k] = p
                total += p
            for sh in (16, 8, 4, 2, 1):
                total += shfl_xor(total, sh)
            if lane == 0:
                part_ml[split, hk * group + g, 0] = m
                part_ml[split, hk * group + g, 1] = total
        cuda.syncthreads()
        # pass C: unnormalised P V
        for i in range(N_ACC):
            acc[i] = float32(0.0)
        for base in range(warp * UNROLL, n_keys, STEP):
            for i in range(N_KV):
                kv[i] = kv_next[i]
            if base + STEP < n_keys:
                load_v(vd, vs, k0, base + STEP, n_keys, n_kv, hk, lane, kv_next)
            for u in range(UNROLL):
                if base + u < n_keys:
                    for g in range(group):
                        p = s_p[g * CAP + base + u]
                        for i in range(D):
                            acc[g * D + i] += p * kv[u * D + i]
        for w in range(WARPS):  # fixed order: the sum does not depend on scheduling
            if warp == w:
                for g in range(group):
                    for i in range(D):
                        o = g * head_dim + lane * D + i
                        s_red[o] = acc[g * D + i] if w == 0 else s_red[o] + acc[g * D + i]
            cuda.syncthreads()
        for o in range(tid, N_RED, THREADS):
            part_o[split, hk * group + o // head_dim, o % head_dim] = s_red[o]

    return kernel


def decode_kernel(k_fmt, v_fmt, head_dim, group, max_split, *, wide=None, min_split=None):
    """The pass-1 kernel for this case: the tensor-core kernel (`attention_stream`: f16 or int8
    K and V) where it applies (unless wide=False), else the generic one. wide=True insists on
    the tensor-core kernel.
    max_split / min_split: the longest split (the generic kernel's shared score buffer's
    length) / the shortest (where the longest allows it) and the granularity; None: the
    kernel's own (`min_split_for`)."""
    tc = attention_stream  # the tensor-core kernel's module: its limits name the refusal
    ok = tc.supports(k_fmt, v_fmt, head_dim, group, max_split)
    if wide and not ok:
        raise ValueError(f"the tensor-core decode-attention kernel needs K and V both "
                         f"{' or '.join(tc.FORMATS)}, head_dim in {tc.HEAD_DIMS}, a GQA group "
                         f"of at most {tc.MAX_GROUP} and a longest split multiple of {tc.TILE}; "
                         f"got {k_fmt}/{v_fmt}, head_dim {head_dim}, group {group}, longest "
                         f"split {max_split}")
    if min_split is None:
        min_split = min_split_for(k_fmt, v_fmt, head_dim, group, max_split, wide=wide)
    if _tensor_cores(k_fmt, v_fmt, head_dim, group, max_split, wide):
        return tc.stream_kernel(k_fmt, head_dim, group, max_split, min_split)
    return _split_kernel(k_fmt, v_fmt, head_dim, group, max_split, min_split)


def _tensor_cores(k_fmt, v_fmt, head_dim, group, max_split, wide) -> bool:
    """Whether `decode_kernel` picks the tensor-core kernel for this case."""
    return wide is not False and attention_stream.supports(k_fmt, v_fmt, head_dim, group,
                                                           max_split)


def kv_blocks(k_fmt, v_fmt, head_dim, group, max_split, *, wide=None) -> int:
    """Blocks of the pass-1 grid per KV head (grid x = n_kv_head * this): the tensor-core
    kernel takes 8 query heads a block (`attention_stream.n_sub`), the generic one a whole
    group."""
    if _tensor_cores(k_fmt, v_fmt, head_dim, group, max_split, wide):
        return attention_stream.n_sub(group)
    return 1


def longest_split(k_fmt, v_fmt, head_dim, group, *, wide=None) -> int:
    """The longest split the launcher gives the kernel `decode_kernel` picks, where the caller
    names none: the tensor-core kernel's by format (`attention_stream.LONG_SPLIT`), SPLIT_LEN
    (its shared score buffer) for the generic one. Partials sized for SPLIT_LEN (the plan's,
    `allocate_partials`' default) hold the splits of either: a longer split makes fewer."""
    if _tensor_cores(k_fmt, v_fmt, head_dim, group, SPLIT_LEN, wide):
        return max(SPLIT_LEN, attention_stream.LONG_SPLIT[k_fmt])
    return SPLIT_LEN


def min_split_for(k_fmt, v_fmt, head_dim, group, max_split, *, wide=None) -> int:
    """The shortest split of the kernel `decode_kernel` picks: SPLIT_K_MIN (64) for the
    tensor-core kernel (a tile for each of its four warps), SPLIT_K_GRAIN (16) for the generic
    one (its block takes 16 keys a round; longer splits only serialise them)."""
    if _tensor_cores(k_fmt, v_fmt, head_dim, group, max_split, wide):
        return attn_split.SPLIT_K_MIN
    return attn_split.SPLIT_K_GRAIN


COMBINE_WARPS = 8
MAX_SPLITS = 4096  # 16 KiB of split weights in shared memory: 1M positions at split 256
COMBINE_THREADS = COMBINE_WARPS * 32


@cuda.jit(device=True, inline="always")
def _block_reduce(v, is_max, s_red, warp, lane):
    """Max or sum of v over the block (COMBINE_WARPS warps), returned to every thread."""
    for sh in (16, 8, 4, 2, 1):
        o = shfl_xor(v, sh)
        v = max(v, o) if is_max else v + o
    if lane == 0:
        s_red[warp] = v
    cuda.syncthreads()
    v = s_red[0]
    for w in range(1, COMBINE_WARPS):
        v = max(v, s_red[w]) if is_max else v + s_red[w]
    cuda.syncthreads()
    return v


COMBINE_EARLY = 16  # partial outputs a thread loads before the reductions (128 splits: 32K keys)


@cuda.jit
def _combine(part_o, part_ml, seq_len, n_new, n_ctx, n_target, max_split, min_split, out):
    """Block (head, 32-dim slice): merge the used splits (their count derived from the length
    as pass 1 derives it); every loop runs across the splits in parallel (a serial walk over
    hundreds of splits was the slowest part of decode). Every load is issued first: a
    thread's split statistics and its share of the first COMBINE_EARLY * COMBINE_WARPS splits'
    outputs (in registers), so the merge waits on one memory latency, not one per step."""
    h, d = cuda.blockIdx.x, cuda.blockIdx.y * 32 + cuda.threadIdx.x % 32
    tid = cuda.threadIdx.x
    warp, lane = tid // 32, tid % 32
    s_w = cuda.shared.array(MAX_SPLITS, float32)
    s_red = cuda.shared.array(COMBINE_THREADS, float32)
    early = cuda.local.array(COMBINE_EARLY, float32)
    length = min(seq_len[0] + n_new, n_ctx)
    split_len = _split_len(length, n_target, max_split, min_split)
    n_used = min((length + split_len - 1) // split_len, MAX_SPLITS)
    m_own = NEG_INF
    l_own = float32(0.0)
    if tid < n_used:
        m_own = part_ml[tid, h, 0]
        l_own = part_ml[tid, h, 1]
    for i in range(COMBINE_EARLY):
        s = warp + COMBINE_WARPS * i
        early[i] = part_o[s, h, d] if s < n_used else float32(0.0)
    m = m_own
    for s in range(tid + COMBINE_THREADS, n_used, COMBINE_THREADS):
        m = max(m, part_ml[s, h, 0])
    m = _block_reduce(m, True, s_red, warp, lane)
    den = float32(0.0)
    if tid < n_used:
        w = math.exp(m_own - m)
        s_w[tid] = w
        den = w * l_own
    for s in range(tid + COMBINE_THREADS, n_used, COMBINE_THREADS):
        w = math.exp(part_ml[s, h, 0] - m)
        s_w[s] = w
        den += w * part_ml[s, h, 1]
    den = _block_reduce(den, False, s_red, warp, lane)  # its barriers also publish s_w
    acc = float32(0.0)
    for i in range(COMBINE_EARLY):
        s = warp + COMBINE_WARPS * i
        if s < n_used:
            acc += s_w[s] * early[i]
    for s in range(warp + COMBINE_WARPS * COMBINE_EARLY, n_used, COMBINE_WARPS):
        acc += s_w[s] * part_o[s, h, d]
    s_red[warp * 32 + lane] = acc
    cuda.syncthreads()
    if warp == 0:
        for w in range(1, COMBINE_WARPS):
            acc += s_red[w * 32 + lane]
        out[h, d] = acc / den


def _check_pair(k: KvSide, v: KvSide):
    a, b = k.layout, v.layout
    if (a.n_ctx, a.n_kv_head, a.head_dim) != (b.n_ctx, b.n_kv_head, b.head_dim):
        raise ValueError(f"K and V caches differ in shape: {a} vs {b}")


def _row_bytes(fmt, head_dim):
    return {"f16": 2 * head_dim, "int8": head_dim, "q4_0": head_dim // 32 * 18}[fmt]


def n_splits(n_ctx: int, n_target: int, max_split: int = SPLIT_LEN,
             min_split: int = attn_split.SPLIT_K_GRAIN) -> int:
    """The pass-1 grid's splits for a cache of `n_ctx` positions: the most any length uses (the
    grid a captured graph is built for; `strata.plan.attn_split.max_splits`)."""
    return attn_split.max_splits(n_ctx, n_target, max_split, min_split)


def allocate_partials(n_head: int, head_dim: int, n_ctx: int, *, n_kv_head: int,
                      max_split: int = SPLIT_LEN, n_target: int | None = None,
                      min_split: int = attn_split.SPLIT_K_GRAIN):
    """(part_o [n_split, n_head, head_dim] f32, part_ml [n_split, n_head, 2] f32) scratch for a
    cache of n_ctx positions (n_target: splits aimed at, default by `attn_split.split_target`;
    min_split: the shortest split they must hold the splits of; the default, the smallest,
    holds either kernel's)."""
    t = attn_split.split_target(n_kv_head) if n_target is None else n_target
    s = n_splits(n_ctx, t, max_split, min_split)
    return (cuda.device_array((s, n_head, head_dim), np.float32),
            cuda.device_array((s, n_head, 2), np.float32))


def decode_attention(q, k: KvSide, v: KvSide, seq_len, out, partials, *, n_new: int = 1,
                     max_split: int | None = None, n_target: int | None = None, stream=0,
                     wide: bool | None = None, min_split: int | None = None):
    """out[h] = softmax(q[h] . K[0:L, h // G] / sqrt(head_dim)) @ V[0:L, h // G].

    q: [n_head, head_dim] f32 (the last new token's queries, RoPE applied); k, v: the layer's
    cache sides (the new tokens already written); L = seq_len[0] + n_new read on the device;
    out: [n_head, head_dim] f32; partials: (part_o [n, n_head, head_dim] f32, part_ml
    [n, n_head, 2] f32) with n at least `n_splits(n_ctx, n_target, max_split)` (e.g. from
    `allocate_partials`). The split length follows L on the device (`attn_split.split_len`):
    n_target splits aimed at (default: `attn_split.split_target(n_kv_head)`), each of at most
    max_split keys (a multiple of 16; None: the kernel's own, `longest_split`).
    wide: None picks the tensor-core kernel (f16 or int8 K and V) where it applies; False forces
    the generic kernel; True requires the tensor-core kernel (ValueError where it does not
    apply).
    min_split: the shortest split where max_split allows it (a multiple of 16; None: the
    kernel's, `min_split_for`); the partials must hold the splits the rule makes with it
    (`allocate_partials` with the same or a smaller one, e.g. its default).
    """
    lay = k.layout
    _check_pair(k, v)
    n_head, hd = q.shape if q.ndim == 2 else (0, 0)
    if q.dtype != np.float32 or q.ndim != 2 or hd != lay.head_dim or n_head % lay.n_kv_head:
        raise ValueError(f"q must be float32 [n_head, {lay.head_dim}] with n_head a multiple of "
                         f"{lay.n_kv_head}, got {q.dtype} {tuple(q.shape)}")
    group = n_head // lay.n_kv_head
    if group > 32:
        raise ValueError(f"GQA group of {group} query heads per KV head exceeds 32")
    if out.dtype != np.float32 or tuple(out.shape) != tuple(q.shape):
        raise ValueError(f"out must be float32 {tuple(q.shape)}, got {out.dtype} {tuple(out.shape)}")
    n_target = attn_split.split_target(lay.n_kv_head) if n_target is None else n_target
    if max_split is None:
        max_split = longest_split(lay.fmt, v.layout.fmt, hd, group, wide=wide)
    if min_split is None:
        min_split = min_split_for(lay.fmt, v.layout.fmt, hd, group, max_split, wide=wide)
    n_split = n_splits(lay.n_ctx, n_target, max_split, min_split)
    if n_split > MAX_SPLITS:
        raise ValueError(f"{lay.n_ctx} positions make up to {n_split} splits of at most "
                         f"{max_split} keys; at most {MAX_SPLITS}: use a longer max_split")
    _check_partials(partials, n_split, n_head, hd)
    if seq_len.dtype != np.int32 or tuple(seq_len.shape) != (1,):
        raise ValueError("seq_len must be an int32 [1] device array")
    kernel = decode_kernel(lay.fmt, v.layout.fmt, hd, group, max_split, wide=wide,
                           min_split=min_split)
    scale = np.float32(1.0 / math.sqrt(hd))
    part_o, part_ml = partials
    n_x = lay.n_kv_head * kv_blocks(lay.fmt, v.layout.fmt, hd, group, max_split, wide=wide)
    kernel[(n_x, n_split), THREADS, stream](
        q, k.data, k.scale, v.data, v.scale, seq_len, n_new, lay.n_ctx, n_target, scale,
        part_o, part_ml)
    _combine[(n_head, hd // 32), COMBINE_THREADS, stream](
        part_o, part_ml, seq_len, n_new, lay.n_ctx, n_target, max_split, min_split, out)


def _check_partials(partials, n_split: int, n_head: int, hd: int) -> None:
    part_o, part_ml = partials
    ok = (part_o.dtype == np.float32 and part_ml.dtype == np.float32 and part_o.ndim == 3
          and part_ml.ndim == 3 and part_o.shape[0] >= n_split
          and tuple(part_o.shape[1:]) == (n_head, hd)
          and tuple(part_ml.shape) == (part_o.shape[0], n_head, 2))
    if not ok:
        raise ValueError(f"partials must be float32 [n, {n_head}, {hd}] and [n, {n_head}, 2] "
                         f"with n >= {n_split} splits, got {tuple(part_o.shape)} and "
                         f"{tuple(part_ml.shape)}")
