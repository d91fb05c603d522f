"""Batched decode attention and KV write (`batch_attention`): several sequences, each in its own
f16 region at its own length, against float64 numpy; splits merged; bad shapes refused."""

from __future__ import annotations

import numpy as np
import pytest

from strata.cuda_kernels import batch_attention as ba

HD, N_KV, GROUP, ROW_CTX, SPLIT = 64, 1, 2, 5, 2


def _cache(rng, n_rows):
    """f16 K and V regions [n_rows * ROW_CTX, N_KV, HD] with random history, as bytes."""
    k = rng.standard_normal((n_rows * ROW_CTX, N_KV, HD)).astype(np.float16)
    v = rng.standard_normal((n_rows * ROW_CTX, N_KV, HD)).astype(np.float16)
    return k, v


def test_write_then_attend_every_sequence_at_its_own_length():
    rng = np.random.default_rng(1)
    n_rows, n_head = 2, N_KV * GROUP
    k16, v16 = _cache(rng, n_rows)
    kd, vd = k16.view(np.uint8).reshape(-1).copy(), v16.view(np.uint8).reshape(-1).copy()
    seq_len = np.array([3, 1], np.int32)   # row 0: 3 keys + the new one (2 splits); row 1: 1 + 1
    k_new = rng.standard_normal((n_rows, N_KV * HD)).astype(np.float32)
    v_new = rng.standard_normal((n_rows, N_KV * HD)).astype(np.float32)
    ba.kv_write_rows(k_new, v_new, seq_len, kd, vd, row_ctx=ROW_CTX, n_kv=N_KV, head_dim=HD)
    kc = kd.view(np.float16).reshape(n_rows * ROW_CTX, N_KV, HD)
    vc = vd.view(np.float16).reshape(n_rows * ROW_CTX, N_KV, HD)
    for r in range(n_rows):
        pos = r * ROW_CTX + seq_len[r]
        np.testing.assert_array_equal(kc[pos], k_new[r].reshape(N_KV, HD).astype(np.float16))
        np.testing.assert_array_equal(vc[pos], v_new[r].reshape(N_KV, HD).astype(np.float16))
        untouched = [i for i in range(r * ROW_CTX, (r + 1) * ROW_CTX) if i != pos]
        np.testing.assert_array_equal(kc[untouched], k16[untouched])
    q = rng.standard_normal((n_rows, n_head * HD)).astype(np.float32)
    n_split = -(-ROW_CTX // SPLIT)
    part = (np.zeros((n_rows, n_split, n_head, HD), np.float32),
            np.zeros((n_rows, n_split, n_head, 2), np.float32))
    out = np.full((n_rows, n_head * HD), np.nan, np.float32)
    ba.attention_rows(q, kd, vd, seq_len, out, part, row_ctx=ROW_CTX, n_kv=N_KV, head_dim=HD,
                      split_len=SPLIT)
    for r in range(n_rows):
        n = seq_len[r] + 1
        keys = kc[r * ROW_CTX:r * ROW_CTX + n].astype(np.float64)
        vals = vc[r * ROW_CTX:r * ROW_CTX + n].astype(np.float64)
        for h in range(n_head):
            s = keys[:, h // GROUP] @ q[r, h * HD:(h + 1) * HD].astype(np.float64) / np.sqrt(HD)
            p = np.exp(s - s.max())
            want = (p / p.sum()) @ vals[:, h // GROUP]
            np.testing.assert_allclose(out[r, h * HD:(h + 1) * HD], want, rtol=2e-5, atol=2e-6)


def test_batched_attention_refuses_what_it_does_not_take():
    z = np.zeros
    args = dict(row_ctx=ROW_CTX, n_kv=N_KV, head_dim=HD, split_len=SPLIT)
    kd = z(2 * ROW_CTX * N_KV * 2 * HD, np.uint8)
    part = (z((2, 3, 2, HD), np.float32), z((2, 3, 2, 2), np.float32))
    q = z((2, 2 * HD), np.float32)
    seq = z(2, np.int32)
    with pytest.raises(ValueError, match="group"):
        ba.attention_rows(z((2, 12 * HD), np.float32), kd, kd, seq, z((2, 12 * HD), np.float32),
                          part, **args)
    with pytest.raises(ValueError, match="need"):
        ba.attention_rows(q, kd[:-2], kd, seq, q.copy(), part, **args)
    with pytest.raises(ValueError, match="splits"):
        ba.attention_rows(q, kd, kd, seq, q.copy(), (z((2, 2, 2, HD), np.float32),
                                                   z((2, 2, 2, 2), np.float32)), **args)
    with pytest.raises(ValueError, match="seq_len"):
        ba.kv_write_rows(z((2, HD), np.float32), z((2, HD), np.float32), z(3, np.int32), kd, kd, row_ctx=ROW_CTX, n_kv=N_KV,
                         head_dim=HD)
    assert not ba.supports("int8", 128, 8) and not ba.supports("f16", 96, 8)
