"""The tensor-core GEMM's load paths in the CUDA simulator: split weight loaders (fetched a step
ahead, f16x2 decode; one or two threads per weight row; 16-byte and 4-byte aligned matrices),
cp.async activation copies, ldmatrix fragments against the plain 32-bit fragment loads, with
rows past a group's end skipped. References: gguf-py's dequantization in float64."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from helpers.moe_problem import make_problem, reference_moe, rel_err
from strata.cuda_kernels import matmul, route
from strata.cuda_kernels.matmul_loads import split_loader
from strata.cuda_kernels.matmul_tiles import TcTile

# 2 warps, 32 weight rows: two threads per row (PARTS 2) with f16 activations, one with f32
TC_PAIRS = TcTile(bm=32, bn=32, warps_m=2, warps_n=1)


def _gate_up(pr, tile, *, x_half, shift=0):
    """h of the problem's gate/up through `tile`; `shift` bytes moved into the weight buffer."""
    n_tok, k = pr.ids.shape
    ff = pr.mats["gate"].shape[1]
    buf = cuda.to_device(np.concatenate([np.zeros(shift, np.uint8), pr.buf]))
    w = {name: matmul.QuantWeights(buf, cuda.to_device(pr.base[name] + shift),
                                   int(pr.types[name]), *pr.mats[name].shape[1:])
         for name in ("gate", "up")}
    r = route.route_tokens(cuda.to_device(pr.ids),
                           route.allocate_routing(n_tok, k, 2, tile_rows=tile.bm))
    x = pr.x.astype(np.float16) if x_half else pr.x
    h = cuda.to_device(np.full((n_tok * k, ff), np.nan, np.float16))
    matmul.moe_gate_up(cuda.to_device(x), w["gate"], w["up"], r, h, tile=tile)
    return h.copy_to_host()[r.inv.copy_to_host()]


@pytest.mark.parametrize("gate_type", [T.Q4_K, T.Q5_K, T.IQ4_XS])
@pytest.mark.parametrize("x_half,shift", [(True, 0), (False, 4), (True, 4)],
                         ids=["pairs-aligned", "single-misaligned", "pairs-misaligned"])
def test_split_loader_matches_reference(x_half, shift, gate_type):
    """Q4_K, Q5_K and IQ4_XS through their split loaders, one and two threads a row, aligned
    and 4-byte-misaligned buffers (IQ4_XS's 136-byte super-blocks alternate 16- and 8-byte
    aligned quant bytes: both vector paths, and the word path when misaligned); two
    super-blocks a row, so the heads (and Q5_K's fifth bits) are fetched again mid-row."""
    assert all(split_loader(int(t)) is not None
               for t in (T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0, T.IQ4_XS))
    rng = np.random.default_rng(41)
    # d = 512: two super-blocks per row, so the head words are fetched again mid-row
    pr = make_problem(rng, n_tok=6, k_top=2, n_exp=2, d=512, ff=32, gate_type=gate_type,
                      down_type=T.Q8_0, skew=True)
    got = _gate_up(pr, TC_PAIRS, x_half=x_half, shift=shift)
    h_ref, _ = reference_moe(pr, half=True)
    assert np.isfinite(got).all()
    assert rel_err(got, h_ref) < 2e-3


@pytest.mark.parametrize("gate_type", [T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0, T.IQ4_XS])
def test_fragment_and_pipeline_variants_agree(gate_type):
    """ldmatrix + pipeline (default) and plain loads without pipeline give the same h, both
    matching the reference; a group shorter than the tile leaves whole warps' rows unused."""
    rng = np.random.default_rng(7)
    d = 64 if gate_type == T.Q8_0 else 256  # one super-block of the K formats; 2 Q8_0 blocks
    pr = make_problem(rng, n_tok=5, k_top=2, n_exp=2, d=d, ff=32, gate_type=gate_type,
                      down_type=T.Q8_0, skew=True)
    h_ref, _ = reference_moe(pr, half=True)
    plain = dataclasses.replace(TC_PAIRS, ldsm=False, pipe=False)
    got = [_gate_up(pr, t, x_half=True) for t in (TC_PAIRS, plain)]
    for g in got:
        assert np.isfinite(g).all()
        assert rel_err(g, h_ref) < 2e-3
    assert rel_err(got[0], got[1].astype(np.float64)) < 2e-3


@pytest.mark.parametrize("gate_type", [T.Q4_K, T.Q5_K, T.Q8_0, T.IQ4_XS])
@pytest.mark.parametrize("row_threads,skip_pad", [(1, False), (1, True), (2, False)])
def test_row_threads_and_pad_skipping_choices_agree(gate_type, row_threads, skip_pad):
    """The per-format settings (tile_shapes.FORMAT_TILE) are kernel choices, not semantics:
    one or two threads a weight row, padding tiles' MMAs skipped or issued, all give the
    reference's h (the default, two threads and skipping, is covered above)."""
    rng = np.random.default_rng(13)
    d = 64 if gate_type == T.Q8_0 else 256
    pr = make_problem(rng, n_tok=5, k_top=2, n_exp=2, d=d, ff=32, gate_type=gate_type,
                      down_type=T.Q8_0, skew=True)
    h_ref, _ = reference_moe(pr, half=True)
    tile = dataclasses.replace(TC_PAIRS, row_threads=row_threads, skip_pad=skip_pad)
    got = _gate_up(pr, tile, x_half=True)
    assert np.isfinite(got).all()
    assert rel_err(got, h_ref) < 2e-3


@pytest.mark.parametrize("gate_type,d", [(T.Q4_K, 512), (T.Q6_K, 256), (T.Q8_0, 96),
                                         (T.Q8_0, 32)])
def test_three_activation_stages_agree(gate_type, d):
    """A ring of three swizzled activation stages (copied two steps ahead) gives the reference's
    h, as the two padded stages do: 16, 8, 3 and 1 k steps (the ring's first stages and an
    empty copy group at the end)."""
    rng = np.random.default_rng(29)
    pr = make_problem(rng, n_tok=7, k_top=2, n_exp=2, d=d, ff=32, gate_type=gate_type,
                      down_type=T.Q8_0, skew=True)
    h_ref, _ = reference_moe(pr, half=True)
    for tile in (dataclasses.replace(TC_PAIRS, a_stages=3),
                 dataclasses.replace(TC_PAIRS, a_stages=3, row_threads=1, skip_pad=False)):
        got = _gate_up(pr, tile, x_half=True)
        assert np.isfinite(got).all()
        assert rel_err(got, h_ref) < 2e-3
    # f32 activations are not copied by cp.async: the tile runs its two padded stages
    got = _gate_up(pr, dataclasses.replace(TC_PAIRS, a_stages=3), x_half=False)
    assert rel_err(got, h_ref) < 2e-3


def test_activation_stages_are_checked():
    from strata.cuda_kernels.matmul_tiles import TC_TILE
    three = dataclasses.replace(TC_TILE, a_stages=3)  # 44 KiB: fits one block's 48
    assert three.a_stages == 3
    with pytest.raises(ValueError, match="a_stages"):
        dataclasses.replace(TC_TILE, a_stages=4)
    with pytest.raises(ValueError, match="a_stages"):
        dataclasses.replace(TC_TILE, bm=64, a_stages=3, kch=2)
    with pytest.raises(ValueError, match="shared memory"):
        dataclasses.replace(TC_TILE, bm=256, warps_m=4, warps_n=2, a_stages=3)


def test_format_tiles():
    """Q4_K's default tile keeps one thread a row, the others two; every tile issues all its
    MMAs, copies activations three steps deep and is bounded to two blocks an SM (each measured
    faster on the H200); formats without
    settings take the default tile; row_threads is 1 or 2."""
    from strata.cuda_kernels.matmul_tiles import TC_TILE, tc_tile

    q4k = tc_tile(T.Q4_K)
    assert (q4k.row_threads, q4k.skip_pad, q4k.min_blocks) == (1, False, 2)
    assert (TC_TILE.row_threads, TC_TILE.skip_pad, TC_TILE.jit_options, TC_TILE.a_stages) == \
        (2, False, {"launch_bounds": (256, 2)}, 3)
    assert dataclasses.replace(q4k, row_threads=2) == TC_TILE
    assert tc_tile(T.Q8_0) == TC_TILE and tc_tile(T.Q6_K) == TC_TILE
    with pytest.raises(ValueError, match="row_threads"):
        dataclasses.replace(TC_TILE, row_threads=3)


def test_small_tile_is_for_few_rows_an_expert():
    """The short-prompt tile: 16 rows, its threads load one weight row each, and a chunk takes it
    only with at most SMALL_TILE_ROWS_PER_EXPERT entries an expert (32 tokens x top-8 over 128
    experts: yes; 4,096 tokens: no); the tile schedule it needs is longer than the default's."""
    from strata.cuda_kernels.matmul_tiles import (SMALL_TC_TILE, SMALL_TILE_ROWS_PER_EXPERT,
                                                  TC_TILE, takes_small_tile)
    from strata.cuda_kernels.route import max_tiles

    assert (SMALL_TC_TILE.bm, SMALL_TC_TILE.threads, SMALL_TC_TILE.row_threads) == (16, 128, 1)
    assert SMALL_TC_TILE.bn == TC_TILE.bn  # the same weight columns a block
    assert takes_small_tile(32 * 8, 128) and not takes_small_tile(4096 * 8, 128)
    assert takes_small_tile(SMALL_TILE_ROWS_PER_EXPERT * 128, 128)
    assert not takes_small_tile(SMALL_TILE_ROWS_PER_EXPERT * 128 + 1, 128)
    assert not takes_small_tile(0, 128)
    assert max_tiles(1024, 128, SMALL_TC_TILE.bm) > max_tiles(1024, 128, TC_TILE.bm)
