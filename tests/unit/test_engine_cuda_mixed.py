"""Expert layers whose gate and up differ in format (strata.engine.cuda.mixed), in numba's CUDA
simulator against a float64 reference built from gguf-py's dequantization: the decode kernels
(cache slot, mapped host, CPU-pool misses, hit counters) and the prompt path's unfused gate/up.
Tiny shapes (legacy 32-value blocks) keep the simulator fast."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from helpers.kernel_blocks import random_rows, reference
from numba import cuda

from strata.engine.cuda.mixed import (
    MixedLayout,
    check_prefill_room,
    gate_up_unfused,
    moe_decode_mixed,
)

D, FF, N_EXP = 64, 32, 3
TYPES = {"gate": T.Q4_0, "up": T.Q5_0, "down": T.Q8_0}


def _silu(v):
    return v / (1.0 + np.exp(-v))


def _experts(rng):
    """Blobs gate | up | down per expert, and their float64 matrices."""
    blobs, mats = [], []
    for _ in range(N_EXP):
        parts, dq = [], {}
        for name, (rows, cols) in (("gate", (FF, D)), ("up", (FF, D)), ("down", (D, FF))):
            raw = random_rows(TYPES[name], rows, cols, rng)
            parts.append(raw.reshape(-1))
            dq[name] = reference(TYPES[name], raw, cols)
        blobs.append(np.concatenate(parts))
        mats.append(dq)
        sizes = [p.size for p in parts]
    layout = MixedLayout(D, FF, int(TYPES["gate"]), int(TYPES["up"]), int(TYPES["down"]),
                         up_off=sizes[0], down_off=sizes[0] + sizes[1])
    return blobs, mats, layout


def _expert_out(dq, x):
    return dq["down"] @ (_silu(dq["gate"] @ x) * (dq["up"] @ x))


@pytest.mark.parametrize("cpu_misses,one_at_a_time", [
    (False, False), (True, False),
    (False, True),  # shared memory for one expert's h only: one down launch per expert, added
])
def test_decode_reads_slots_and_host_with_two_gate_up_formats(cpu_misses, one_at_a_time,
                                                               monkeypatch):
    if one_at_a_time:
        import strata.engine.cuda.mixed as mixed
        from strata.cuda_kernels.xstage import staged_bytes
        monkeypatch.setattr(mixed, "MAX_STAGED_BYTES", staged_bytes(FF // 32))
    rng = np.random.default_rng(3)
    blobs, mats, layout = _experts(rng)
    stride = -(-blobs[0].size // 256) * 256
    host = np.zeros(stride * N_EXP, np.uint8)
    for e, b in enumerate(blobs):
        host[e * stride:e * stride + b.size] = b
    cache = np.zeros(stride, np.uint8)
    cache[:blobs[1].size] = blobs[1]  # expert 1 cached in slot 0, the others on the host
    table = np.array([[-1, 0, -1]], np.int32)
    host_off = (np.arange(N_EXP, dtype=np.int64) * stride).reshape(1, N_EXP)
    x = (rng.standard_normal(D) / np.sqrt(D)).astype(np.float32)
    ids = np.array([2, 1], np.int32)
    w = np.array([0.7, 0.3], np.float32)
    out0 = rng.standard_normal(D).astype(np.float32)
    out = cuda.to_device(out0)
    counters = cuda.to_device(np.zeros((1, 2), np.int64))
    miss_list = cuda.to_device(np.full(2, 99, np.int32))
    moe_decode_mixed(cuda.to_device(x), cuda.to_device(ids), cuda.to_device(w), layer=0,
                     layout=layout, slot_table=cuda.to_device(table), cache=cuda.to_device(cache),
                     slot_off=cuda.to_device(np.zeros(1, np.int64)), host=cuda.to_device(host),
                     host_off=cuda.to_device(host_off),
                     h=cuda.to_device(np.full((2, FF), np.nan, np.float32)), out=out,
                     miss_list=miss_list, counters=counters, cpu_misses=cpu_misses)
    x64 = x.astype(np.float64)
    want = out0 + 0.3 * _expert_out(mats[1], x64)
    if not cpu_misses:
        want = want + 0.7 * _expert_out(mats[2], x64)
    got = out.copy_to_host()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
    np.testing.assert_array_equal(counters.copy_to_host(), [[1, 1]])
    np.testing.assert_array_equal(miss_list.copy_to_host(), [2 if cpu_misses else -1, -1])


def test_prompt_path_gate_up_unfused_matches_reference():
    from strata.cuda_kernels.matmul import QuantWeights
    from strata.cuda_kernels.matmul_tiles import TC_TILE
    from strata.cuda_kernels.route import allocate_routing, route_tokens

    rng = np.random.default_rng(4)
    blobs, mats, layout = _experts(rng)
    n_tok, k = 3, 2
    stride = -(-blobs[0].size // 256) * 256
    buf = np.zeros(stride * N_EXP, np.uint8)
    for e, b in enumerate(blobs):
        buf[e * stride:e * stride + b.size] = b
    base = np.arange(N_EXP, dtype=np.int64) * stride
    dbuf = cuda.to_device(buf)
    gate = QuantWeights(dbuf, cuda.to_device(base), layout.gate_type, FF, D)
    up = QuantWeights(dbuf, cuda.to_device(base + layout.up_off), layout.up_type, FF, D)
    ids = np.array([[0, 2], [1, 0], [2, 1]], np.int32)
    x = (rng.standard_normal((n_tok, D)) / np.sqrt(D)).astype(np.float16)
    routing = route_tokens(cuda.to_device(ids), allocate_routing(n_tok, k, N_EXP,
                                                                 tile_rows=TC_TILE.bm))
    h = cuda.to_device(np.full((n_tok * k, FF), np.nan, np.float16))
    scratch = cuda.to_device(np.zeros((n_tok * k, D), np.float32))
    gate_up_unfused(cuda.to_device(x), gate, up, routing, h, scratch)
    inv = routing.inv.copy_to_host()
    got = h.copy_to_host().astype(np.float64)
    x64 = x.astype(np.float64)
    r16 = lambda a: a.astype(np.float16).astype(np.float64)
    for t in range(n_tok):
        for s in range(k):
            dq = mats[ids[t, s]]
            want = _silu(x64[t] @ r16(dq["gate"]).T) * (x64[t] @ r16(dq["up"]).T)
            row = got[inv[t * k + s]]
            assert np.linalg.norm(row - want) / np.linalg.norm(want) < 3e-3


def test_prompt_scratch_needs_a_wide_enough_model():
    check_prefill_room(2048, 768)
    with pytest.raises(ValueError, match="n_embd >= 2 \\* n_ff"):
        check_prefill_room(1024, 768)
