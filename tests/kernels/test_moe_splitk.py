"""The MoE decode launch with no barrier (`moe_splitk`: each block one lane part of down's columns,
int64 fixed-point sums, the last block's conversion) against float64, in the simulator (whole
grids: the kernel has no phases to cap). tests/gpu/test_kernels_decode_gpu.py runs it at the
30B shape and in CUDA graph replays (the same bits every replay)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import x_seen
from strata.cuda_kernels import moe_splitk
from strata.cuda_kernels.lanes import LANE_FORMATS, lane_format
from strata.cuda_kernels.lanes_x8 import X8_FORMATS
from strata.cuda_kernels.moe import ExpertLayout, _gate_up_lanes_for, _moe_decode, sync_len
from strata.cuda_kernels.qformats import get_format
from test_moe import _store
from test_moe_fused import IDS, K, LOGITS, WEIGHTS  # expert 2 misses; the logits route to IDS


@pytest.fixture(autouse=True)
def _splitk_on(monkeypatch):
    monkeypatch.setattr(moe_splitk, "USE", True)


def _run(layout, store, x, h0, out0, *, cpu_misses, routed, ids=IDS, weights=WEIGHTS,
         sync=None):
    ids = np.full(len(ids), -5, np.int32) if routed else ids.copy()
    weights = np.full(len(ids), np.nan, np.float32) if routed else weights.copy()
    h, out = h0.copy(), out0.copy()
    miss_list, counters = np.full(len(ids), -9, np.int32), np.zeros((2, 2), np.int64)
    sync = np.zeros(sync_len(layout.n_embd), np.int64) if sync is None else sync
    _moe_decode(x, ids, weights, layer=1, layout=layout, **store, h=h, out=out,
                miss_list=miss_list, counters=counters, cpu_misses=cpu_misses, accumulate=True,
                stream=0, route_logits=LOGITS if routed else None, sync=sync)
    return dict(ids=ids, weights=weights, h=h, out=out, miss_list=miss_list, counters=counters,
                sync=sync)


@pytest.mark.parametrize("gu,dn,cpu_misses,routed,x8", [
    ("Q4_K", "Q6_K", False, True, True),    # the 30B mix: routed, 8-bit x
    ("Q4_K", "Q4_K", True, False, False),   # the missed expert left to the CPU; float32 x
    ("Q8_0", "Q8_0", False, False, False),  # the tiny model's format: a part a 32-value block
    ("Q5_K", "Q5_K", True, True, False),    # Q5_K's parts (down in gate/up's own format)
])
def test_splitk_against_float64(gu, dn, cpu_misses, routed, x8, monkeypatch):
    """out += the routed experts' weighted down(silu(gate x) * up x), each row within 1e-5 of
    float64 (the sums' fixed point: 2^-32 a contribution); routing written once (block 0), the
    hits and misses counted once, h untouched, the sums, ticket and flag back to zero."""
    import strata.cuda_kernels.moe as moe_mod
    monkeypatch.setattr(moe_mod, "GATE_UP_X8", x8)
    rng = np.random.default_rng(len(gu + dn) + 10 * x8)
    n_embd, n_ff, n_expert, layer = 256, 256, 6, 1
    layout = ExpertLayout(n_embd, n_ff, gu, dn)
    gu_lf, dn_lf = _gate_up_lanes_for(layout), lane_format(get_format(dn).ggml_type)
    assert gu_lf.x8 == x8 and moe_splitk.supports(gu_lf, dn_lf)
    store, mats = _store(layout, gu, dn, rng)
    x = rng.standard_normal(n_embd).astype(np.float32)
    h0 = rng.standard_normal((K, n_ff)).astype(np.float32)
    out0 = rng.standard_normal(n_embd).astype(np.float32)
    got = _run(layout, store, x, h0, out0, cpu_misses=cpu_misses, routed=routed)
    np.testing.assert_array_equal(got["ids"], IDS)
    if routed:  # the softmax of the picked logits (norm_topk), as router.route writes it
        p = np.exp(LOGITS[IDS] - LOGITS[IDS].max())
        np.testing.assert_allclose(got["weights"], p / p.sum(), rtol=1e-6)
    assert got["counters"].tolist() == [[0, 0], [2, 1]]
    assert got["miss_list"].tolist() == ([-1, 2, -1] if cpu_misses else [-1, -1, -1])
    np.testing.assert_array_equal(got["h"], h0)
    assert not got["sync"].any(), np.flatnonzero(got["sync"])
    x64 = x_seen(x, x8)
    want = out0.astype(np.float64)
    for e, w in zip(IDS, got["weights"]):
        if cpu_misses and e == 2:
            continue
        g, u, d = mats[layer * n_expert + e]
        gx, ux = g @ x64, u @ x64
        want += w * (d @ (gx / (1 + np.exp(-gx)) * ux))
    err = np.abs(got["out"] - want).max() / np.abs(want - out0).max()
    assert err < 1e-5, err


def test_splitk_with_every_expert_left_to_the_cpu():
    """No block adds anything: out as it was, the state back to zero, both experts listed."""
    rng = np.random.default_rng(9)
    layout = ExpertLayout(256, 256, "Q4_K", "Q4_K")
    store, _ = _store(layout, "Q4_K", "Q4_K", rng)
    out0 = rng.standard_normal(256).astype(np.float32)
    got = _run(layout, store, rng.standard_normal(256).astype(np.float32),
               np.zeros((2, 256), np.float32), out0, cpu_misses=True, routed=False,
               ids=np.array([3, 1], np.int32), weights=np.array([0.6, 0.4], np.float32))
    np.testing.assert_array_equal(got["out"], out0)
    assert not got["sync"].any(), np.flatnonzero(got["sync"])
    assert got["miss_list"].tolist() == [3, 1] and got["counters"].tolist() == [[0, 0], [0, 2]]


def test_pairs_grid_and_state():
    """Which pairs run this kernel (down formats with lane parts, gate/up not planar), the
    grid's blocks a unit, and the state's size in the plan."""
    from gguf import GGMLQuantizationType as T

    from helpers.moe_shapes import qwen3moe
    from strata.plan.layout import session_layout
    q4, q6, q8, iq4 = (LANE_FORMATS[int(t)] for t in (T.Q4_K, T.Q6_K, T.Q8_0, T.IQ4_XS))
    assert moe_splitk.supports(X8_FORMATS[int(T.Q4_K)], q6) and moe_splitk.supports(q8, q8)
    assert moe_splitk.supports(iq4, q4) and not moe_splitk.supports(q4, iq4)
    assert moe_splitk.supports(q4, q8) and not moe_splitk.supports(q4, LANE_FORMATS[int(T.Q5_K)])
    assert not moe_splitk.supports(q4, X8_FORMATS[int(T.Q4_K)])
    # the 30B: 8 experts x 3 super-blocks x 4 parts of Q4_K = 96 units; 132 SMs: 264 blocks
    # aimed at -> 3 blocks a unit; Q6_K's 192 units -> 1
    assert moe_splitk.n_split_for(96, 2048, 132) == 3 and moe_splitk.n_split_for(192, 2048, 132) == 1
    assert moe_splitk.n_split_for(4, 64, 132) == 2  # at least 32 rows a block
    assert sync_len(2048) == 2048 + 3
    shape = qwen3moe()
    lay = session_layout(shape, batch=2, max_context=256)
    assert lay.region("moe_sync").shape == (2, sync_len(shape.n_embd))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the simulator's float32
def test_splitk_a_sum_it_cannot_hold_gives_nan_then_clears():
    """A contribution the fixed point cannot hold (here a weight of 1e30; a NaN likewise, which
    the integer conversion would turn into a number) makes every output NaN, as float sums would
    carry it, instead of a wrong finite number; the state is clear after, so the next launch on
    it is exact again."""
    rng = np.random.default_rng(4)
    layout = ExpertLayout(256, 256, "Q4_K", "Q4_K")
    store, _ = _store(layout, "Q4_K", "Q4_K", rng)
    x = rng.standard_normal(256).astype(np.float32)
    out0 = np.zeros(256, np.float32)
    ids = np.array([4, 0], np.int32)
    h0 = np.zeros((2, 256), np.float32)
    big = _run(layout, store, x, h0, out0, cpu_misses=False, routed=False, ids=ids,
               weights=np.array([1e30, 0.5], np.float32))
    assert np.isnan(big["out"]).all() and not big["sync"].any()
    fine = _run(layout, store, x, h0, out0, cpu_misses=False, routed=False, ids=ids,
                weights=np.array([0.5, 0.5], np.float32), sync=big["sync"])
    again = _run(layout, store, x, h0, out0, cpu_misses=False, routed=False, ids=ids,
                 weights=np.array([0.5, 0.5], np.float32))  # on a state never used
    assert np.isfinite(fine["out"]).all() and np.abs(fine["out"]).max() > 0
    np.testing.assert_array_equal(fine["out"], again["out"])
