"""MoE decode (cache hits, mapped-host misses, CPU-pool misses) against float64 numpy."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import random_rows, reference, x_seen
from strata.cuda_kernels.lanes import lane_format
from strata.cuda_kernels.matvec import LANE_WARPS, lane_split, lanes_fit
from strata.cuda_kernels.moe import (
    WARPS,
    ExpertLayout,
    _gate_up_lanes_for,
    _moe_decode,
    down_group,
    expert_groups,
    moe_decode,
)
from strata.cuda_kernels.qformats import get_format


def _experts(layout, gu, dn, n_total, rng):
    """Blobs [n_total, expert_bytes] u8 and their float64 (gate, up, down) matrices."""
    e, f = layout.n_embd, layout.n_ff
    blobs = np.zeros((n_total, layout.expert_bytes), np.uint8)
    mats = []
    for i in range(n_total):
        g, u, d = random_rows(gu, f, e, rng), random_rows(gu, f, e, rng), random_rows(dn, e, f, rng)
        blobs[i, :g.size] = g.reshape(-1)
        blobs[i, layout.up_off:layout.up_off + u.size] = u.reshape(-1)
        blobs[i, layout.down_off:layout.down_off + d.size] = d.reshape(-1)
        mats.append((reference(gu, g, e), reference(gu, u, e), reference(dn, d, f)))
    return blobs, mats


def _store(layout, gu, dn, rng, n_layer=2, n_expert=6, layer=1):
    """Experts in host memory, experts 4 and 0 of `layer` also in (unpacked) cache slots:
    (moe_decode's store arguments, the float64 matrices)."""
    blobs, mats = _experts(layout, gu, dn, n_layer * n_expert, rng)
    host_off = (np.arange(n_layer * n_expert, dtype=np.int64)
                * layout.expert_bytes).reshape(n_layer, n_expert)
    slot_table = np.full((n_layer, n_expert), -1, np.int32)
    slot_table[layer, 4], slot_table[layer, 0] = 1, 0
    gap = 48                                             # slots need not be packed
    slot_off = np.array([0, layout.expert_bytes + gap], np.int64)
    cache = np.zeros(2 * layout.expert_bytes + gap, np.uint8)
    cache[:layout.expert_bytes] = blobs[layer * n_expert + 0]
    cache[layout.expert_bytes + gap:] = blobs[layer * n_expert + 4]
    store = dict(slot_table=slot_table, cache=cache, slot_off=slot_off,
                 host=blobs.reshape(-1).copy(), host_off=host_off)
    return store, mats


@pytest.mark.parametrize("gu,dn,n_embd,n_ff,cpu_misses", [
    ("IQ4_XS", "Q8_0", 256, 32, False),     # lane kernels (gate_up and down)
    ("Q8_0", "IQ4_NL", 64, 32, True),       # lane gate_up, generic down
    # a gate/up row of two steps (5 Q6_K super-blocks, 4 a step: the rows kernel); the two
    # above have rows of one step (items pipelined across, CPU misses skipped between them)
    ("Q6_K", "Q8_0", 1280, 32, True),
])
def test_moe_decode(gu, dn, n_embd, n_ff, cpu_misses):
    rng = np.random.default_rng(n_embd + n_ff)
    n_layer, n_expert, layer = 2, 6, 1
    layout = ExpertLayout(n_embd, n_ff, gu, dn)
    store, mats = _store(layout, gu, dn, rng)
    slot_table, cache, slot_off = store["slot_table"], store["cache"], store["slot_off"]
    host, host_off = store["host"], store["host_off"]

    ids = np.array([4, 2, 0], np.int32)                  # expert 2 misses
    weights = np.array([0.5, 0.3, 0.2], np.float32)
    x = rng.standard_normal(n_embd).astype(np.float32)
    out0 = rng.standard_normal(n_embd).astype(np.float32)
    out = out0.copy()
    h = np.full((3, n_ff), np.nan, np.float32)
    miss_list = np.full(3, -9, np.int32)
    counters = np.zeros((n_layer, 2), np.int64)
    moe_decode(x, ids, weights, layer=layer, layout=layout, slot_table=slot_table, cache=cache,
               slot_off=slot_off, host=host, host_off=host_off, h=h, out=out,
               miss_list=miss_list, counters=counters, cpu_misses=cpu_misses, accumulate=True)

    want = out0.astype(np.float64)
    x64 = x_seen(x, _gate_up_lanes_for(layout).x8)  # 8-bit x: as the CPU engine quantizes it
    for e, w in zip(ids, weights):
        if cpu_misses and slot_table[layer, e] < 0:
            continue
        g, u, d = mats[layer * n_expert + e]
        gx, ux = g @ x64, u @ x64
        want += w * (d @ (gx / (1 + np.exp(-gx)) * ux))
    assert np.linalg.norm(out - want) / np.linalg.norm(want - out0) < 1e-5
    assert miss_list.tolist() == ([-1, 2, -1] if cpu_misses else [-1, -1, -1])
    assert counters.tolist() == [[0, 0], [2, 1]]


def test_layout_checks():
    lay = ExpertLayout(256, 256, "Q4_K", "Q6_K")
    assert (lay.up_off, lay.down_off) == (256 * 144, 2 * 256 * 144)
    assert lay.expert_bytes == 2 * 256 * 144 + 256 * 210
    with pytest.raises(ValueError, match="overlaps"):
        ExpertLayout(256, 256, "Q4_K", "Q6_K", up_off=16)
    with pytest.raises(ValueError, match="aligned"):
        ExpertLayout(256, 256, "Q4_K", "Q6_K", down_off=2 * 256 * 144 + 8)


def test_moe_refuses_one_expert_h_larger_than_shared_memory():
    n_ff, k = 16384, 2  # one expert's 16,384 staged values of h: 64 KiB > 48 KiB
    lay = ExpertLayout(256, n_ff, "Q8_0", "IQ4_NL")
    z = np.zeros
    with pytest.raises(ValueError, match="one expert's h exceed"):
        moe_decode(z(256, np.float32), z(k, np.int32), z(k, np.float32), layer=0, layout=lay,
                   slot_table=z((1, 16), np.int32), cache=z(16, np.uint8),
                   slot_off=z(1, np.int64), host=z(16, np.uint8), host_off=z((1, 16), np.int64),
                   h=z((k, n_ff), np.float32), out=z(256, np.float32),
                   miss_list=z(k, np.int32), counters=z((1, 2), np.int64))


def test_down_group_takes_the_most_experts_that_fit():
    assert down_group(8, 1536, lambda g: g <= 7) == 4  # two launches, shared evenly
    assert down_group(8, 1536, lambda g: g <= 3) == 3  # three launches: 3, 3, 2
    assert down_group(8, 1536, lambda g: True) == 8
    with pytest.raises(ValueError, match="n_ff = 1536 values of one expert's h exceed"):
        down_group(3, 1536, lambda g: False)
    ids, w, h = np.arange(8), np.arange(8) * 0.5, np.arange(8 * 4)
    groups = list(expert_groups(ids, w, h, 4, 3))
    assert [(g[0].tolist(), g[3], g[4]) for g in groups] == [
        ([0, 1, 2], 3, True), ([3, 4, 5], 3, False), ([6, 7], 2, False)]
    assert groups[2][2].tolist() == list(range(24, 32)) and groups[1][1].tolist() == [1.5, 2, 2.5]
    (whole,) = expert_groups(ids, w, h, 4, 8)  # one launch: the arrays themselves
    assert whole[0] is ids and whole[2] is h and whole[3:] == (8, True)


@pytest.mark.parametrize("gu,dn,n_embd,cpu_misses", [
    ("Q4_K", "Q6_K", 256, False),    # lane down kernel: experts 0-1, then 2 added
    ("Q4_K", "Q6_K", 256, True),     # the missed expert (left to the CPU) in the second launch
    ("Q8_0", "IQ4_NL", 64, False),   # generic down kernel, the same split
])
def test_moe_down_splits_experts_whose_h_exceeds_shared_memory(gu, dn, n_embd, cpu_misses):
    """3 experts of n_ff = 4096 (as Qwen3-235B's 8 x 1536, their h is over 48 KiB): the down
    projection runs over groups of experts, each launch adding into the one before. The first
    row block of each kernel against float64 (whole grids take minutes in the simulator)."""
    n_ff, n_expert, layer = 4096, 6, 1
    rng = np.random.default_rng(n_embd + len(dn))
    layout = ExpertLayout(n_embd, n_ff, gu, dn)
    lf = lane_format(get_format(dn).ggml_type)
    if lf is not None:
        assert lanes_fit(lf, 2 * n_ff) and not lanes_fit(lf, 3 * n_ff)
        n_outs = {2 * (LANE_WARPS >> lane_split(lf, n_embd, g * n_ff // lf.sb_values))
                  for g in (1, 2)}
        assert len(n_outs) == 1  # every launch's first row block covers the same rows
        n_out = n_outs.pop()
    else:
        n_out = WARPS
    store, mats = _store(layout, gu, dn, rng)
    ids = np.array([4, 2, 0], np.int32)                  # expert 2 misses
    weights = np.array([0.5, 0.3, 0.2], np.float32)
    x = rng.standard_normal(n_embd).astype(np.float32)
    h0 = rng.standard_normal((3, n_ff)).astype(np.float32)
    out0 = rng.standard_normal(n_embd).astype(np.float32)
    h, out = h0.copy(), out0.copy()
    _moe_decode(x, ids, weights, layer=layer, layout=layout, **store, h=h, out=out,
                miss_list=np.zeros(3, np.int32), counters=np.zeros((2, 2), np.int64),
                cpu_misses=cpu_misses, accumulate=False, stream=0, max_row_blocks=1)
    want = np.zeros(n_out)  # accumulate=False: the first group overwrites, the rest add
    for kk, (e, w) in enumerate(zip(ids, weights)):
        if not (cpu_misses and e == 2):
            want += w * (mats[layer * n_expert + e][2][:n_out] @ h[kk].astype(np.float64))
    assert np.linalg.norm(out[:n_out] - want) / np.linalg.norm(want) < 1e-5


@pytest.mark.parametrize("gu,dn,n_ff,cpu_misses,x8", [
    ("Q4_K", "Q6_K", 512, False, True),   # down: 6 units in 2 steps, shared by 2 warps
    ("Q4_K", "Q6_K", 512, True, True),    # the missed expert left out of the units
    ("Q4_K", "Q6_K", 512, True, False),   # Q4_K's float32 gate/up (GATE_UP_X8 off)
    ("IQ3_S", "Q5_K", 256, True, False),
    ("IQ3_S", "Q5_K", 256, True, True),     # IQ3_S's 8-bit gate/up
    ("IQ4_XS", "Q6_K", 256, False, True),   # IQ4_XS's: 4 lanes a super-block, not 8
    ("Q6_K", "IQ3_S", 256, False, False),
    ("Q5_K", "IQ4_XS", 256, False, False),
])
def test_moe_lane_kernels_first_row_block(gu, dn, n_ff, cpu_misses, x8, monkeypatch):
    """The lane kernels of K and IQ formats, each run on its first row block only (whole grids
    take minutes in the simulator): those rows against float64, every other row unwritten. An
    8-bit gate/up (`lanes_x8`) is held to float64 of the x the CPU engine quantizes
    (`x_seen`): its dots are exact but for float32 rounding."""
    import strata.cuda_kernels.moe as moe_mod
    monkeypatch.setattr(moe_mod, "GATE_UP_X8", x8)
    rng = np.random.default_rng(n_ff + len(gu + dn))
    n_embd, n_expert, layer = 256, 6, 1
    layout = ExpertLayout(n_embd, n_ff, gu, dn)
    assert moe_mod._gate_up_lanes_for(layout).x8 == x8
    store, mats = _store(layout, gu, dn, rng)
    ids = np.array([4, 2, 0], np.int32)                  # expert 2 misses
    weights = np.array([0.5, 0.3, 0.2], np.float32)
    x = rng.standard_normal(n_embd).astype(np.float32)
    h0 = rng.standard_normal((3, n_ff)).astype(np.float32)   # what gate_up leaves is read too
    out0 = rng.standard_normal(n_embd).astype(np.float32)
    h, out = h0.copy(), out0.copy()
    _moe_decode(x, ids, weights, layer=layer, layout=layout, **store, h=h, out=out,
                miss_list=np.zeros(3, np.int32), counters=np.zeros((2, 2), np.int64),
                cpu_misses=cpu_misses, accumulate=True, stream=0, max_row_blocks=1)
    n_h = LANE_WARPS                                    # one gate/up row pair per warp
    n_out = 2 * (LANE_WARPS >> lane_split(lane_format(get_format(dn).ggml_type), n_embd,
                                          3 * (n_ff // 256)))
    x64 = x_seen(x, x8)
    want = out0[:n_out].astype(np.float64)
    for kk, (e, w) in enumerate(zip(ids, weights)):
        g, u, d = mats[layer * n_expert + e]
        missed = cpu_misses and e == 2
        gx, ux = g[:n_h] @ x64, u[:n_h] @ x64
        if missed:
            np.testing.assert_array_equal(h[kk, :n_h], 0.0)
        else:
            want_h = gx / (1 + np.exp(-gx)) * ux
            assert np.linalg.norm(h[kk, :n_h] - want_h) / np.linalg.norm(want_h) < 1e-5
        np.testing.assert_array_equal(h[kk, n_h:], h0[kk, n_h:])
        if not missed:
            want += w * (d[:n_out] @ h[kk].astype(np.float64))
    assert np.linalg.norm(out[:n_out] - want) / np.linalg.norm(want - out0[:n_out]) < 1e-5
    np.testing.assert_array_equal(out[n_out:], out0[n_out:])


def test_moe_every_expert_left_to_the_cpu():
    rng = np.random.default_rng(9)
    layout = ExpertLayout(256, 256, "Q4_K", "Q6_K")
    store, _ = _store(layout, "Q4_K", "Q6_K", rng)
    out0 = rng.standard_normal(256).astype(np.float32)
    out = out0.copy()
    h = np.full((2, 256), np.nan, np.float32)
    miss_list = np.full(2, -9, np.int32)
    counters = np.zeros((2, 2), np.int64)
    _moe_decode(rng.standard_normal(256).astype(np.float32), np.array([3, 1], np.int32),
                np.array([0.6, 0.4], np.float32), layer=1, layout=layout, **store, h=h, out=out,
                miss_list=miss_list, counters=counters, cpu_misses=True, accumulate=True,
                stream=0, max_row_blocks=1)
    np.testing.assert_array_equal(out, out0)            # no expert: nothing added
    np.testing.assert_array_equal(h[:, :LANE_WARPS], 0.0)
    assert miss_list.tolist() == [3, 1] and counters.tolist() == [[0, 0], [0, 2]]


@pytest.mark.parametrize("gu,dn,n_embd,n_expert,k", [
    ("Q4_K", "Q6_K", 256, 6, 3),   # lane gate/up: every block routes, block 0 writes ids
    ("Q6_K", "Q8_0", 1280, 6, 3),  # the lane rows kernel (two steps a row)
    ("Q4_1", "Q8_0", 64, 6, 3),    # no lane gate/up: a route launch first
])
def test_moe_routes_the_router_logits_itself(gu, dn, n_embd, n_expert, k):
    """moe_decode(route_logits=...): the softmax top-k of the logits (ties to the lower id)
    written to ids / weights, and the same h and output as a run given those ids and weights."""
    from strata.cuda_kernels.moe import routes_itself
    rng = np.random.default_rng(n_embd + k)
    n_ff, layer = 256, 1
    layout = ExpertLayout(n_embd, n_ff, gu, dn)
    assert routes_itself(layout, n_expert) == (gu != "Q4_1")
    store, _ = _store(layout, gu, dn, rng, n_expert=n_expert)
    logits = np.array([0.3, -1.0, 1.7, 0.3, 2.5, 0.3], np.float32)  # a tie at the 3rd place
    p = np.exp(logits.astype(np.float64) - logits.max())
    want_ids = np.argsort(-logits, kind="stable")[:k]
    want_w = p[want_ids] / p[want_ids].sum()
    x = rng.standard_normal(n_embd).astype(np.float32)
    out0 = rng.standard_normal(n_embd).astype(np.float32)
    runs = []
    for routed in (True, False):
        ids = np.full(k, -5, np.int32) if routed else runs[0]["ids"].copy()
        weights = np.full(k, np.nan, np.float32) if routed else runs[0]["weights"].copy()
        h, out = np.full((k, n_ff), np.nan, np.float32), out0.copy()
        counters = np.zeros((2, 2), np.int64)
        _moe_decode(x, ids, weights, layer=layer, layout=layout, **store, h=h, out=out,
                    miss_list=np.zeros(k, np.int32), counters=counters, cpu_misses=False,
                    accumulate=True, stream=0, max_row_blocks=1,
                    route_logits=logits if routed else None)
        runs.append(dict(ids=ids, weights=weights, h=h, out=out, counters=counters))
    np.testing.assert_array_equal(runs[0]["ids"], want_ids)  # [4, 2, 0]: 0 wins the tie
    np.testing.assert_allclose(runs[0]["weights"], want_w, rtol=1e-6)
    for key in ("h", "out", "counters"):
        np.testing.assert_array_equal(runs[0][key], runs[1][key], err_msg=key)
    assert runs[0]["counters"].tolist() == [[0, 0], [2, 1]]  # experts 4 and 0 cached, 2 missed


def test_moe_refuses_route_logits_of_too_few_experts():
    layout = ExpertLayout(256, 256, "Q4_K", "Q6_K")
    store, _ = _store(layout, "Q4_K", "Q6_K", np.random.default_rng(3))
    z = np.zeros
    with pytest.raises(ValueError, match=r"route_logits: 2 experts, expected 3\.\.512"):
        moe_decode(z(256, np.float32), z(3, np.int32), z(3, np.float32), layer=1, layout=layout,
                   **store, h=z((3, 256), np.float32), out=z(256, np.float32),
                   miss_list=z(3, np.int32), counters=z((2, 2), np.int64),
                   route_logits=z(2, np.float32))
