"""MoE decode (cache hits, mapped-host misses, CPU-pool misses) against float64 numpy."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import random_rows, reference
from strata.cuda_kernels.moe import ExpertLayout, moe_decode


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


@pytest.mark.parametrize("gu,dn,n_embd,n_ff,cpu_misses", [
    ("IQ4_XS", "Q8_0", 256, 32, False),
    ("Q8_0", "IQ4_NL", 64, 32, True),
])
def test_moe_decode(gu, dn, n_embd, n_ff, cpu_misses):
    rng = np.random.default_rng(n_embd + n_ff)
    n_layer, n_expert, layer = 2, 6, 1
    layout = ExpertLayout(n_embd, n_ff, gu, dn)
    blobs, mats = _experts(layout, gu, dn, n_layer * n_expert, rng)
    host = blobs.reshape(-1).copy()
    host_off = (np.arange(n_layer * n_expert, dtype=np.int64) * layout.expert_bytes).reshape(n_layer, n_expert)
    slot_table = np.full((n_layer, n_expert), -1, np.int32)
    slot_table[layer, 4], slot_table[layer, 0] = 1, 0   # experts 4 and 0 of layer 1 are cached
    gap = 48                                             # slots need not be packed
    slot_off = np.array([0, layout.expert_bytes + gap], np.int64)
    cache = np.zeros(2 * layout.expert_bytes + gap, np.uint8)
    cache[:layout.expert_bytes] = blobs[layer * n_expert + 0]
    cache[layout.expert_bytes + gap:] = blobs[layer * n_expert + 4]

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
    x64 = x.astype(np.float64)
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


def test_moe_refuses_h_larger_than_shared_memory():
    lay = ExpertLayout(256, 1024, "Q8_0", "Q8_0")
    k = 16  # 16 * 1024 staged values of h: 72 KiB > 48 KiB
    z = np.zeros
    with pytest.raises(ValueError, match="shared memory"):
        moe_decode(z(256, np.float32), z(k, np.int32), z(k, np.float32), layer=0, layout=lay,
                   slot_table=z((1, 16), np.int32), cache=z(16, np.uint8),
                   slot_off=z(1, np.int64), host=z(16, np.uint8), host_off=z((1, 16), np.int64),
                   h=z((k, 1024), np.float32), out=z(256, np.float32),
                   miss_list=z(k, np.int32), counters=z((1, 2), np.int64))
