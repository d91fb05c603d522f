"""The fused MoE decode launch (`moe_fused`: gate/up, a barrier across the grid, down) against
float64 and bit for bit against the two launches it replaces. In the simulator the kernel runs
as its two phases (blocks run one after another there, so a barrier across them would never
open); tests/gpu/test_kernels_decode_gpu.py runs the barrier itself."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import x_seen
from strata.cuda_kernels import moe_fused
from strata.cuda_kernels.lanes import lane_format
from strata.cuda_kernels.matvec import LANE_WARPS, lane_split
from strata.cuda_kernels.moe import ExpertLayout, _gate_up_lanes_for, _moe_decode
from strata.cuda_kernels.qformats import get_format
from test_moe import _store

K = 3
IDS = np.array([4, 2, 0], np.int32)                # expert 2 misses (not in a cache slot)
WEIGHTS = np.array([0.5, 0.3, 0.2], np.float32)
LOGITS = np.array([0.3, -1.0, 1.7, 0.3, 2.5, 0.3], np.float32)  # routes to 4, 2, 0


def _run(layout, store, x, h0, out0, *, sync, cpu_misses, routed, max_row_blocks):
    ids = np.full(K, -5, np.int32) if routed else IDS.copy()
    weights = np.full(K, np.nan, np.float32) if routed else WEIGHTS.copy()
    h, out = h0.copy(), out0.copy()
    miss_list, counters = np.full(K, -9, np.int32), np.zeros((2, 2), np.int64)
    _moe_decode(x, ids, weights, layer=1, layout=layout, **store, h=h, out=out,
                miss_list=miss_list, counters=counters, cpu_misses=cpu_misses, accumulate=True,
                stream=0, route_logits=LOGITS if routed else None, sync=sync,
                max_row_blocks=max_row_blocks)
    return dict(ids=ids, weights=weights, h=h, out=out, miss_list=miss_list, counters=counters)


@pytest.mark.parametrize("gu,dn,n_ff,cpu_misses,routed,x8", [
    ("Q4_K", "Q6_K", 512, False, True, True),    # the 30B mix: routed, 8-bit x, all in shared
    ("Q4_K", "Q6_K", 512, True, False, True),    # the missed expert left out of down's units
    ("Q4_K", "Q4_K", 256, False, False, False),  # float32 x (a batch's rows run alone)
    ("Q8_0", "Q8_0", 256, True, True, False),    # the tiny model's format
    ("IQ4_XS", "Q6_K", 256, False, False, False),  # tables (IQ4_XS's codebook) in shared
])
def test_fused_matches_two_launches_and_float64(gu, dn, n_ff, cpu_misses, routed, x8,
                                                 monkeypatch):
    """The first row block of each phase (whole grids take minutes in the simulator): h and
    out bit for bit those of the gate/up and down launches, the rows against float64, routing
    and the hit/miss bookkeeping done once."""
    import strata.cuda_kernels.moe as moe_mod
    monkeypatch.setattr(moe_mod, "GATE_UP_X8", x8)
    rng = np.random.default_rng(n_ff + len(gu + dn))
    n_embd, n_expert, layer = 256, 6, 1
    layout = ExpertLayout(n_embd, n_ff, gu, dn)
    gu_lf, dn_lf = _gate_up_lanes_for(layout), lane_format(get_format(dn).ggml_type)
    assert gu_lf.x8 == x8 and moe_fused.fuses(gu_lf, dn_lf)
    store, mats = _store(layout, gu, dn, rng)
    x = rng.standard_normal(n_embd).astype(np.float32)
    h0 = rng.standard_normal((K, n_ff)).astype(np.float32)  # what gate/up leaves is read too
    out0 = rng.standard_normal(n_embd).astype(np.float32)
    sync = np.zeros(2, np.int32)
    run = dict(cpu_misses=cpu_misses, routed=routed, max_row_blocks=1)
    fused = _run(layout, store, x, h0, out0, sync=sync, **run)
    two = _run(layout, store, x, h0, out0, sync=None, **run)
    for key in fused:
        np.testing.assert_array_equal(fused[key], two[key], err_msg=key)
    assert sync.tolist() == [0, 0]  # the simulator's phases never reach the barrier
    assert fused["counters"].tolist() == [[0, 0], [2, 1]]  # counted once, not per phase
    assert fused["miss_list"].tolist() == ([-1, 2, -1] if cpu_misses else [-1, -1, -1])
    np.testing.assert_array_equal(fused["ids"], IDS)

    n_h = LANE_WARPS  # one gate/up row pair per warp: the first block's h entries
    n_out = 2 * (LANE_WARPS >> lane_split(dn_lf, n_embd, K * (n_ff // dn_lf.sb_values)))
    x64, h = x_seen(x, x8), fused["h"]
    want = out0[:n_out].astype(np.float64)
    for kk, (e, w) in enumerate(zip(IDS, fused["weights"])):
        g, u, d = mats[layer * n_expert + e]
        missed = cpu_misses and e == 2
        gx, ux = g[:n_h] @ x64, u[:n_h] @ x64
        if not missed:
            want_h = gx / (1 + np.exp(-gx)) * ux
            assert np.linalg.norm(h[kk, :n_h] - want_h) / np.linalg.norm(want_h) < 1e-5
            want += w * (d[:n_out] @ h[kk].astype(np.float64))
        np.testing.assert_array_equal(h[kk, n_h:], h0[kk, n_h:])
    got = fused["out"]
    assert np.linalg.norm(got[:n_out] - want) / np.linalg.norm(want - out0[:n_out]) < 1e-5
    np.testing.assert_array_equal(got[n_out:], out0[n_out:])


@pytest.mark.parametrize("cpu_misses,routed,resident", [(False, True, 1 << 30),
                                                        (True, False, 1)])
def test_gate_up_with_x_between_the_rows_is_bit_for_bit(cpu_misses, routed, resident,
                                                        monkeypatch):
    """Gate/up on 8-bit x asking for x between each warp's first gate and up rows
    (`moe_fused.X_BETWEEN`, `moe_lanes.between_first_item`): h, out and the bookkeeping bit
    for bit the kernel's without, with a missed expert left to the CPU and with a grid of one
    block (each warp through several items)."""
    import strata.cuda_kernels.moe as moe_mod
    monkeypatch.setattr(moe_mod, "GATE_UP_X8", True)
    monkeypatch.setattr(moe_fused, "SIM_RESIDENT", resident)
    rng = np.random.default_rng(11)
    layout = ExpertLayout(256, 512, "Q4_K", "Q6_K")
    store, _ = _store(layout, "Q4_K", "Q6_K", rng)
    x = rng.standard_normal(256).astype(np.float32)
    h0 = rng.standard_normal((K, 512)).astype(np.float32)
    out0 = rng.standard_normal(256).astype(np.float32)
    run = dict(cpu_misses=cpu_misses, routed=routed, max_row_blocks=1 if resident > 1 else 2)
    got = {}
    for between in (False, True):
        monkeypatch.setattr(moe_fused, "X_BETWEEN", between)
        got[between] = _run(layout, store, x, h0, out0, sync=np.zeros(2, np.int32), **run)
        assert any(key[-1] == "between" for key in moe_fused._CACHE) or not between
    for key in got[True]:
        np.testing.assert_array_equal(got[True][key], got[False][key], err_msg=key)
    assert not np.array_equal(got[True]["h"][:, :LANE_WARPS], h0[:, :LANE_WARPS])


def test_fused_grid_smaller_than_the_row_blocks(monkeypatch):
    """A GPU that holds fewer blocks than down has row blocks (a small card): each block takes
    its row blocks in turn, its gate/up items likewise; the same bits as the two launches,
    which give every row block its own block."""
    monkeypatch.setattr(moe_fused, "SIM_RESIDENT", 1)
    rng = np.random.default_rng(5)
    layout = ExpertLayout(256, 256, "Q4_K", "Q6_K")
    store, _ = _store(layout, "Q4_K", "Q6_K", rng)
    x = rng.standard_normal(256).astype(np.float32)
    h0 = rng.standard_normal((K, 256)).astype(np.float32)
    out0 = rng.standard_normal(256).astype(np.float32)
    run = dict(cpu_misses=True, routed=False, max_row_blocks=2)
    fused = _run(layout, store, x, h0, out0, sync=np.zeros(2, np.int32), **run)
    two = _run(layout, store, x, h0, out0, sync=None, **run)
    for key in fused:
        np.testing.assert_array_equal(fused[key], two[key], err_msg=key)
    n_out = 2 * 2 * (LANE_WARPS >> lane_split(lane_format(get_format("Q6_K").ggml_type), 256,
                                              K * 1))
    assert not np.array_equal(fused["out"][:n_out], out0[:n_out])   # both row blocks written
    np.testing.assert_array_equal(fused["out"][n_out:], out0[n_out:])


def test_fused_with_every_expert_left_to_the_cpu():
    """No unit for down: its first loads read one expert's bytes unused, nothing is added."""
    rng = np.random.default_rng(9)
    layout = ExpertLayout(256, 256, "Q4_K", "Q6_K")
    store, _ = _store(layout, "Q4_K", "Q6_K", rng)
    out0 = rng.standard_normal(256).astype(np.float32)
    out, h = out0.copy(), np.full((2, 256), np.nan, np.float32)
    miss_list, counters = np.full(2, -9, np.int32), np.zeros((2, 2), np.int64)
    _moe_decode(rng.standard_normal(256).astype(np.float32), np.array([3, 1], np.int32),
                np.array([0.6, 0.4], np.float32), layer=1, layout=layout, **store, h=h, out=out,
                miss_list=miss_list, counters=counters, cpu_misses=True, accumulate=True,
                stream=0, sync=np.zeros(2, np.int32), max_row_blocks=1)
    np.testing.assert_array_equal(out, out0)
    np.testing.assert_array_equal(h[:, :LANE_WARPS], 0.0)
    assert miss_list.tolist() == [3, 1] and counters.tolist() == [[0, 0], [0, 2]]


def test_fused_pairs_and_their_checks():
    """Which pairs fuse (the bundle holds exactly these), and the launcher's argument check."""
    from gguf import GGMLQuantizationType as T

    from strata.cuda_kernels.lanes import LANE_FORMATS
    from strata.cuda_kernels.lanes_x8 import X8_FORMATS
    from strata.cuda_kernels.moe import moe_decode
    q4, q6, q8 = (LANE_FORMATS[int(t)] for t in (T.Q4_K, T.Q6_K, T.Q8_0))
    assert moe_fused.fuses(X8_FORMATS[int(T.Q4_K)], q6) and moe_fused.fuses(q8, q8)
    assert moe_fused.fuses(q8, q4) and not moe_fused.fuses(q4, q8)
    assert moe_fused.fits(q4, q6, 2048, 8, 768) and not moe_fused.fits(q4, q6, 2048, 8, 1536)
    layout = ExpertLayout(256, 256, "Q4_K", "Q6_K")
    store, _ = _store(layout, "Q4_K", "Q6_K", np.random.default_rng(3))
    z = np.zeros
    with pytest.raises(ValueError, match="sync"):
        moe_decode(z(256, np.float32), z(3, np.int32), z(3, np.float32), layer=1, layout=layout,
                   **store, h=z((3, 256), np.float32), out=z(256, np.float32),
                   miss_list=z(3, np.int32), counters=z((2, 2), np.int64),
                   sync=z(2, np.int64))


def test_a_refused_cooperative_launch_falls_back_to_two_launches(monkeypatch):
    """A driver that refuses the cooperative launch (the kernel's barrier needs one): a warning
    names why, that kernel is not tried again, and the MoE runs as the two launches, with their
    bits. The launch itself is a stand-in here (the simulator has no cooperative launches)."""
    class Refusing:
        cooperative, calls = False, 0

        def launch(self, *args):
            Refusing.calls += 1
            raise RuntimeError("CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE")

    rng = np.random.default_rng(11)
    layout = ExpertLayout(256, 256, "Q4_K", "Q6_K")
    moe_fused._kernel(_gate_up_lanes_for(layout), lane_format(get_format("Q6_K").ggml_type))
    monkeypatch.setattr(moe_fused, "SIMULATED", False)  # the kernel above: built for the simulator
    refusing = Refusing()  # one compiled kernel, as the dispatcher keeps it
    monkeypatch.setattr(moe_fused, "_resident", lambda kern, args, shmem: (264, refusing))
    monkeypatch.setattr(moe_fused, "_REFUSED", {})
    store, _ = _store(layout, "Q4_K", "Q6_K", rng)
    x = rng.standard_normal(256).astype(np.float32)
    h0 = rng.standard_normal((K, 256)).astype(np.float32)
    out0 = rng.standard_normal(256).astype(np.float32)
    run = dict(cpu_misses=False, routed=True, max_row_blocks=1)
    with pytest.warns(RuntimeWarning, match="COOPERATIVE_LAUNCH_TOO_LARGE"):
        refused = _run(layout, store, x, h0, out0, sync=np.zeros(2, np.int32), **run)
    again = _run(layout, store, x, h0, out0, sync=np.zeros(2, np.int32), **run)  # no warning
    two = _run(layout, store, x, h0, out0, sync=None, **run)
    assert Refusing.calls == 1 and len(moe_fused._REFUSED) == 1
    for key in two:
        np.testing.assert_array_equal(refused[key], two[key], err_msg=key)
        np.testing.assert_array_equal(again[key], two[key], err_msg=key)
