"""Attention kernels and the KV write in the CUDA simulator, for every KV format, against float64
references (caches filled on the host; Q4_0 encoded and decoded by gguf-py)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from helpers.kv_problem import attention_reference, decode_rows, encode_rows, filled_side
from helpers.moe_problem import rel_err
from strata.cuda_kernels import attention, attention_prefill, attention_stream, kvcache

FORMATS = ("f16", "int8", "q4_0")
HD = 64


@pytest.mark.parametrize("fmt", FORMATS)
def test_kv_write_quantizes_at_device_position(fmt):
    rng = np.random.default_rng(1)
    lay = kvcache.KvLayout(fmt, n_ctx=12, n_kv_head=2, head_dim=HD)
    side = kvcache.allocate_kv_side(lay)
    x = rng.standard_normal((3, 2, HD)).astype(np.float32)
    seq = cuda.to_device(np.array([4], np.int32))
    kvcache.kv_write(cuda.to_device(x), side, seq)
    kvcache.advance_seq_len(seq, 3)
    assert seq.copy_to_host()[0] == 7
    data = side.data.copy_to_host().reshape(12 * 2, lay.row_bytes)[8:14]
    scale = side.scale.copy_to_host()[8:14] if fmt == "int8" else None
    got = decode_rows(fmt, data, scale, HD)
    want_raw, want_scale = encode_rows(fmt, x.reshape(6, HD))
    want = decode_rows(fmt, want_raw, want_scale, HD)
    if fmt == "q4_0":  # same rounding rule as gguf-py's quantize, up to f32 vs f64 ties
        assert np.mean(data == want_raw) > 0.97
        assert np.abs(got - want).max() <= np.abs(x).max() / 8 + 1e-6
    else:
        assert np.array_equal(data, want_raw)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_kv_write_rejects_bad_input():
    side = kvcache.allocate_kv_side(kvcache.KvLayout("f16", 4, 2, HD))
    seq = cuda.to_device(np.zeros(1, np.int32))
    with pytest.raises(ValueError, match="src must be float32"):
        kvcache.kv_write(cuda.to_device(np.zeros((1, 3, HD), np.float32)), side, seq)
    with pytest.raises(ValueError, match="seq_len must be an int32"):
        kvcache.kv_write(cuda.to_device(np.zeros((1, 2, HD), np.float32)), side,
                         cuda.to_device(np.zeros(1, np.int64)))
    with pytest.raises(ValueError, match="not one of"):
        kvcache.KvLayout("q8_0", 4, 2, HD)
    with pytest.raises(ValueError, match="multiple of 32"):
        kvcache.KvLayout("f16", 4, 2, 48)


@pytest.mark.parametrize("fmt", FORMATS)
def test_prefill_attention_causal_over_prefix(fmt):
    rng = np.random.default_rng(2)
    n_kv, group, start, n_q = 1, 2, 7, 19  # a cached prefix, a chunk over two query blocks
    lay = kvcache.KvLayout(fmt, n_ctx=40, n_kv_head=n_kv, head_dim=HD)
    k, kref = filled_side(lay, rng.standard_normal((start + n_q, n_kv, HD)), rng)
    v, vref = filled_side(lay, rng.standard_normal((start + n_q, n_kv, HD)), rng)
    q = rng.standard_normal((n_q, n_kv * group, HD)).astype(np.float32)
    out = cuda.to_device(np.full(q.shape, np.nan, np.float32))
    seq = cuda.to_device(np.array([start], np.int32))
    attention_prefill.prefill_attention(cuda.to_device(q), k, v, seq, out, warps=1, bkv=16)
    got = out.copy_to_host()
    assert np.isfinite(got).all()
    assert rel_err(got, attention_reference(q, kref, vref, start)) < 2e-3


# fmt, wide, n_kv, group, head_dim, n_ctx (the plan's maximum), max_split, n_target (None: the
# launcher's), lengths. Splits per length (the rule of strata.plan.attn_split): 4 of 160 / 2 of
# 16 / 1 / 4 of 176; 7 of 32 (clamped) / 1; 2 of 16 / 3 of 32 (clamped); 4 of 160 (2.5 rounds
# of the block's warps) / 1; 4 of 32 / 2 of 32 (the last holding one key) / 1; the default target
# (256 at one KV head): 2 of 16 / 1. Head_dim 32 gives the generic kernel one value a lane.
DECODE_CASES = [
    ("f16", False, 2, 1, 32, 700, 256, 4, (600, 17, 1, 700)),
    ("int8", False, 1, 4, 32, 200, 32, 3, (200, 15)),
    ("q4_0", False, 1, 8, 32, 70, 32, 2, (17, 70)),
    ("f16", True, 1, 8, 64, 700, 256, 4, (600, 16)),
    ("f16", True, 1, 4, 64, 100, 32, 2, (100, 33, 15)),
    ("f16", True, 1, 1, 64, 40, 256, None, (17, 1)),
    ("int8", True, 2, 3, 64, 300, 256, 2, (300, 65, 1)),
]


@pytest.mark.parametrize("fmt,wide,n_kv,group,hd,n_ctx,max_split,n_target,lengths", DECODE_CASES)
def test_decode_attention_split_follows_the_device_length(fmt, wide, n_kv, group, hd, n_ctx,
                                                          max_split, n_target, lengths):
    """One set of launch arguments (what a captured graph freezes: the grid of the cache's most
    splits, the scalars), the length changed in device memory between runs: every length
    agrees with the float64 reference. The cache holds valid keys past every length (a kernel
    reading past it would change the result); the partials start as NaN and keep the splits of
    a longer run (a combine reading past the used splits would show)."""
    rng = np.random.default_rng(3)
    lay = kvcache.KvLayout(fmt, n_ctx=n_ctx, n_kv_head=n_kv, head_dim=hd)
    k, kref = filled_side(lay, rng.standard_normal((n_ctx, n_kv, hd)), rng)
    v, vref = filled_side(lay, rng.standard_normal((n_ctx, n_kv, hd)), rng)
    q = rng.standard_normal((n_kv * group, hd)).astype(np.float32)
    qd, out, seq = cuda.to_device(q), cuda.to_device(np.zeros(q.shape, np.float32)), \
        cuda.to_device(np.zeros(1, np.int32))
    parts = tuple(cuda.to_device(np.full(p.shape, np.nan, np.float32)) for p in
                  attention.allocate_partials(n_kv * group, hd, n_ctx, n_kv_head=n_kv,
                                              max_split=max_split, n_target=n_target))
    for length in lengths:
        seq.copy_to_device(np.array([length - 1], np.int32))  # the new token is written already
        out.copy_to_device(np.full(q.shape, np.nan, np.float32))
        attention.decode_attention(qd, k, v, seq, out, parts, max_split=max_split,
                                   n_target=n_target, wide=wide)
        ref = attention_reference(q[None], kref, vref, length - 1)[0]
        assert rel_err(out.copy_to_host(), ref) < 1e-5, length


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_attention_at_head_dim_32(fmt):
    """One value per lane (head_dim 32): the f16 reader read none before (its pair loop was
    empty), so every score came from whatever the registers held."""
    rng = np.random.default_rng(8)
    n_kv, group, length, hd = 1, 2, 20, 32
    lay = kvcache.KvLayout(fmt, n_ctx=24, n_kv_head=n_kv, head_dim=hd)
    k, kref = filled_side(lay, rng.standard_normal((length, n_kv, hd)), rng)
    v, vref = filled_side(lay, rng.standard_normal((length, n_kv, hd)), rng)
    q = rng.standard_normal((n_kv * group, hd)).astype(np.float32)
    out = cuda.to_device(np.full(q.shape, np.nan, np.float32))
    parts = attention.allocate_partials(n_kv * group, hd, lay.n_ctx, n_kv_head=n_kv,
                                        max_split=16)  # two splits of 16 keys
    seq = cuda.to_device(np.array([length - 1], np.int32))
    attention.decode_attention(cuda.to_device(q), k, v, seq, out, parts, max_split=16,
                               wide=False)
    assert rel_err(out.copy_to_host(), attention_reference(q[None], kref, vref, length - 1)[0]) \
        < 1e-5


def test_attention_launchers_reject_bad_input():
    lay = kvcache.KvLayout("f16", 8, 2, HD)
    k = kvcache.allocate_kv_side(lay)
    v = kvcache.allocate_kv_side(kvcache.KvLayout("f16", 8, 1, HD))
    seq = cuda.to_device(np.zeros(1, np.int32))
    q = cuda.to_device(np.zeros((4, HD), np.float32))
    parts = attention.allocate_partials(4, HD, 8, n_kv_head=2)
    with pytest.raises(ValueError, match="differ in shape"):
        attention.decode_attention(q, k, v, seq, cuda.to_device(np.zeros((4, HD), np.float32)),
                                   parts)
    with pytest.raises(ValueError, match="q must be float32"):
        attention.decode_attention(cuda.to_device(np.zeros((3, HD), np.float32)), k, k, seq,
                                   q, parts)
    out = cuda.to_device(np.zeros((4, HD), np.float32))
    long = kvcache.allocate_kv_side(kvcache.KvLayout("f16", 40, 2, HD))  # up to 3 splits of 16
    with pytest.raises(ValueError, match=r"with n >= 3 splits"):
        attention.decode_attention(q, long, long, seq, out, parts, min_split=16)
    with pytest.raises(ValueError, match="partials must be"):  # the wrong head count
        attention.decode_attention(q, k, k, seq, out,
                                   attention.allocate_partials(2, HD, 8, n_kv_head=2))
    for bad in (8, 24):
        with pytest.raises(ValueError, match="longest split must be a positive multiple of 16"):
            attention.decode_attention(q, k, k, seq, out, parts, max_split=bad)
    with pytest.raises(ValueError, match="split target must be at least 1"):
        attention.decode_attention(q, k, k, seq, out, parts, n_target=0)
    with pytest.raises(ValueError, match="out must be float32"):
        attention_prefill.prefill_attention(cuda.to_device(np.zeros((2, 4, HD), np.float32)),
                                            k, k, seq, q)


@pytest.mark.parametrize("fmt", ["f16", "int8"])
@pytest.mark.parametrize("hd,n_kv,group,split", [(64, 2, 3, 16), (128, 1, 8, 32),
                                                 (64, 1, 8, 80), (64, 2, 16, 16),
                                                 (64, 1, 12, 32)])
def test_decode_attention_wide_f16_against_generic_and_reference(hd, n_kv, group, split, fmt):
    """The tensor-core kernel, f16 and int8 K/V: partial last split, stale random bytes past the
    length, a group of 3, the 30B shape's group of 8, and groups of 16 (Qwen3-235B's: two blocks
    a KV head) and 12 (a second block of 4 heads), splits of one tile a warp or fewer and
    of five tiles (a warp then takes two: a second round, its running max and sums rescaled);
    agrees with the float64 reference and with the generic kernel (splits of `split` keys: one
    split aimed at, clamped). The int8 V values are small (row scales ~2e-5), where a
    probability times its scale would sit in f16's subnormals."""
    rng = np.random.default_rng(5)
    length = 2 * split + 5
    lay = kvcache.KvLayout(fmt, n_ctx=3 * split + 3, n_kv_head=n_kv, head_dim=hd)
    k, kref = filled_side(lay, rng.standard_normal((length, n_kv, hd)), rng)
    v, vref = filled_side(lay, rng.standard_normal((length, n_kv, hd))
                          * (1e-3 if fmt == "int8" else 1.0), rng)
    q = rng.standard_normal((n_kv * group, hd)).astype(np.float32)
    seq = cuda.to_device(np.array([length - 1], np.int32))
    ref = attention_reference(q[None], kref, vref, length - 1)[0]
    got = {}
    for wide in (True, False):
        out = cuda.to_device(np.full(q.shape, np.nan, np.float32))
        parts = attention.allocate_partials(n_kv * group, hd, lay.n_ctx, n_kv_head=n_kv,
                                            max_split=split, n_target=1)
        attention.decode_attention(cuda.to_device(q), k, v, seq, out, parts, max_split=split,
                                   n_target=1, wide=wide)
        got[wide] = out.copy_to_host()
        assert rel_err(got[wide], ref) < 1e-5
    assert rel_err(got[True], got[False]) < 1e-5


def test_decode_attention_split_floor():
    """The tensor-core kernel with splits of at least 64 keys (the default floor) and of at
    least 16, over one set of launch arguments and partials sized for the floor: both agree
    with the float64 reference at every length, and a floor past the longest split gives way
    to it (the generic kernel takes the default floor in DECODE_CASES)."""
    assert attention.min_split_for("f16", "f16", 64, 8, 256) == 64  # the kernels' own floors
    assert attention.min_split_for("f16", "f16", 64, 8, 256, wide=False) == 16
    assert attention.min_split_for("int8", "int8", 64, 8, 256) == 64
    assert attention.min_split_for("q4_0", "q4_0", 64, 8, 256) == 16
    rng = np.random.default_rng(11)
    n_kv, group, hd, n_ctx = 1, 8, 64, 200
    lay = kvcache.KvLayout("f16", n_ctx=n_ctx, n_kv_head=n_kv, head_dim=hd)
    k, kref = filled_side(lay, rng.standard_normal((n_ctx, n_kv, hd)), rng)
    v, vref = filled_side(lay, rng.standard_normal((n_ctx, n_kv, hd)), rng)
    q = rng.standard_normal((n_kv * group, hd)).astype(np.float32)
    qd, seq = cuda.to_device(q), cuda.to_device(np.zeros(1, np.int32))
    for min_split, max_split in ((64, 256), (16, 256), (64, 32)):
        parts = tuple(cuda.to_device(np.full(p.shape, np.nan, np.float32)) for p in
                      attention.allocate_partials(n_kv * group, hd, n_ctx, n_kv_head=n_kv,
                                                  max_split=max_split, min_split=min_split))
        for length in (200, 65, 1):
            seq.copy_to_device(np.array([length - 1], np.int32))
            out = cuda.to_device(np.full(q.shape, np.nan, np.float32))
            attention.decode_attention(qd, k, v, seq, out, parts, max_split=max_split,
                                       min_split=min_split, wide=True)
            ref = attention_reference(q[None], kref, vref, length - 1)[0]
            assert rel_err(out.copy_to_host(), ref) < 1e-5, (min_split, max_split, length)
    with pytest.raises(ValueError, match="shortest split must be a positive multiple of 16"):
        attention.decode_attention(qd, k, v, seq, out, parts, min_split=8)


def test_combine_merges_the_used_splits():
    """The second pass alone on random partials, against numpy: the splits a length uses (one,
    a few, more than a warp's 32, more than two warps' worth, more than the outputs loaded
    before the reductions (COMBINE_EARLY a warp), more than a thread each), partials past them
    NaN (a merge reading past the used splits would show)."""
    rng = np.random.default_rng(12)
    n_head, hd, n_split = 2, 32, 300
    n_ctx = n_split * 16
    assert attention.COMBINE_EARLY * attention.COMBINE_WARPS < 129
    for n_used in (1, 5, 33, 70, 129, 290):
        ml = np.full((n_split, n_head, 2), np.nan, np.float32)
        po = np.full((n_split, n_head, hd), np.nan, np.float32)
        ml[:n_used, :, 0] = rng.normal(0, 4, (n_used, n_head))  # split maxima far apart
        ml[:n_used, :, 1] = rng.uniform(1, 16, (n_used, n_head))
        po[:n_used] = rng.standard_normal((n_used, n_head, hd))
        w = np.exp(ml[:n_used, :, 0] - ml[:n_used, :, 0].max(0))  # [n_used, n_head]
        want = (w[:, :, None] * po[:n_used]).sum(0) / (w * ml[:n_used, :, 1]).sum(0)[:, None]
        # splits of 16 keys aimed at n_ctx / 16 = n_split: length 16 * n_used uses n_used
        seq = cuda.to_device(np.array([16 * n_used - 1], np.int32))
        out = cuda.to_device(np.full((n_head, hd), np.nan, np.float32))
        attention._combine[(n_head, hd // 32), attention.COMBINE_THREADS](
            cuda.to_device(po), cuda.to_device(ml), seq, 1, n_ctx, n_split, 256, 16, out)
        assert rel_err(out.copy_to_host(), want) < 1e-5, n_used


def test_decode_attention_picks_the_streaming_kernel():
    """The streaming kernel is the tensor-core kernel and takes any split length (it keeps no
    score buffer); it refuses what it cannot read, and the rest runs the generic kernel."""
    assert attention.decode_kernel("f16", "f16", 128, 8, 256) is \
        attention_stream.stream_kernel("f16", 128, 8, 256, 64)
    assert attention.decode_kernel("f16", "f16", 128, 8, 4096) is \
        attention_stream.stream_kernel("f16", 128, 8, 4096, 64)
    assert attention.decode_kernel("int8", "int8", 128, 8, 256) is \
        attention_stream.stream_kernel("int8", 128, 8, 256, 64)
    assert attention.decode_kernel("q4_0", "q4_0", 128, 8, 256) is attention._split_kernel(
        "q4_0", "q4_0", 128, 8, 256, 16)
    assert attention.decode_kernel("f16", "f16", 128, 16, 256) is \
        attention_stream.stream_kernel("f16", 128, 16, 256, 64)
    # a block takes 8 query heads: a larger group gets blocks per KV head, the generic kernel one
    assert [attention.kv_blocks("f16", "f16", 128, g, 256) for g in (1, 8, 9, 16, 32)] == \
        [1, 1, 2, 2, 4]
    assert attention.kv_blocks("f16", "f16", 128, 16, 256, wide=False) == 1
    assert attention.kv_blocks("q4_0", "q4_0", 128, 16, 256) == 1
    assert attention_stream.shared_bytes(128) <= attention_stream.MAX_SHARED_BYTES
    for case in (("q4_0", "q4_0", 128, 8, 256), ("f16", "int8", 128, 8, 256),
                 ("f16", "f16", 96, 4, 256),
                 ("f16", "f16", 256, 8, 256), ("f16", "f16", 64, 33, 256),
                 ("f16", "f16", 128, 8, 100)):
        with pytest.raises(ValueError, match="tensor-core decode-attention kernel needs"):
            attention.decode_kernel(*case, wide=True)
    with pytest.raises(ValueError, match="longest split 100 not supported"):
        attention_stream.stream_kernel("f16", 128, 8, 100)


def test_warp_all_votes_over_the_whole_warp():
    """`mma.warp_all` (the f16 stream kernel skips its rescale when the vote holds): true only
    where all 32 lanes' predicates hold, the same answer in every lane."""
    from strata.cuda_kernels.mma import warp_all

    @cuda.jit
    def vote(flags, out):
        w = cuda.blockIdx.x
        out[w, cuda.threadIdx.x] = 1 if warp_all(flags[w, cuda.threadIdx.x] != 0) else 0

    flags = np.ones((3, 32), np.int32)
    flags[1, 17] = 0  # one lane false
    flags[2] = 0      # every lane false
    out = cuda.device_array((3, 32), np.int32)
    vote[3, 32](cuda.to_device(flags), out)
    assert out.copy_to_host().tolist() == [[1] * 32, [0] * 32, [0] * 32]


def test_launcher_default_split_is_the_kernels_longest():
    """With no max_split the launcher takes the kernel's longest split (`longest_split`): 512
    keys for the f16 tensor-core kernel (so a long context makes half the splits, the combine
    half the work), 256 for int8 and for the generic kernel; partials sized with the plan's
    default hold them. A 1,100-key f16 run with one split aimed at takes three splits of 512
    (the partials past them NaN) and agrees with float64."""
    assert attention.longest_split("f16", "f16", 64, 8) == 512
    assert attention.longest_split("int8", "int8", 64, 8) == attention.SPLIT_LEN
    assert attention.longest_split("f16", "f16", 64, 8, wide=False) == attention.SPLIT_LEN
    assert attention.longest_split("q4_0", "q4_0", 64, 8) == attention.SPLIT_LEN
    rng = np.random.default_rng(5)
    n_ctx, length = 1152, 1100
    lay = kvcache.KvLayout("f16", n_ctx=n_ctx, n_kv_head=1, head_dim=HD)
    k, kref = filled_side(lay, rng.standard_normal((n_ctx, 1, HD)), rng)
    v, vref = filled_side(lay, rng.standard_normal((n_ctx, 1, HD)), rng)
    q = rng.standard_normal((8, HD)).astype(np.float32)
    out = cuda.to_device(np.full(q.shape, np.nan, np.float32))
    parts = tuple(cuda.to_device(np.full(p.shape, np.nan, np.float32)) for p in
                  attention.allocate_partials(8, HD, n_ctx, n_kv_head=1, n_target=1))
    seq = cuda.to_device(np.array([length - 1], np.int32))
    attention.decode_attention(cuda.to_device(q), k, v, seq, out, parts, n_target=1)
    ml = parts[1].copy_to_host()
    assert np.isfinite(ml[:3]).all() and np.isnan(ml[3:]).all()  # splits of 512: 3 used
    ref = attention_reference(q[None], kref, vref, length - 1)[0]
    assert rel_err(out.copy_to_host(), ref) < 1e-5
