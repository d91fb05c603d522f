"""The GQA-shared prefill attention variant on a real GPU at the Qwen3-30B-A3B attention shape
(32 query heads, 4 KV heads, head_dim 128): a 4096-token chunk from position 0 and a 1024-token
chunk over a 3072-token cached prefix, against float64 on 64 query rows spread over the chunk
(every head), every output row NaN-poisoned before the run; and against the base kernel on
every row. Prints a table (run with -s).

    STRATA_TEST_GPU=1 python -m pytest -s tests/gpu/test_prefill_attention_gqa_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from helpers.kv_problem import filled_side

pytestmark = pytest.mark.gpu
SHAPE = dict(n_head=32, n_kv=4, hd=128)
N_ROWS, TOL, AGREE_TOL = 64, 1e-2, 1e-2
ROWS: list[tuple[str, str, float, float]] = []


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    print(f"\n{'kernel':<30} {'shape':<34} {'rel err':>10} {'tol':>8}")
    for name, shape, err, tol in ROWS:
        print(f"{name:<30} {shape:<34} {err:>10.2e} {tol:>8.0e} {'ok' if err < tol else 'FAIL'}")


def reference_rows(q, k, v, start, rows):
    """float64 causal attention of query rows `rows` (chunk indices) only: [len(rows), n_head, d];
    q [n_q, n_head, d] at positions start.., k/v [L, n_kv, d]."""
    n_head, d = q.shape[1], q.shape[2]
    group = n_head // k.shape[1]
    length = start + int(rows.max()) + 1
    masked = np.arange(length)[None, :] > (start + rows)[:, None]  # [n_rows, length]
    out = np.zeros((len(rows), n_head, d))
    for h in range(n_head):
        s = q[rows, h].astype(np.float64) @ k[:length, h // group].T / np.sqrt(d)
        s[masked] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:length, h // group]
    return out


def _rel(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("fmt,start,n_q", [("f16", 0, 4096), ("f16", 3072, 1024),
                                           ("int8", 3072, 1024), ("q4_0", 3072, 1024)])
def test_gqa_prefill_attention_30b_shape(fmt, start, n_q):
    from strata.cuda_kernels import attention_prefill, kvcache
    rng = np.random.default_rng()
    a = SHAPE
    lay = kvcache.KvLayout(fmt, start + n_q + 64, a["n_kv"], a["hd"])  # stale bytes past it
    k, kref = filled_side(lay, rng.standard_normal((start + n_q, a["n_kv"], a["hd"])), rng)
    v, vref = filled_side(lay, rng.standard_normal((start + n_q, a["n_kv"], a["hd"])), rng)
    q = rng.standard_normal((n_q, a["n_head"], a["hd"])).astype(np.float32)
    q_dev, seq = cuda.to_device(q), cuda.to_device(np.array([start], np.int32))
    got = {}
    for variant in ("gqa", "base"):
        out = cuda.to_device(np.full(q.shape, np.nan, np.float32))
        attention_prefill.prefill_attention(q_dev, k, v, seq, out, variant=variant)
        got[variant] = out.copy_to_host()
    shape = f"start {start} n_q {n_q} h{a['n_head']}/{a['n_kv']}"
    assert np.isfinite(got["gqa"]).all(), "unwritten or non-finite outputs"
    # first and last rows, the rest spread over the chunk (every block position and warp)
    rows = np.unique(np.concatenate([[0, n_q - 1], rng.choice(n_q, N_ROWS - 2, replace=False)]))
    err = _rel(got["gqa"][rows], reference_rows(q, kref, vref, start, rows))
    ROWS.append((f"prefill attn gqa {fmt}", shape, err, TOL))
    agree = _rel(got["gqa"], got["base"].astype(np.float64))
    ROWS.append((f"prefill attn gqa {fmt} vs base", shape, agree, AGREE_TOL))
    assert err < TOL, f"{fmt} {shape}: relative error {err:.3e} against float64"
    assert agree < AGREE_TOL, f"{fmt} {shape}: differs from the base kernel by {agree:.3e}"
