"""rope_kv: q/k per-head RMSNorm + NeoX RoPE and the f16 or int8 K/V cache write of one token in
one launch, against float64 numpy (and the f16 cache bytes against numpy's float16 of those
values; the int8 bytes and scales against the separate launches it replaces)."""

from __future__ import annotations

import numpy as np
import pytest

from strata.cuda_kernels.kvcache import KvLayout, KvSide, kv_write
from strata.cuda_kernels.norm_rope import qk_norm_rope
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


def _int8_side(n_ctx, n_kv, d, rng):
    lay = KvLayout("int8", n_ctx, n_kv, d)
    return KvSide(lay, rng.integers(0, 256, n_ctx * n_kv * d).astype(np.uint8),
                  rng.uniform(0.01, 0.1, n_ctx * n_kv).astype(np.float16))


@pytest.mark.parametrize("d,with_norm", [(64, True), (96, False)])
def test_rope_kv_int8_writes_what_the_separate_launches_write(d, with_norm):
    """int8 cache: q and k as the float64 reference has them, and the K/V rows and scales at the
    position byte for byte those of qk_norm_rope + kv_write (the launches it replaces), other
    positions untouched. head_dim 96: a lane quantizes values other lanes rotated."""
    rng = np.random.default_rng(4)
    n_head, n_kv, n_ctx, pos, theta, eps = 4, 2, 5, 3, 10000.0, 1e-6
    q = rng.standard_normal(n_head * d).astype(np.float32)
    k = rng.standard_normal(n_kv * d).astype(np.float32) * 3
    v = rng.standard_normal(n_kv * d).astype(np.float32)
    v[:d] = 0.0  # one all-zero row: scale 0, bytes 0
    qw = rng.uniform(0.5, 1.5, d).astype(np.float32) if with_norm else None
    kw = rng.uniform(0.5, 1.5, d).astype(np.float32) if with_norm else None
    sides = [_int8_side(n_ctx, n_kv, d, np.random.default_rng(9)) for _ in range(4)]
    ks, vs, ks_ref, vs_ref = sides
    k_before = ks.data.copy()
    seq = np.array([pos], np.int32)
    q1, k1 = q.copy(), k.copy()
    rope_kv(q1, k1, v, seq, ks, vs, n_head=n_head, theta=theta, q_norm_w=qw, k_norm_w=kw,
            eps=eps)
    q2, k2 = q.copy().reshape(1, -1), k.copy().reshape(1, -1)
    qk_norm_rope(q2, k2, seq, n_head=n_head, n_head_kv=n_kv, head_dim=d, theta=theta,
                 q_norm_w=qw, k_norm_w=kw, eps=eps)
    kv_write(k2.reshape(1, n_kv, d), ks_ref, seq)
    kv_write(v.reshape(1, n_kv, d), vs_ref, seq)

    def want(x, w, n):
        x = x.astype(np.float64).reshape(n, d)
        return _rope(_norm(x, w, eps) if w is not None else x, pos, theta)
    np.testing.assert_allclose(q1.reshape(n_head, d), want(q, qw, n_head), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(k1.reshape(n_kv, d), want(k, kw, n_kv), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(k1, k2.reshape(-1))
    for got, ref in ((ks, ks_ref), (vs, vs_ref)):
        np.testing.assert_array_equal(got.data, ref.data)
        np.testing.assert_array_equal(got.scale, ref.scale)
    rows = slice(pos * n_kv * d, (pos + 1) * n_kv * d)
    assert not np.array_equal(ks.data[rows], k_before[rows])  # the row was written
    assert vs.scale[pos * n_kv] == 0 and not vs.data[rows][:d].any()
    np.testing.assert_array_equal(ks.data[:rows.start], k_before[:rows.start])
    np.testing.assert_array_equal(ks.data[rows.stop:], k_before[rows.stop:])


def test_rope_kv_refuses_other_formats_and_half_norms():
    rng = np.random.default_rng(0)
    f16 = _side(4, 1, 32, rng)
    i8 = KvSide(KvLayout("int8", 4, 1, 32), np.zeros(4 * 32, np.uint8), np.zeros(4, np.float16))
    q4 = KvSide(KvLayout("q4_0", 4, 1, 32), np.zeros(4 * 18, np.uint8), np.zeros(1, np.float16))
    assert rope_kv_fits(f16, f16) and rope_kv_fits(i8, i8)
    assert not rope_kv_fits(q4, q4) and not rope_kv_fits(f16, i8)
    z = np.zeros(32, np.float32)
    with pytest.raises(ValueError, match="two f16 or two int8 cache sides"):
        rope_kv(z, z, z, np.zeros(1, np.int32), q4, q4, n_head=1, theta=1e4)
    with pytest.raises(ValueError, match="or neither"):
        rope_kv(z, z, z, np.zeros(1, np.int32), f16, f16, n_head=1, theta=1e4, q_norm_w=z)
