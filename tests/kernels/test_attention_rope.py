"""decode_attention_rope: the new token's q/k norm, RoPE and K/V cache write inside the
tensor-core attention kernel, in the CUDA simulator. Held bit for bit to what `rope_kv` then
`decode_attention` give (the cache bytes and the output), and to float64."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from helpers.kv_problem import attention_reference, filled_side
from helpers.moe_problem import rel_err
from strata.cuda_kernels import attention, kvcache
from strata.cuda_kernels.rope_kv import rope_kv

THETA, EPS = 10000.0, 1e-6


def _norm_rope(x, w, pos):
    """x [n, d] float64 normed per head (w: [d] or None) and NeoX-rotated at pos."""
    d = x.shape[-1]
    if w is not None:
        x = x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w
    half = d // 2
    ang = pos * THETA ** (-2.0 * np.arange(half) / d)
    a, b = x[:, :half], x[:, half:]
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)],
                          -1)


def _problem(rng, n_kv, group, hd, n_ctx, pos, with_norm):
    lay = kvcache.KvLayout("f16", n_ctx=n_ctx, n_kv_head=n_kv, head_dim=hd)
    n_old = min(pos, n_ctx)  # earlier tokens' rows; the new row (and past it) stale bytes
    sides = [filled_side(lay, rng.standard_normal((n_old, n_kv, hd)), rng) for _ in range(2)]
    q = rng.standard_normal(n_kv * group * hd).astype(np.float32)
    k = rng.standard_normal(n_kv * hd).astype(np.float32)
    v = rng.standard_normal(n_kv * hd).astype(np.float32)
    w = [rng.uniform(0.5, 1.5, hd).astype(np.float32) if with_norm else None for _ in range(2)]
    return lay, sides, q, k, v, w


def _copy(side):
    return kvcache.KvSide(side.layout, cuda.to_device(side.data.copy_to_host()), side.scale)


@pytest.mark.parametrize("n_kv,group,hd,n_ctx,pos,max_split,with_norm", [
    (2, 4, 64, 80, 37, 32, True),     # the new key inside a split, 2 splits
    (1, 8, 64, 96, 64, 32, True),     # the new key first of its split (a split boundary)
    (1, 3, 128, 40, 33, 16, False),   # no norm weights, padded group, head_dim 128
    (2, 2, 64, 48, 48, 16, True),     # the cache is full: the writes are dropped
])
def test_decode_attention_rope_equals_rope_kv_then_attention(n_kv, group, hd, n_ctx, pos,
                                                             max_split, with_norm):
    rng = np.random.default_rng(pos + hd)
    lay, sides, q, k, v, (qw, kw) = _problem(rng, n_kv, group, hd, n_ctx, pos, with_norm)
    (ks, kold), (vs, vold) = sides
    n_head = n_kv * group
    assert attention.rope_fits(ks, vs, n_head, max_split)
    norms = dict(q_norm_w=None if qw is None else cuda.to_device(qw),
                 k_norm_w=None if kw is None else cuda.to_device(kw), eps=EPS)
    seq = cuda.to_device(np.array([pos], np.int32))
    outs, caches = {}, {}
    for fused in (True, False):
        kd, vd = _copy(ks), _copy(vs)
        out = cuda.to_device(np.full((n_head, hd), np.nan, np.float32))
        parts = tuple(cuda.to_device(np.full(p.shape, np.nan, np.float32)) for p in
                      attention.allocate_partials(n_head, hd, n_ctx, n_kv_head=n_kv,
                                                  max_split=max_split))
        qd, kdev, vdev = cuda.to_device(q), cuda.to_device(k), cuda.to_device(v)
        if fused:
            attention.decode_attention_rope(qd, kdev, vdev, kd, vd, seq, out, parts, theta=THETA,
                                            max_split=max_split, **norms)
            np.testing.assert_array_equal(qd.copy_to_host(), q)  # the inputs are read only
            np.testing.assert_array_equal(kdev.copy_to_host(), k)
        else:
            rope_kv(qd, kdev, vdev, seq, kd, vd, n_head=n_head, theta=THETA, **norms)
            attention.decode_attention(qd.reshape(n_head, hd), kd, vd, seq, out, parts,
                                       n_new=1, max_split=max_split)
        outs[fused] = out.copy_to_host()
        caches[fused] = (kd.data.copy_to_host(), vd.data.copy_to_host())
    np.testing.assert_array_equal(outs[True], outs[False])
    for a, b in zip(caches[True], caches[False]):
        np.testing.assert_array_equal(a, b)
    # float64: the new token's rotated k and raw v appended (as f16, what the cache holds)
    q_rot = _norm_rope(q.reshape(n_head, hd).astype(np.float64), qw, pos)
    k_new = _norm_rope(k.reshape(n_kv, hd).astype(np.float64), kw, pos)
    kref = np.concatenate([kold, k_new.astype(np.float16)[None].astype(np.float64)])
    vref = np.concatenate([vold, v.reshape(1, n_kv, hd).astype(np.float16).astype(np.float64)])
    length = min(pos + 1, n_ctx)
    if pos >= n_ctx:  # nothing written: the cache's own rows, the last one the oldest kept
        kref, vref = kold, vold
    ref = attention_reference(q_rot[None], kref[:length], vref[:length], length - 1)[0]
    assert rel_err(outs[True], ref) < 1e-5
    row = pos * n_kv * 2 * hd
    if pos < n_ctx:  # the new rows, as numpy's f16 of the float64 values
        got_k = caches[True][0][row:row + n_kv * 2 * hd].view(np.float16).reshape(n_kv, hd)
        assert np.abs(got_k.astype(np.float64) - k_new).max() < 2e-3 * np.abs(k_new).max()
        np.testing.assert_array_equal(caches[True][1][row:row + n_kv * 2 * hd].view(np.float16),
                                      v.astype(np.float16))


def test_decode_attention_rope_refuses_what_it_cannot_take():
    rng = np.random.default_rng(2)
    lay = kvcache.KvLayout("f16", n_ctx=32, n_kv_head=1, head_dim=64)
    (ks, _), (vs, _) = (filled_side(lay, rng.standard_normal((4, 1, 64)), rng) for _ in range(2))
    i8 = kvcache.KvSide(kvcache.KvLayout("int8", 32, 1, 64), ks.data, ks.scale)
    assert not attention.rope_fits(i8, i8, 8)
    assert not attention.rope_fits(ks, vs, 16)  # a group of 16: the generic kernel's
    seq = cuda.to_device(np.array([4], np.int32))
    z = cuda.to_device(np.zeros(8 * 64, np.float32))
    z1 = cuda.to_device(np.zeros(64, np.float32))
    out = cuda.to_device(np.zeros((8, 64), np.float32))
    parts = attention.allocate_partials(8, 64, 32, n_kv_head=1)
    with pytest.raises(ValueError, match="two f16 cache sides"):
        attention.decode_attention_rope(z, z1, z1, i8, i8, seq, out, parts, theta=THETA)
    with pytest.raises(ValueError, match="out must be float32"):
        attention.decode_attention_rope(z, z1, z1, ks, vs, seq, z1, parts, theta=THETA)
    with pytest.raises(ValueError, match="give both q_norm_w and k_norm_w"):
        attention.decode_attention_rope(z, z1, z1, ks, vs, seq, out, parts, theta=THETA,
                                        q_norm_w=z1)
    with pytest.raises(ValueError, match="rope theta must be > 1"):
        attention.decode_attention_rope(z, z1, z1, ks, vs, seq, out, parts, theta=1.0)
    with pytest.raises(ValueError, match=r"q: shape \(64,\)"):  # q of the wrong length
        attention.decode_attention_rope(z1, z1, z1, ks, vs, seq, out, parts, theta=THETA)
    with pytest.raises(ValueError, match="partials must be"):
        attention.decode_attention_rope(z, z1, z1, ks, vs, seq, out,
                                        attention.allocate_partials(4, 64, 32, n_kv_head=1),
                                        theta=THETA)
