"""The float-row matvec (F32/F16 weights, 1..8 tokens) on a real GPU at the MoE router's shape
(128 x 2048) and a larger one, against float64 references with every output poisoned (NaN)
before the run; batch invariance (a token's row bit-identical alone and in a batch of 8) and a
CUDA-graph replay. Prints a table (run with -s).

    STRATA_TEST_GPU=1 python -m pytest -s tests/gpu/test_matvec_f32_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import own_random_rows, reference

pytestmark = pytest.mark.gpu
TOL = 1e-5  # f32 accumulation over <= 4096 columns: observed well below
SHAPES = ((128, 2048), (2048, 4096))  # (n_rows, n_cols): the 30B router, a wide projection
ROWS: list[tuple[str, str, float]] = []


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    print(f"\n{'kernel':<22} {'shape':<22} {'rel err':>10}")
    for name, shape, err in ROWS:
        print(f"{name:<22} {shape:<22} {err:>10.2e} {'ok' if err < TOL else 'FAIL'}")


def _setup(name, n_rows, n_cols, seed):
    from numba import cuda
    rng = np.random.default_rng(seed)
    rows = own_random_rows(name, n_rows, n_cols, rng)
    x = rng.standard_normal((8, n_cols)).astype(np.float32)  # [8, n_cols]
    return cuda.to_device(rows), reference(name, rows, n_cols), x


def _run(w, name, x, n_rows, *, y0=None):
    """W x (x [n_tok, n_cols] host) into a poisoned (or y0-filled, accumulated) device y."""
    from numba import cuda

    from strata.cuda_kernels.matvec import matvec
    n_tok = x.shape[0]
    host = np.full((n_tok, n_rows), np.nan, np.float32) if y0 is None else y0.copy()
    y = cuda.to_device(host)
    xd = cuda.to_device(x)
    if n_tok == 1:
        matvec(w, name, xd[0], y[0], accumulate=y0 is not None)
    else:
        matvec(w, name, xd, y)
    return y.copy_to_host()


def _check(label, shape, got, want):
    assert np.isfinite(got).all(), f"{label}: unwritten or non-finite outputs"
    err = float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))
    ROWS.append((label, str(shape), err))
    assert err < TOL, f"{label} {shape}: relative error {err:.3e}"


@pytest.mark.parametrize("name", ["F32", "F16"])
@pytest.mark.parametrize("n_rows,n_cols", SHAPES)
def test_against_float64_and_batch_invariant(name, n_rows, n_cols):
    w, ref, x = _setup(name, n_rows, n_cols, seed=n_rows + n_cols)
    x64 = x.astype(np.float64)
    ys = {}
    for n_tok in (1, 2, 8):
        ys[n_tok] = _run(w, name, x[:n_tok], n_rows)
        _check(f"matvec_float{n_tok} {name}", (n_rows, n_cols), ys[n_tok], x64[:n_tok] @ ref.T)
    assert np.array_equal(ys[1][0].view(np.uint32), ys[8][0].view(np.uint32))
    assert np.array_equal(ys[2].view(np.uint32), ys[8][:2].view(np.uint32))
    for t in (3, 7):  # tokens other than the first: alone, then inside the batch of 8
        alone = _run(w, name, x[t:t + 1], n_rows)
        assert np.array_equal(alone[0].view(np.uint32), ys[8][t].view(np.uint32)), t
    y0 = np.random.default_rng(1).standard_normal((1, n_rows)).astype(np.float32)
    _check(f"accumulate {name}", (n_rows, n_cols), _run(w, name, x[:1], n_rows, y0=y0),
           y0 + x64[:1] @ ref.T)


def test_graph_replay_reads_x_from_device():
    """The 8-token router launch captured once, replayed on new x written in place."""
    from numba import cuda

    from strata.cuda_kernels.graph import capture
    from strata.cuda_kernels.matvec import matvec
    n_rows, n_cols = SHAPES[0]
    w, ref, x = _setup("F32", n_rows, n_cols, seed=11)
    stream = cuda.stream()
    xd = cuda.to_device(x, stream=stream)
    y = cuda.to_device(np.full((8, n_rows), np.nan, np.float32), stream=stream)
    matvec(w, "F32", xd, y, stream=stream)  # compiled before capture
    stream.synchronize()
    graph = capture(lambda s: matvec(w, "F32", xd, y, stream=s), stream)
    for seed in (2, 3):
        x2 = np.random.default_rng(seed).standard_normal(x.shape).astype(np.float32)
        xd.copy_to_device(x2, stream=stream)
        graph.replay(stream)
        got = y.copy_to_host(stream=stream)
        stream.synchronize()
        _check("graph replay F32", (n_rows, n_cols), got, x2.astype(np.float64) @ ref.T)
