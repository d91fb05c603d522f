"""RMSNorm and the fused per-head norm + NeoX RoPE against float64 numpy (simulator)."""

from __future__ import annotations

import numpy as np
import pytest

from strata.cuda_kernels.norm_rope import qk_norm_rope, rms_norm


def _rms(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, pos, theta):  # x: [n_tok, n_head, d] float64, neox pairs (i, i + d/2)
    d = x.shape[-1]
    half = d // 2
    freq = theta ** (-2.0 * np.arange(half) / d)
    ang = pos[:, None, None].astype(np.float64) * freq
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)], -1)


def test_rms_norm():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 300)).astype(np.float32)
    w = rng.standard_normal(300).astype(np.float32)
    out = np.full_like(x, np.nan)
    rms_norm(x, w, out, eps=1e-6)
    np.testing.assert_allclose(out, _rms(x, w, 1e-6), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="eps"):
        rms_norm(x, w, out, eps=0.0)


@pytest.mark.parametrize("with_norm", [True, False])
def test_qk_norm_rope(with_norm):
    rng = np.random.default_rng(2)
    n_tok, n_head, n_kv, d, theta = 3, 4, 2, 64, 1e6
    q = rng.standard_normal((n_tok, n_head * d)).astype(np.float32)
    k = rng.standard_normal((n_tok, n_kv * d)).astype(np.float32)
    qw = rng.standard_normal(d).astype(np.float32) if with_norm else None
    kw = rng.standard_normal(d).astype(np.float32) if with_norm else None
    pos = np.array([0, 17, 300], dtype=np.int32)
    q3, k3 = q.reshape(n_tok, n_head, d).astype(np.float64), k.reshape(n_tok, n_kv, d).astype(np.float64)
    if with_norm:
        q3, k3 = _rms(q3, qw, 1e-6), _rms(k3, kw, 1e-6)
    want_q, want_k = _rope(q3, pos, theta), _rope(k3, pos, theta)
    qk_norm_rope(q, k, pos, n_head=n_head, n_head_kv=n_kv, head_dim=d, theta=theta,
                 q_norm_w=qw, k_norm_w=kw, eps=1e-6)
    np.testing.assert_allclose(q.reshape(want_q.shape), want_q, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(k.reshape(want_k.shape), want_k, rtol=1e-4, atol=1e-4)


def test_rope_refuses_odd_head_dim():
    q = np.zeros((1, 6), np.float32)
    with pytest.raises(ValueError, match="even"):
        qk_norm_rope(q, q, np.zeros(1, np.int32), n_head=2, n_head_kv=2, head_dim=3, theta=1e4)
