"""The batched MoE decode (several tokens' top-k experts in two launches) against float64 numpy,
and the property the batched engine rests on: a token's output does not depend on the batch."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import random_rows, reference
from strata.cuda_kernels.batch_moe import WARPS, batch_moe_decode, batch_moe_fits
from strata.cuda_kernels.batch_moe_lanes import lanes_plan
from strata.cuda_kernels.matvec import LANE_WARPS
from strata.cuda_kernels.moe import ExpertLayout

N_LAYER, N_EXPERT, LAYER = 2, 5, 1


def _store(layout, gu, dn, rng):
    """Every expert in host memory, experts 3 and 0 of LAYER also in cache slots (unpacked):
    (the store arguments, the float64 (gate, up, down) per expert)."""
    e, f = layout.n_embd, layout.n_ff
    blobs = np.zeros((N_LAYER * N_EXPERT, layout.expert_bytes), np.uint8)
    mats = []
    for i in range(N_LAYER * N_EXPERT):
        g, u, d = random_rows(gu, f, e, rng), random_rows(gu, f, e, rng), random_rows(dn, e, f, rng)
        blobs[i, :g.size] = g.reshape(-1)
        blobs[i, layout.up_off:layout.up_off + u.size] = u.reshape(-1)
        blobs[i, layout.down_off:layout.down_off + d.size] = d.reshape(-1)
        mats.append((reference(gu, g, e), reference(gu, u, e), reference(dn, d, f)))
    slot_table = np.full((N_LAYER, N_EXPERT), -1, np.int32)
    slot_table[LAYER, 3], slot_table[LAYER, 0] = 1, 0
    gap = 32
    slot_off = np.array([0, layout.expert_bytes + gap], np.int64)
    cache = np.zeros(2 * layout.expert_bytes + gap, np.uint8)
    cache[:layout.expert_bytes] = blobs[LAYER * N_EXPERT]
    cache[layout.expert_bytes + gap:] = blobs[LAYER * N_EXPERT + 3]
    host_off = (np.arange(N_LAYER * N_EXPERT, dtype=np.int64)
                * layout.expert_bytes).reshape(N_LAYER, N_EXPERT)
    store = dict(slot_table=slot_table, cache=cache, slot_off=slot_off,
                 host=blobs.reshape(-1).copy(), host_off=host_off)
    return store, mats


def _run(x, ids, weights, layout, store, out0, h0, max_row_blocks=None):
    out, h = out0.copy(), h0.copy()
    counters = np.zeros((N_LAYER, 2), np.int64)
    batch_moe_decode(x, ids, weights, layer=LAYER, layout=layout, **store, h=h, out=out,
                     counters=counters, accumulate=True, max_row_blocks=max_row_blocks)
    return out, h, counters


@pytest.mark.parametrize("gu,dn,n_embd,n_ff,max_row_blocks", [
    ("Q8_0", "Q4_0", 64, 32, None),     # whole grids
    ("Q4_K", "Q6_K", 256, 256, 1),      # the Q4_K_M mix's expert formats (lane kernels), first
                                        # row block
])
def test_batch_moe_against_float64(gu, dn, n_embd, n_ff, max_row_blocks):
    """Rows the run covers against float64; h rows it leaves are the pre-set values, which the
    down projection reads as they are."""
    rng = np.random.default_rng(n_embd + n_ff)
    layout = ExpertLayout(n_embd, n_ff, gu, dn)
    store, mats = _store(layout, gu, dn, rng)
    ids = np.array([[3, 2], [0, 3], [4, 1]], np.int32)   # 3 cached entries, 3 misses; 3 repeats
    weights = np.array([[0.6, 0.4], [0.3, 0.7], [0.5, 0.5]], np.float32)
    x = rng.standard_normal((3, n_embd)).astype(np.float32)
    out0 = rng.standard_normal((3, n_embd)).astype(np.float32)
    h0 = rng.standard_normal((3, 2, n_ff)).astype(np.float32)
    out, h, counters = _run(x, ids, weights, layout, store, out0, h0, max_row_blocks)
    lanes = lanes_plan(layout, 2, 3)   # rows of one block: lane kernels or generic ones
    rows_h, rows_out = (LANE_WARPS, 2 * (LANE_WARPS >> lanes.log)) if lanes else (WARPS, WARPS)
    assert (lanes is not None) == (gu == "Q4_K")
    n_h = n_ff if max_row_blocks is None else min(n_ff, rows_h)
    n_out = n_embd if max_row_blocks is None else min(n_embd, rows_out)
    for t in range(3):
        want = out0[t, :n_out].astype(np.float64)
        for kk, (e, w) in enumerate(zip(ids[t], weights[t])):
            g, u, d = mats[LAYER * N_EXPERT + e]
            gx, ux = g[:n_h] @ x[t].astype(np.float64), u[:n_h] @ x[t].astype(np.float64)
            hk = h0[t, kk].astype(np.float64)
            hk[:n_h] = gx / (1 + np.exp(-gx)) * ux
            np.testing.assert_allclose(h[t, kk], hk, rtol=1e-4, atol=1e-4)
            want += w * (d[:n_out] @ hk)
        got = out[t, :n_out]
        assert np.linalg.norm(got - want) / np.linalg.norm(want - out0[t, :n_out]) < 1e-5, t
        np.testing.assert_array_equal(out[t, n_out:], out0[t, n_out:])
    assert counters.tolist() == [[0, 0], [3, 3]]


def test_a_token_gets_the_same_bits_alone_and_in_a_batch():
    rng = np.random.default_rng(5)
    layout = ExpertLayout(64, 32, "Q8_0", "Q8_0")
    store, _ = _store(layout, "Q8_0", "Q8_0", rng)
    ids = np.array([[1, 3], [3, 0]], np.int32)
    weights = np.array([[0.2, 0.8], [0.5, 0.5]], np.float32)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    out0, h0 = np.zeros((2, 64), np.float32), np.zeros((2, 2, 32), np.float32)
    both = _run(x, ids, weights, layout, store, out0, h0)[0]
    alone = _run(x[1:], ids[1:], weights[1:], layout, store, out0[1:], h0[1:])[0]
    np.testing.assert_array_equal(both[1], alone[0])


def test_batch_moe_refuses_bad_shapes():
    layout = ExpertLayout(64, 32, "Q8_0", "Q8_0")
    z = np.zeros
    args = dict(layer=0, layout=layout, slot_table=z((1, 4), np.int32), cache=z(16, np.uint8),
                slot_off=z(1, np.int64), host=z(16, np.uint8), host_off=z((1, 4), np.int64),
                counters=z((1, 2), np.int64))
    with pytest.raises(ValueError, match="1..8"):
        batch_moe_decode(z((9, 64), np.float32), z((9, 2), np.int32), z((9, 2), np.float32),
                         h=z((9, 2, 32), np.float32), out=z((9, 64), np.float32), **args)
    with pytest.raises(ValueError, match="weights"):
        batch_moe_decode(z((2, 64), np.float32), z((2, 2), np.int32), z((2, 3), np.float32),
                         h=z((2, 2, 32), np.float32), out=z((2, 64), np.float32), **args)
    big = ExpertLayout(256, 1024, "Q8_0", "Q8_0")   # 16 * 1024 staged values of h: 72 KiB
    assert not batch_moe_fits(big, 16, 1)  # the engine runs such rows one by one instead
    assert batch_moe_fits(big, 4, 1)
    with pytest.raises(ValueError, match="shared memory"):
        batch_moe_decode(z((1, 256), np.float32), z((1, 16), np.int32), z((1, 16), np.float32),
                         **{**args, "layout": big}, h=z((1, 16, 1024), np.float32),
                         out=z((1, 256), np.float32))


def test_lane_kernels_group_tokens_by_expert_and_match_one_token_moe(monkeypatch):
    """Q4_K / Q6_K (lane formats): three tokens, expert 3 chosen by all of them (token groups of
    two, forced: a full group and a short one): h and out against float64, and a token's h and
    out equal to the one-token `moe` lane kernels' for that token alone."""
    import strata.cuda_kernels.batch_moe as bm
    from strata.cuda_kernels.batch_moe_lanes import LanesPlan
    from strata.cuda_kernels.moe import _moe_decode

    rng = np.random.default_rng(21)
    layout = ExpertLayout(256, 256, "Q4_K", "Q6_K")
    store, mats = _store(layout, "Q4_K", "Q6_K", rng)
    ids = np.array([[3, 1], [1, 3], [4, 3]], np.int32)
    weights = rng.uniform(0.1, 1, (3, 2)).astype(np.float32)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    out0 = rng.standard_normal((3, 256)).astype(np.float32)
    h0 = np.zeros((3, 2, 256), np.float32)
    real = bm.lanes_plan
    monkeypatch.setattr(bm, "lanes_plan", lambda *a: LanesPlan(real(*a).gu, real(*a).dn, 2,
                                                                real(*a).log))
    out, h, counters = _run(x, ids, weights, layout, store, out0, h0, max_row_blocks=1)
    assert counters.tolist() == [[0, 0], [3, 3]]   # expert 3 cached (3 entries); 1, 4 missed
    n_h, n_out = 8, 16   # one row block: 8 h rows (a warp each), 8 warps x 2 output rows
    for t in range(3):
        want = out0[t, :n_out].astype(np.float64)
        for kk, (e, w) in enumerate(zip(ids[t], weights[t])):
            g, u, d = mats[LAYER * N_EXPERT + e]
            gx, ux = g[:n_h] @ x[t].astype(np.float64), u[:n_h] @ x[t].astype(np.float64)
            np.testing.assert_allclose(h[t, kk, :n_h], gx / (1 + np.exp(-gx)) * ux, rtol=1e-4,
                                       atol=1e-4)
            want += w * (d[:n_out] @ h[t, kk].astype(np.float64))
        assert np.linalg.norm(out[t, :n_out] - want) / np.linalg.norm(want - out0[t, :n_out]) \
            < 1e-5
    t = 2   # expert 3 in the short group
    one_h, one_out = h[t].copy(), out0[t].copy()   # h rows past the first block as batched
    one_h[:, :n_h] = np.nan
    _moe_decode(x[t], ids[t], weights[t], layer=LAYER, layout=layout, **store, h=one_h,
                out=one_out, miss_list=np.zeros(2, np.int32),
                counters=np.zeros((N_LAYER, 2), np.int64), cpu_misses=False, accumulate=True,
                stream=0, max_row_blocks=1, x8=False)  # float32 x, as the batch kernels
    np.testing.assert_array_equal(h[t, :, :n_h], one_h[:, :n_h])
    np.testing.assert_array_equal(out[t, :n_out], one_out[:n_out])


def test_gate_up_warps_take_several_rows_in_turn(monkeypatch):
    """Rows per warp (`LanesPlan.rpw`): one block of 3 rows per warp computes the h rows that
    three blocks of one row per warp compute, bit for bit, and they match float64; a partial
    last block (rows past n_ff) writes nothing past h's rows."""
    import strata.cuda_kernels.batch_moe as bm
    from strata.cuda_kernels.batch_moe_lanes import LanesPlan, gate_up_rows_per_warp

    assert gate_up_rows_per_warp(768, 64) == 6 and gate_up_rows_per_warp(768, 16) == 2
    assert gate_up_rows_per_warp(40, 2) == 1   # few entries: one row per warp
    rng = np.random.default_rng(33)
    layout = ExpertLayout(256, 256, "Q4_K", "Q6_K")
    store, mats = _store(layout, "Q4_K", "Q6_K", rng)
    ids = np.array([[3, 1], [1, 3]], np.int32)
    weights = rng.uniform(0.1, 1, (2, 2)).astype(np.float32)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    out0, h0 = np.zeros((2, 256), np.float32), np.full((2, 2, 256), 7.0, np.float32)
    real = bm.lanes_plan
    runs = {}
    for rpw, blocks in ((3, 1), (1, 3)):
        monkeypatch.setattr(bm, "lanes_plan", lambda *a, r=rpw: LanesPlan(
            real(*a).gu, real(*a).dn, real(*a).tg, real(*a).log, r))
        runs[rpw] = _run(x, ids, weights, layout, store, out0, h0, max_row_blocks=blocks)[1]
    n_h = 3 * LANE_WARPS
    np.testing.assert_array_equal(runs[3], runs[1])
    assert (runs[3][:, :, n_h:] == 7.0).all()
    for t in range(2):
        for kk, e in enumerate(ids[t]):
            g, u, _ = mats[LAYER * N_EXPERT + e]
            gx, ux = g[:n_h] @ x[t].astype(np.float64), u[:n_h] @ x[t].astype(np.float64)
            np.testing.assert_allclose(runs[3][t, kk, :n_h], gx / (1 + np.exp(-gx)) * ux,
                                       rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("gu,dn,n_embd,n_ff", [("Q4_K", "Q6_K", 512, 256),
                                               ("Q6_K", "Q4_K", 256, 512)])
def test_tensor_core_batch_moe_against_float64(gu, dn, n_embd, n_ff):
    """`tensor_cores=True` (`batch_moe_tc`): the first 16-row tile of h and of the output against
    float64 (hits and misses, experts repeated across tokens); the rest of h as pre-set, the
    rest of out untouched; hits and misses counted once per entry."""
    from strata.cuda_kernels.batch_moe_tc import tc_moe_fits

    rng = np.random.default_rng(n_embd + 3 * n_ff)
    layout = ExpertLayout(n_embd, n_ff, gu, dn)
    assert tc_moe_fits(layout)
    store, mats = _store(layout, gu, dn, rng)
    ids = np.array([[3, 2], [0, 3], [4, 1]], np.int32)
    weights = np.array([[0.6, 0.4], [0.3, 0.7], [0.5, 0.5]], np.float32)
    x = rng.standard_normal((3, n_embd)).astype(np.float32)
    out0 = rng.standard_normal((3, n_embd)).astype(np.float32)
    h0 = rng.standard_normal((3, 2, n_ff)).astype(np.float32)
    out, h = out0.copy(), h0.copy()
    counters = np.zeros((N_LAYER, 2), np.int64)
    batch_moe_decode(x, ids, weights, layer=LAYER, layout=layout, **store, h=h, out=out,
                     counters=counters, accumulate=True, max_row_blocks=1, tensor_cores=True)
    n = 16
    for t in range(3):
        want = out0[t, :n].astype(np.float64)
        for kk, (e, w) in enumerate(zip(ids[t], weights[t])):
            g, u, d = mats[LAYER * N_EXPERT + e]
            gx, ux = g[:n] @ x[t].astype(np.float64), u[:n] @ x[t].astype(np.float64)
            hk = h0[t, kk].astype(np.float64)
            hk[:n] = gx / (1 + np.exp(-gx)) * ux
            np.testing.assert_allclose(h[t, kk], hk, rtol=1e-5, atol=1e-5)
            want += w * (d[:n] @ hk)
        assert np.linalg.norm(out[t, :n] - want) / np.linalg.norm(want - out0[t, :n]) < 1e-5, t
        np.testing.assert_array_equal(out[t, n:], out0[t, n:])
    assert counters.tolist() == [[0, 0], [3, 3]]
