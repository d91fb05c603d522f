"""The GQA-shared prefill attention variant (cuda_kernels/attention_prefill_gqa.py) under the CUDA
simulator, against the float64 causal reference with a cached prefix: f16 (cp.async rows,
ldmatrix / ldmatrix.trans fragments) and int8 / q4_0 (dequantized staging) caches, GQA groups
1 to 4, chunks that are not a multiple of the block's tokens, prefixes across several tiles."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from helpers.kv_problem import attention_reference, filled_side
from helpers.moe_problem import rel_err
from strata.cuda_kernels import attention_prefill, attention_prefill_gqa, kvcache

# fmt, n_kv, group, start, n_q, head_dim, warps, bkv; the block shape (heads x 16-token groups)
# block_shape gives: 2x1, 4x1, 1x4 (64 tokens: n_q 50 in one partial block), 3x1 (a group of 3
# with 4 warps asked), 4x1 over a prefix of three 16-key tiles, 2x2 at head_dim 96
CASES = [
    ("f16", 1, 2, 7, 19, 32, 2, 16),
    ("int8", 2, 4, 21, 37, 32, 4, 32),
    ("q4_0", 1, 1, 40, 50, 64, 4, 16),
    ("f16", 1, 3, 5, 17, 32, 4, 16),
    ("f16", 1, 4, 35, 30, 64, 4, 16),
    # head_dim 96: 192 16-byte chunks a tile over 128 threads (a thread's second chunk only for
    # some threads), over two KV heads (the chunks' offsets within a key's rows)
    ("f16", 2, 2, 11, 23, 96, 4, 16),
]


def _problem(fmt, n_kv, group, start, n_q, hd, seed):
    rng = np.random.default_rng(seed)
    lay = kvcache.KvLayout(fmt, n_ctx=start + n_q + 5, n_kv_head=n_kv, head_dim=hd)
    k, kref = filled_side(lay, rng.standard_normal((start + n_q, n_kv, hd)), rng)
    v, vref = filled_side(lay, rng.standard_normal((start + n_q, n_kv, hd)), rng)
    q = rng.standard_normal((n_q, n_kv * group, hd)).astype(np.float32)
    return k, v, q, attention_reference(q, kref, vref, start)


@pytest.mark.parametrize("fmt,n_kv,group,start,n_q,hd,warps,bkv", CASES)
def test_gqa_prefill_attention_matches_float64(fmt, n_kv, group, start, n_q, hd, warps, bkv):
    """Every output row written (NaN-poisoned before), against float64; the cache holds random
    bytes past the chunk (a kernel reading past the length would show)."""
    k, v, q, ref = _problem(fmt, n_kv, group, start, n_q, hd, seed=hd + n_q)
    out = cuda.to_device(np.full(q.shape, np.nan, np.float32))
    seq = cuda.to_device(np.array([start], np.int32))
    attention_prefill_gqa.prefill_attention_gqa(cuda.to_device(q), k, v, seq, out, warps=warps,
                                                bkv=bkv)
    got = out.copy_to_host()
    assert np.isfinite(got).all()
    assert rel_err(got, ref) < 2e-3


def test_variant_switch_of_the_prefill_launcher():
    """prefill_attention(variant="gqa") runs the variant; both kernels agree with float64."""
    k, v, q, ref = _problem("f16", 2, 2, 9, 18, 32, seed=4)
    seq = cuda.to_device(np.array([9], np.int32))
    for variant in ("gqa", "base"):
        out = cuda.to_device(np.full(q.shape, np.nan, np.float32))
        attention_prefill.prefill_attention(cuda.to_device(q), k, v, seq, out, warps=2, bkv=16,
                                            variant=variant)
        assert rel_err(out.copy_to_host(), ref) < 2e-3, variant


@pytest.mark.parametrize("group,warps,shape", [(8, 4, (4, 1)), (16, 8, (8, 1)), (1, 4, (1, 4)),
                                               (2, 4, (2, 2)), (3, 4, (3, 1)), (6, 4, (3, 1))])
def test_block_shape_divides_the_group(group, warps, shape):
    assert attention_prefill_gqa.block_shape(group, warps) == shape


def test_gqa_prefill_attention_rejects_bad_input():
    lay = kvcache.KvLayout("f16", 8, 1, 128)
    side = kvcache.allocate_kv_side(lay)
    q = cuda.to_device(np.zeros((4, 2, 128), np.float32))
    out = cuda.to_device(np.zeros((4, 2, 128), np.float32))
    seq = cuda.to_device(np.array([0], np.int32))
    run = attention_prefill_gqa.prefill_attention_gqa
    with pytest.raises(ValueError, match="needs 69632 bytes of shared memory"):
        run(q, side, side, seq, out, bkv=64)  # two buffers of 64 keys at head_dim 128
    with pytest.raises(ValueError, match="warps must be >= 1"):
        run(q, side, side, seq, out, warps=0)
    with pytest.raises(ValueError, match="multiples of 16"):
        run(q, side, side, seq, out, bkv=24)
    with pytest.raises(ValueError, match="out must be float32"):
        run(q, side, side, seq, cuda.to_device(np.zeros((4, 2, 64), np.float32)))
    with pytest.raises(ValueError, match="variant must be 'base' or 'gqa'"):
        attention_prefill.prefill_attention(q, side, side, seq, out, variant="wide")


@pytest.mark.parametrize("fmt,group,warps", [("f16", 2, 2), ("int8", 4, 4)])
def test_f16_output_is_the_f32_output_rounded(fmt, group, warps):
    """out float16 (what the engine's output projection reads): every value is the f32 run's
    value rounded to nearest, bit for bit; rows past the chunk are not written."""
    k, v, q, ref = _problem(fmt, 1, group, 13, 21, 32, seed=9)
    seq = cuda.to_device(np.array([13], np.int32))
    run = attention_prefill_gqa.prefill_attention_gqa
    out32 = cuda.to_device(np.full(q.shape, np.nan, np.float32))
    run(cuda.to_device(q), k, v, seq, out32, warps=warps, bkv=16)
    # one row more than the chunk, poisoned: the kernel writes only the chunk's rows
    out16 = cuda.to_device(np.full((q.shape[0] + 1, *q.shape[1:]), np.nan, np.float16))
    run(cuda.to_device(q), k, v, seq, out16[:q.shape[0]], warps=warps, bkv=16)
    got, want = out16.copy_to_host(), out32.copy_to_host()
    assert np.isnan(got[-1]).all()
    assert np.array_equal(got[:-1].view(np.uint16), want.astype(np.float16).view(np.uint16))
    assert rel_err(got[:-1], ref) < 3e-3
    with pytest.raises(ValueError, match="out must be float32"):  # the base kernel writes f32
        attention_prefill.prefill_attention(cuda.to_device(q), k, v, seq, out16[:q.shape[0]],
                                            warps=warps, bkv=16)


def test_head_dim_256_takes_16_key_tiles():
    """head_dim 256 (which the engine accepts for f16 caches): 32-key tiles would need 67,584
    bytes of static shared memory, so the launcher picks 16-key tiles; the result matches
    float64 (an explicit bkv=32 is refused with the size)."""
    assert attention_prefill_gqa.fit_bkv(128) == 32 and attention_prefill_gqa.fit_bkv(256) == 16
    k, v, q, ref = _problem("f16", 1, 2, 5, 9, 256, seed=2)
    seq = cuda.to_device(np.array([5], np.int32))
    out = cuda.to_device(np.full(q.shape, np.nan, np.float32))
    attention_prefill.prefill_attention(cuda.to_device(q), k, v, seq, out, warps=2,
                                        variant="gqa")
    assert rel_err(out.copy_to_host(), ref) < 2e-3
    with pytest.raises(ValueError, match="needs 67584 bytes of shared memory"):
        attention_prefill_gqa.prefill_attention_gqa(cuda.to_device(q), k, v, seq, out, bkv=32)
