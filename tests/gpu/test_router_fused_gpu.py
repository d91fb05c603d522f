"""The fused decode router (RMSNorm + router logits + softmax top-k, one launch) on a real GPU at
the 30B's router shape (128 experts x 2048, F32 and F16 rows, top-8) against a float64
reference, every output poisoned before each of three runs in a row (the last-block counter
must come back to zero after each), and replayed from a CUDA graph.

    STRATA_TEST_GPU=1 python -m pytest -s tests/gpu/test_router_fused_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
N_EXPERT, N_EMBD, K, EPS = 128, 2048, 8, 1e-6


def _case(name, seed):
    """(x, norm_w, w u8 [N_EXPERT, row_bytes], reference (xn, logits, ids, weights))."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(N_EMBD) * 3).astype(np.float32)  # [n_embd] f32, the residual
    norm_w = rng.uniform(0.5, 1.5, N_EMBD).astype(np.float32)
    vals = (rng.standard_normal((N_EXPERT, N_EMBD)) * (2 / np.sqrt(N_EMBD))).astype(
        np.float32 if name == "F32" else np.float16)  # [n_expert, n_embd]
    x64 = x.astype(np.float64)
    xn = x64 / np.sqrt(np.mean(x64 * x64) + EPS) * norm_w
    logits = vals.astype(np.float64) @ xn
    p = np.exp(logits - logits.max())
    p /= p.sum()
    ids = np.argsort(-logits, kind="stable")[:K]
    return x, norm_w, np.ascontiguousarray(vals).view(np.uint8), (xn, logits, ids,
                                                                   p[ids] / p[ids].sum())


def _poison(out):
    for key in ("normed_out", "logits", "weights"):
        out[key].copy_to_device(np.full(out[key].shape, np.nan, np.float32))
    out["ids"].copy_to_device(np.full(K, -7, np.int32))


def _check(out, want, label):
    from numba import cuda
    cuda.synchronize()
    xn, logits, ids, weights = want
    assert out["done"].copy_to_host()[0] == 0, f"{label}: the counter was not reset"
    np.testing.assert_allclose(out["normed_out"].copy_to_host(), xn, rtol=2e-6, atol=1e-6,
                               err_msg=label)
    np.testing.assert_allclose(out["logits"].copy_to_host(), logits, rtol=1e-5, atol=1e-5,
                               err_msg=label)
    np.testing.assert_array_equal(out["ids"].copy_to_host(), ids, err_msg=label)
    np.testing.assert_allclose(out["weights"].copy_to_host(), weights, rtol=1e-5, atol=1e-8,
                               err_msg=label)
    return {k: v.copy_to_host() for k, v in out.items()}


@pytest.mark.parametrize("name", ["F32", "F16"])
def test_router_normed_at_the_30b_shape(name):
    from numba import cuda

    from strata.cuda_kernels.router_normed import router_normed

    x, norm_w, w, want = _case(name, 30 if name == "F32" else 31)
    args = dict(x=cuda.to_device(x), norm_w=cuda.to_device(norm_w), w=cuda.to_device(w))
    out = dict(normed_out=cuda.device_array(N_EMBD, np.float32),
               logits=cuda.device_array(N_EXPERT, np.float32),
               ids=cuda.device_array(K, np.int32), weights=cuda.device_array(K, np.float32),
               done=cuda.to_device(np.zeros(1, np.int32)))
    first = None
    for run in range(3):  # each run meets the counter the previous one left
        _poison(out)
        router_normed(args["x"], args["norm_w"], args["w"], ggml_type=name, eps=EPS, **out)
        got = _check(out, want, f"{name} run {run}")
        if first is None:
            first = got
        for key in got:  # bit-identical from run to run
            np.testing.assert_array_equal(got[key], first[key], err_msg=key)


def test_router_normed_replays_from_a_graph():
    from numba import cuda

    from strata.cuda_kernels.graph import capture
    from strata.cuda_kernels.router_normed import router_normed

    x, norm_w, w, want = _case("F32", 32)
    xd, nd, wd = cuda.to_device(x), cuda.to_device(norm_w), cuda.to_device(w)
    out = dict(normed_out=cuda.device_array(N_EMBD, np.float32),
               logits=cuda.device_array(N_EXPERT, np.float32),
               ids=cuda.device_array(K, np.int32), weights=cuda.device_array(K, np.float32),
               done=cuda.to_device(np.zeros(1, np.int32)))
    stream = cuda.stream()

    def record(st):
        router_normed(xd, nd, wd, ggml_type="F32", eps=EPS, stream=st, **out)

    record(stream)  # compiled before the capture
    stream.synchronize()
    g = capture(record, stream)
    for run in range(3):
        _poison(out)
        g.replay(stream)
        stream.synchronize()
        _check(out, want, f"graph replay {run}")
