"""Prefill matmuls in the CUDA simulator: routing kernels, the grouped MoE GEMMs (tensor-core path
through the simulator's mma fragment emulation, and the FMA path), the dense GEMM, against numpy
float64 references built from gguf-py's dequantization. Tiles are shrunk (one or two warps) to
keep the simulator fast; the production tile is exercised by the PTX compile and the GPU tests."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from helpers.moe_problem import make_problem, reference_moe, rel_err
from strata.cuda_kernels import matmul, route
from strata.cuda_kernels.matmul_tiles import FmaTile, TcTile
from strata.cuda_kernels.qformats import BY_NAME, is_planar

TC_SMALL = TcTile(bm=16, bn=32, warps_m=1, warps_n=1)
TC_TWO_WARPS = TcTile(bm=32, bn=64, warps_m=2, warps_n=1)
TC_ROLES = TcTile(bm=32, bn=32, warps_m=2, warps_n=1)  # threads >= 2 * bn: decode/stage roles split
TC_K64 = TcTile(bm=32, bn=32, warps_m=2, warps_n=1, kch=2)  # 64-value k steps
TC_K64_ROLES = TcTile(bm=32, bn=16, warps_m=2, warps_n=1, kch=2)
FMA_SMALL = FmaTile(bm=16, bn=32, threads_m=4, threads_n=8)


def _weights(pr):
    buf = cuda.to_device(pr.buf)
    return {k: matmul.QuantWeights(buf, cuda.to_device(pr.base[k]), int(pr.types[k]),
                                   *pr.mats[k].shape[1:]) for k in pr.base}


def _routing(pr, n_exp, tile_rows):
    r = route.allocate_routing(*pr.ids.shape, n_exp, tile_rows=tile_rows)
    return route.route_tokens(cuda.to_device(pr.ids), r)


def _run_moe(pr, n_exp, *, tensor_cores, tile, x_half):
    n_tok, k = pr.ids.shape
    ff, d = pr.mats["gate"].shape[1], pr.mats["down"].shape[1]
    routing = _routing(pr, n_exp, tile.bm)
    w = _weights(pr)
    h_dtype = np.float16 if tensor_cores else np.float32
    x = cuda.to_device(pr.x.astype(np.float16) if x_half else pr.x)
    h = cuda.to_device(np.full((n_tok * k, ff), np.nan, h_dtype))
    y = cuda.to_device(np.full((n_tok * k, d), np.nan, np.float32))
    out = cuda.to_device(np.full((n_tok, d), np.nan, np.float32))
    matmul.moe_gate_up(x, w["gate"], w["up"], routing, h, tensor_cores=tensor_cores, tile=tile)
    matmul.moe_down(h, w["down"], routing, y, tensor_cores=tensor_cores, tile=tile)
    route.combine(y, routing, cuda.to_device(pr.w), out)
    return routing.inv.copy_to_host(), h.copy_to_host(), out.copy_to_host()


def test_route_groups_entries_by_expert():
    rng = np.random.default_rng(3)
    n_tok, k, n_exp, rows = 37, 3, 6, 8
    ids = np.stack([rng.choice(n_exp, k, replace=False, p=[.5, .2, .1, .1, .1, 0])
                    for _ in range(n_tok)]).astype(np.int32)
    ids[5, 1] = n_exp  # an out-of-range id is dropped, never written anywhere
    r = route.route_tokens(cuda.to_device(ids), route.allocate_routing(n_tok, k, n_exp,
                                                                       tile_rows=rows))
    flat = ids.reshape(-1)
    counts = np.bincount(flat[flat < n_exp], minlength=n_exp)
    offsets = r.offsets.copy_to_host()
    assert r.counts.copy_to_host().tolist() == counts.tolist() + [1]
    assert offsets.tolist() == [0] + np.cumsum(counts).tolist()
    perm, inv = r.perm.copy_to_host(), r.inv.copy_to_host()
    for e in range(n_exp):
        seg = perm[offsets[e]:offsets[e + 1]]
        assert sorted(seg.tolist()) == np.flatnonzero(flat == e).tolist()
    assert inv[5 * k + 1] == -1
    good = np.flatnonzero(flat < n_exp)
    assert (perm[inv[good]] == good).all()
    n_tiles = int(r.n_tiles.copy_to_host()[0])
    want = [(e, m0) for e in range(n_exp) for m0 in range(0, counts[e], rows)]
    got = list(zip(r.tile_group.copy_to_host()[:n_tiles], r.tile_m0.copy_to_host()[:n_tiles]))
    assert got == want and n_tiles <= r.max_tiles


@pytest.mark.parametrize("tensor_cores,tile,x_half", [
    (True, TC_TWO_WARPS, True), (True, TC_ROLES, True), (True, TC_K64, False),
    (True, TC_K64_ROLES, True), (True, TC_SMALL, False), (False, FMA_SMALL, False)])
def test_moe_chunk_matches_reference(tensor_cores, tile, x_half):
    rng = np.random.default_rng(11)
    n_exp = 3
    # skewed routing: one expert gets more rows than a tile, one may get none
    pr = make_problem(rng, n_tok=20, k_top=2, n_exp=n_exp, d=64, ff=64, gate_type=T.Q8_0,
                      down_type=T.Q4_0, skew=True)
    inv, h, out = _run_moe(pr, n_exp, tensor_cores=tensor_cores, tile=tile, x_half=x_half)
    h_ref, out_ref = reference_moe(pr, half=tensor_cores)
    assert np.isfinite(h[inv]).all() and np.isfinite(out).all()
    tol = 2e-3 if tensor_cores else 1e-5
    assert rel_err(h[inv], h_ref) < tol
    assert rel_err(out, out_ref) < tol


# experts keep GGUF's layouts (`strata.quant.planar`): no planar one in a grouped GEMM
@pytest.mark.parametrize("name", sorted(n for n, f in BY_NAME.items() if not is_planar(f.ggml_type)))
def test_every_format_through_grouped_gate_up(name):
    fmt = BY_NAME[name]
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    d = max(64, fmt.block_values)
    pr = make_problem(rng, n_tok=4, k_top=2, n_exp=2, d=d, ff=32, gate_type=fmt.ggml_type,
                      down_type=T.Q8_0)
    routing = _routing(pr, 2, TC_SMALL.bm)
    w = _weights(pr)
    h = cuda.to_device(np.full((8, 32), np.nan, np.float16))
    matmul.moe_gate_up(cuda.to_device(pr.x), w["gate"], w["up"], routing, h, tile=TC_SMALL)
    h_ref, _ = reference_moe(pr, half=True)
    got = h.copy_to_host()[routing.inv.copy_to_host()]
    assert np.isfinite(got).all()
    assert rel_err(got, h_ref) < 2e-3


@pytest.mark.parametrize("tensor_cores,tile", [(True, TC_TWO_WARPS), (False, FMA_SMALL)])
def test_dense_matmul_partial_tiles(tensor_cores, tile):
    rng = np.random.default_rng(5)
    n, n_in, n_out = 37, 64, 72  # neither rows nor columns fill whole tiles
    from helpers.kernel_blocks import random_rows, reference
    raw = random_rows(T.Q5_1, n_out, n_in, rng)
    wmat = reference(T.Q5_1, raw, n_in)
    buf = np.concatenate([np.zeros(512, np.uint8), raw.reshape(-1)])
    w = matmul.QuantWeights(cuda.to_device(buf), cuda.to_device(np.array([512], np.int64)),
                            int(T.Q5_1), n_out, n_in)
    x = (rng.standard_normal((n, n_in)) * 0.1).astype(np.float32)
    out = cuda.to_device(np.full((n, n_out), np.nan, np.float32))
    matmul.dense_matmul(cuda.to_device(x), w, out, tensor_cores=tensor_cores, tile=tile)
    r16 = (lambda a: a.astype(np.float16).astype(np.float64)) if tensor_cores else np.asarray
    ref = r16(x.astype(np.float64)) @ r16(wmat).T
    assert rel_err(out.copy_to_host(), ref) < (1e-3 if tensor_cores else 1e-5)


def test_combine_accumulates_into_residual():
    rng = np.random.default_rng(8)
    n_tok, k, n_exp, d = 6, 2, 4, 40
    ids = np.stack([rng.choice(n_exp, k, replace=False) for _ in range(n_tok)]).astype(np.int32)
    r = route.route_tokens(cuda.to_device(ids), route.allocate_routing(n_tok, k, n_exp,
                                                                       tile_rows=16))
    y = rng.standard_normal((n_tok * k, d)).astype(np.float32)
    w = rng.random((n_tok, k)).astype(np.float32)
    resid = rng.standard_normal((n_tok, d)).astype(np.float32)
    out = cuda.to_device(resid)
    route.combine(cuda.to_device(y), r, cuda.to_device(w), out, accumulate=True)
    inv = r.inv.copy_to_host().reshape(n_tok, k)
    ref = resid + np.einsum("tk,tkd->td", w, y[inv])
    assert rel_err(out.copy_to_host(), ref) < 1e-6


def test_launchers_reject_bad_input():
    rng = np.random.default_rng(2)
    pr = make_problem(rng, n_tok=4, k_top=2, n_exp=2, d=64, ff=32, gate_type=T.Q8_0,
                      down_type=T.Q8_0)
    w = _weights(pr)
    routing = _routing(pr, 2, TC_SMALL.bm)
    x = cuda.to_device(pr.x)
    h = cuda.to_device(np.zeros((8, 32), np.float16))
    with pytest.raises(ValueError, match="tile_rows=32"):
        matmul.moe_gate_up(x, w["gate"], w["up"], routing, h, tile=TcTile(32, 32, 2, 1))
    with pytest.raises(ValueError, match="h must have shape"):
        matmul.moe_gate_up(x, w["gate"], w["up"], routing, cuda.to_device(np.zeros((8, 16),
                                                                                  np.float16)))
    with pytest.raises(ValueError, match="x must be float16 or float32"):
        matmul.moe_gate_up(cuda.to_device(pr.x.astype(np.float64)), w["gate"], w["up"],
                           routing, h)
    with pytest.raises(ValueError, match="FMA path writes float32"):
        matmul.moe_gate_up(x, w["gate"], w["up"], routing, h, tensor_cores=False,
                           tile=FMA_SMALL)
    with pytest.raises(ValueError, match="expected 2 expert offsets"):
        matmul.moe_down(h, matmul.QuantWeights(w["down"].buf, cuda.to_device(np.zeros(3, np.int64)),
                                               int(T.Q8_0), 64, 32), routing,
                        cuda.to_device(np.zeros((8, 64), np.float32)))
    with pytest.raises(ValueError, match="whole number"):
        matmul.QuantWeights(w["down"].buf, w["down"].base, int(T.Q4_K), 64, 32)
    with pytest.raises(ValueError, match="topk_ids must be int32"):
        route.route_tokens(cuda.to_device(pr.ids.astype(np.int64)), routing)
    with pytest.raises(ValueError, match="bad tensor-core tile"):
        TcTile(bm=24, bn=32, warps_m=1, warps_n=1)
    with pytest.raises(ValueError, match="shared memory"):
        TcTile(bm=128, bn=128, warps_m=2, warps_n=4, kch=2)


def test_a_tile_past_the_shared_memory_is_refused():
    # two buffers of 2 * 4 * (256 + 256) * (16 + 4) bytes = 80 KiB, past one block's 48 KiB
    with pytest.raises(ValueError, match=r"need 81920 bytes of shared memory \(48 KiB at most\)"):
        TcTile(bm=256, bn=256, warps_m=4, warps_n=2)
