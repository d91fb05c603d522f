"""rope_kv: q/k per-head RMSNorm + NeoX RoPE and the f16 K/V cache write of one token in one
launch, against float64 numpy (and the cache bytes against numpy's float16 of those values)."""

from __future__ import annotations

import numpy as np
import pytest

from strata.cuda_kernels.kvcache import KvLayout, KvSide
from strata.cuda_kernels.rope_kv import rope_kv, rope_kv_fits


def _norm(x, w, eps):  # x: [n_head, d] float64
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, pos, theta):  # x: [n_head, d] float64, neox pairs (i, i + d/2)
    d = x.shape[-1]
    half = d // 2
    ang = pos * theta ** (-2.0 * np.arange(half) / d)
    a, b = x[:, :half], x[:, half:]
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)],
                          -1)


def _side(n_ctx, n_kv, d, rng):
    lay = KvLayout("f16", n_ctx, n_kv, d)
    data = rng.integers(0, 256, n_ctx * n_kv * lay.row_bytes).astype(np.uint8)
    return KvSide(lay, data, np.zeros(1, np.float16))


@pytest.mark.parametrize("with_norm", [True, False])
def test_rope_kv_matches_float64_and_writes_f16_rows(with_norm):
    rng = np.random.default_rng(3)
    n_head, n_kv, d, n_ctx, pos, theta, eps = 4, 2, 64, 5, 3, 10000.0, 1e-6
    q = rng.standard_normal(n_head * d).astype(np.float32)
    k = rng.standard_normal(n_kv * d).astype(np.float32)
    v = rng.standard_normal(n_kv * d).astype(np.float32)
    qw = rng.uniform(0.5, 1.5, d).astype(np.float32) if with_norm else None
    kw = rng.uniform(0.5, 1.5, d).astype(np.float32) if with_norm else None
    ks, vs = _side(n_ctx, n_kv, d, rng), _side(n_ctx, n_kv, d, rng)
    k_before, v_before = ks.data.copy(), vs.data.copy()
    q1, k1 = q.copy(), k.copy()
    rope_kv(q1, k1, v, np.array([pos], np.int32), ks, vs, n_head=n_head, theta=theta,
            q_norm_w=qw, k_norm_w=kw, eps=eps)

    def want(x, w, n):
        x = x.astype(np.float64).reshape(n, d)
        return _rope(_norm(x, w, eps) if w is not None else x, pos, theta)
    want_q, want_k = want(q, qw, n_head), want(k, kw, n_kv)
    np.testing.assert_allclose(q1.reshape(n_head, d), want_q, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(k1.reshape(n_kv, d), want_k, rtol=1e-5, atol=1e-5)
    row = slice(pos * n_kv * 2 * d, (pos + 1) * n_kv * 2 * d)  # this position's rows
    got_k = ks.data[row].view(np.float16).reshape(n_kv, d)
    np.testing.assert_array_equal(got_k, k1.reshape(n_kv, d).astype(np.float16))
    np.testing.assert_array_equal(vs.data[row].view(np.float16), v.astype(np.float16))
    for side, before in ((ks, k_before), (vs, v_before)):  # other positions untouched
        np.testing.assert_array_equal(side.data[:row.start], before[:row.start])
        np.testing.assert_array_equal(side.data[row.stop:], before[row.stop:])


def test_rope_kv_refuses_other_formats_and_half_norms():
    rng = np.random.default_rng(0)
    f16 = _side(4, 1, 32, rng)
    i8 = KvSide(KvLayout("int8", 4, 1, 32), np.zeros(4 * 32, np.uint8), np.zeros(4, np.float16))
    assert rope_kv_fits(f16, f16) and not rope_kv_fits(i8, i8)
    z = np.zeros(32, np.float32)
    with pytest.raises(ValueError, match="two f16 cache sides"):
        rope_kv(z, z, z, np.zeros(1, np.int32), i8, i8, n_head=1, theta=1e4)
    with pytest.raises(ValueError, match="or neither"):
        rope_kv(z, z, z, np.zeros(1, np.int32), f16, f16, n_head=1, theta=1e4, q_norm_w=z)
