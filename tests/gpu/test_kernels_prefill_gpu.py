"""The prefill-side kernels on a real GPU at model sizes (Qwen3-30B-A3B shapes), against float64
references, on fresh random inputs with every output poisoned (NaN) before the run. Prints a table
(run with -s).

    STRATA_TEST_GPU=1 python -m pytest -s tests/gpu/test_kernels_prefill_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize
from numba import cuda

from helpers.kv_problem import attention_reference, decode_rows, encode_rows, filled_side

pytestmark = pytest.mark.gpu
ROWS: list[tuple[str, str, float, float]] = []
F32_TOL, TC_TOL = 1e-3, 1e-2
# sizes (a smoke run of this file's logic may shrink them)
MOE = dict(n_tok=4096, d=2048, ff=768, n_exp=128, k_top=8)
MOE_SMALL = dict(n_tok=256, d=512, ff=256, n_exp=16, k_top=4)
DENSE = dict(n_tok=4096, n_in=2048, n_out=4096, vocab=151936)
ATTN = dict(n_head=32, n_kv=4, hd=128, n_ctx=32768, chunk=4096, prefix=1024, chunk_small=512)
RING = dict(n_slots=3, n_blobs=12, blob_bytes=1 << 20)


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    print(f"\n{'kernel':<34} {'shape':<34} {'rel err':>10} {'tol':>8}")
    for name, shape, err, tol in ROWS:
        print(f"{name:<34} {shape:<34} {err:>10.2e} {tol:>8.0e} {'ok' if err < tol else 'FAIL'}")


@cuda.jit
def _slow_copy(buf, offset, n, out, i, repeat):
    """out[i] = buf[offset:offset+n], `repeat` times over: long enough for a racing copy to show."""
    for _ in range(repeat):
        for j in range(cuda.grid(1), n, cuda.gridsize(1)):
            out[i, j] = buf[offset + j]


def _poisoned(shape, dtype=np.float32):
    return cuda.to_device(np.full(shape, np.nan, dtype))


def _check(name, shape, got, want, tol):
    got = np.asarray(got, dtype=np.float64)
    assert np.isfinite(got).all(), f"{name}: unwritten or non-finite outputs"
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    ROWS.append((name, str(shape), err, tol))
    assert err < tol, f"{name} {shape}: relative error {err:.3e}"


def _moe_reference(inp, s, mats):
    """out [n_tok, d] float64 of the MoE chunk, expert by expert."""
    x = inp["x"].astype(np.float64)
    out = np.zeros((s["n_tok"], s["d"]))
    for e in range(s["n_exp"]):
        tok, slot = np.nonzero(inp["ids"] == e)
        if tok.size == 0:
            continue
        g, u, dn = (mats[k](e) for k in ("gate", "up", "down"))
        a = x[tok] @ g.T
        h = a / (1.0 + np.exp(-a)) * (x[tok] @ u.T)
        np.add.at(out, tok, inp["w"][tok, slot][:, None] * (h @ dn.T))
    return out


def _run_moe(inp, s, *, tensor_cores, gate_type=None, down_type=None, tile=None):
    from strata.cuda_kernels import matmul, route
    from strata.cuda_kernels.matmul_tiles import FMA_TILE, TC_TILE
    buf = cuda.to_device(inp["buf"])
    types = {"gate": gate_type or inp["type"], "up": gate_type or inp["type"],
             "down": down_type or inp["type"]}
    # None: each launch takes its format's default tile (tile_shapes.tc_tile), as the engine
    tile = tile or (None if tensor_cores else FMA_TILE)
    rows = (tile or TC_TILE).bm
    qw = {k: matmul.QuantWeights(buf, cuda.to_device(inp["base"][k]), int(types[k]),
                                 *((s["ff"], s["d"]) if k != "down" else (s["d"], s["ff"])))
          for k in ("gate", "up", "down")}
    routing = route.allocate_routing(s["n_tok"], s["k_top"], s["n_exp"], tile_rows=rows)
    route.route_tokens(cuda.to_device(inp["ids"]), routing)
    n_e = s["n_tok"] * s["k_top"]
    xdt = np.float16 if tensor_cores else np.float32
    h = _poisoned((n_e, s["ff"]), xdt)
    y = _poisoned((n_e, s["d"]))
    out = _poisoned((s["n_tok"], s["d"]))
    matmul.moe_gate_up(cuda.to_device(inp["x"].astype(xdt)), qw["gate"], qw["up"], routing, h,
                       tensor_cores=tensor_cores, tile=tile)
    matmul.moe_down(h, qw["down"], routing, y, tensor_cores=tensor_cores, tile=tile)
    route.combine(y, routing, cuda.to_device(inp["w"]), out)
    return out.copy_to_host()


def _dequantizer(inp, s, types):
    """name -> (expert -> float64 matrix), dequantized by gguf-py from the weight buffer."""
    from strata.quant.types import quant_type

    def get(name):
        rows, cols = (s["ff"], s["d"]) if name != "down" else (s["d"], s["ff"])
        n = quant_type(int(types[name])).row_bytes(cols) * rows
        return lambda e: np.asarray(dequantize(
            inp["buf"][inp["base"][name][e]:inp["base"][name][e] + n].reshape(rows, -1),
            T(int(types[name]))), np.float64)
    return {k: get(k) for k in ("gate", "up", "down")}


_FULL: dict = {}


def _full_problem():
    """One fresh random full-size chunk and its reference, shared by the tc and FMA checks."""
    if not _FULL:
        from strata.bench.kernels_prefill import moe_inputs
        inp = moe_inputs(np.random.default_rng(), ggml_type="Q4_K", **MOE)
        types = {k: inp["type"] for k in inp["base"]}
        _FULL.update(inp=inp, ref=_moe_reference(inp, MOE, _dequantizer(inp, MOE, types)))
    return _FULL["inp"], _FULL["ref"]


@pytest.mark.parametrize("tensor_cores,tile", [(True, None), (True, (64, 64, 2, 2, 2)),
                                               (True, (64, 128, 2, 2, 1)), (True, "small"),
                                               (False, None)],
                         ids=["tc", "tc-64x64k64", "tc-64x128", "tc-small", "fma"])
def test_moe_chunk_q4k_full_size(tensor_cores, tile):
    from strata.cuda_kernels.matmul_tiles import SMALL_TC_TILE, TcTile
    inp, ref = _full_problem()
    tile = SMALL_TC_TILE if tile == "small" else TcTile(*tile) if tile else None
    got = _run_moe(inp, MOE, tensor_cores=tensor_cores, tile=tile)
    _check(f"moe Q4_K {'tc' if tensor_cores else 'fma'} {tile or ''}"[:34],
           f"{MOE['n_tok']}x{MOE['d']}x"
           f"{MOE['ff']} e{MOE['n_exp']} k{MOE['k_top']}", got, ref,
           TC_TOL if tensor_cores else F32_TOL)


@pytest.mark.parametrize("name", ["Q8_0", "Q5_1", "Q5_K", "Q6_K", "Q3_K", "IQ2_XXS", "IQ3_S",
                                  "IQ4_XS", "MXFP4"])
def test_moe_chunk_formats_tc(name):
    """gate/up in each format (down Q8_0): the tile loader of every decoder family on the GPU."""
    from strata.bench.kernels_prefill import moe_inputs
    from strata.quant.random_blocks import random_blocks
    from strata.quant.types import quant_type
    s = MOE_SMALL
    rng = np.random.default_rng()
    inp = moe_inputs(rng, ggml_type="Q8_0", **s)  # routing, x, and a Q8_0 buffer for down
    gate_t = int(T[name])
    q = quant_type(gate_t)
    mat = q.row_bytes(s["d"]) * s["ff"]
    extra = random_blocks(gate_t, 2 * s["n_exp"] * mat // q.block_bytes, rng).reshape(-1)
    start = -(-inp["buf"].size // 256) * 256
    inp["buf"] = np.concatenate([inp["buf"], np.zeros(start - inp["buf"].size, np.uint8), extra])
    inp["base"]["gate"] = start + np.arange(s["n_exp"], dtype=np.int64) * 2 * mat
    inp["base"]["up"] = inp["base"]["gate"] + mat
    types = {"gate": gate_t, "up": gate_t, "down": int(T.Q8_0)}
    got = _run_moe(inp, s, tensor_cores=True, gate_type=gate_t, down_type=int(T.Q8_0))
    _check(f"moe gate/up {name} tc", f"{s['n_tok']}x{s['d']}x{s['ff']} e{s['n_exp']}", got,
           _moe_reference(inp, s, _dequantizer(inp, s, types)), TC_TOL)


def test_dense_projection_and_head():
    from strata.cuda_kernels import matmul
    from strata.quant.random_blocks import random_blocks
    rng = np.random.default_rng()
    n_tok, n_in = DENSE["n_tok"], DENSE["n_in"]
    for rows_out, n_rows in ((DENSE["n_out"], n_tok), (DENSE["vocab"], 1)):
        raw = random_blocks(T.Q8_0, rows_out * n_in // 32, rng).reshape(rows_out, -1)
        w = matmul.QuantWeights(cuda.to_device(raw.reshape(-1)),
                                cuda.to_device(np.zeros(1, np.int64)), int(T.Q8_0), rows_out, n_in)
        x = rng.standard_normal((n_rows, n_in)).astype(np.float32)
        out = _poisoned((n_rows, rows_out))
        matmul.dense_matmul(cuda.to_device(x), w, out)
        ref = x.astype(np.float64) @ np.asarray(dequantize(raw, T.Q8_0), np.float64).T
        _check("dense Q8_0 tc (f32 in)", f"{n_rows}x{n_in}->{rows_out}", out.copy_to_host(), ref,
               TC_TOL)


@pytest.mark.parametrize("fmt", ["f16", "int8", "q4_0"])
def test_kv_write(fmt):
    from strata.cuda_kernels import kvcache
    rng = np.random.default_rng()
    n_kv, hd, n_new, at = ATTN["n_kv"], ATTN["hd"], ATTN["chunk"], 100
    lay = kvcache.KvLayout(fmt, at + n_new, n_kv, hd)
    side = kvcache.allocate_kv_side(lay)
    x = rng.standard_normal((n_new, n_kv, hd)).astype(np.float32)
    kvcache.kv_write(cuda.to_device(x), side, cuda.to_device(np.array([at], np.int32)))
    data = side.data.copy_to_host().reshape(-1, lay.row_bytes)[at * n_kv:]
    scale = side.scale.copy_to_host()[at * n_kv:] if fmt == "int8" else None
    want_raw, _ = encode_rows(fmt, x.reshape(-1, hd))
    agree = float(np.mean(data == want_raw))
    ROWS.append((f"kv_write {fmt} (byte mismatch)", f"{n_new}x{n_kv}x{hd}", 1 - agree, 0.03))
    assert agree > (0.97 if fmt == "q4_0" else 0.999)  # f32 vs float64 rounding at ties
    got = decode_rows(fmt, data, scale, hd)
    bound = {"f16": 1e-3, "int8": 1e-2, "q4_0": 0.15}[fmt]
    _check(f"kv_write {fmt} round trip", f"{n_new}x{n_kv}x{hd}", got, x.reshape(-1, hd), bound)


@pytest.mark.parametrize("fmt,wide", [("f16", None), ("f16", False), ("int8", None),
                                      ("int8", False), ("q4_0", None)])
def test_decode_attention_32k(fmt, wide):
    """f16 and int8 run the tensor-core kernel by default (wide=None) and the generic one
    (False); q4_0 the generic one."""
    from strata.cuda_kernels import attention, kvcache
    rng = np.random.default_rng()
    a = ATTN
    lay = kvcache.KvLayout(fmt, a["n_ctx"], a["n_kv"], a["hd"])
    length = a["n_ctx"] - 7  # a partial last split; stale bytes past it
    k, kref = filled_side(lay, rng.standard_normal((length, a["n_kv"], a["hd"])), rng)
    v, vref = filled_side(lay, rng.standard_normal((length, a["n_kv"], a["hd"])), rng)
    q = rng.standard_normal((a["n_head"], a["hd"])).astype(np.float32)
    out = _poisoned(q.shape)
    parts = attention.allocate_partials(a["n_head"], a["hd"], a["n_ctx"], n_kv_head=a["n_kv"])
    attention.decode_attention(cuda.to_device(q), k, v, cuda.to_device(np.array([length - 1],
                                                                                np.int32)),
                               out, parts, wide=wide)
    ref = attention_reference(q[None], kref, vref, length - 1)[0]
    name = f"decode attention {fmt}" + (" generic" if wide is False else "")
    _check(name, f"L={length} h{a['n_head']}/{a['n_kv']}", out.copy_to_host(), ref, F32_TOL)


@pytest.mark.parametrize("fmt,start,n_q", [("f16", 0, ATTN["chunk"]),
                                           ("f16", ATTN["prefix"], ATTN["chunk_small"]),
                                           ("int8", ATTN["prefix"], ATTN["chunk_small"]),
                                           ("q4_0", ATTN["prefix"], ATTN["chunk_small"])])
def test_prefill_attention(fmt, start, n_q):
    from strata.cuda_kernels import attention_prefill, kvcache
    rng = np.random.default_rng()
    a = ATTN
    lay = kvcache.KvLayout(fmt, start + n_q + 64, a["n_kv"], a["hd"])
    k, kref = filled_side(lay, rng.standard_normal((start + n_q, a["n_kv"], a["hd"])), rng)
    v, vref = filled_side(lay, rng.standard_normal((start + n_q, a["n_kv"], a["hd"])), rng)
    q = rng.standard_normal((n_q, a["n_head"], a["hd"])).astype(np.float32)
    out = _poisoned(q.shape)
    attention_prefill.prefill_attention(cuda.to_device(q), k, v,
                                        cuda.to_device(np.array([start], np.int32)), out)
    _check(f"prefill attention {fmt} tc", f"start {start} n_q {n_q} h{a['n_head']}/{a['n_kv']}",
           out.copy_to_host(), attention_reference(q, kref, vref, start), TC_TOL)


def test_ring_orders_copies_and_compute():
    from strata.cuda_kernels.ring import ExpertRing
    rng = np.random.default_rng()
    r = RING
    blobs = [cuda.pinned_array(r["blob_bytes"], np.uint8) for _ in range(r["n_blobs"])]
    for b in blobs:
        b[:] = rng.integers(0, 256, b.size, dtype=np.uint8)
    ring = ExpertRing(cuda.device_array(r["n_slots"] * r["blob_bytes"], np.uint8),
                      r["blob_bytes"], cuda.stream())
    compute = cuda.stream()
    out = cuda.device_array((r["n_blobs"], r["blob_bytes"]), np.uint8)

    for i, b in enumerate(blobs):
        slot = ring.stage(b)
        ring.acquire(slot, compute)
        _slow_copy[64, 256, compute](ring.buf, slot.offset, slot.n_bytes, out, i, 20)
        ring.release(slot, compute)
    compute.synchronize()
    got = out.copy_to_host()
    bad = sum(int(not np.array_equal(got[i], blobs[i])) for i in range(r["n_blobs"]))
    ROWS.append(("ring stage/acquire/release", f"{r['n_blobs']} blobs, {r['n_slots']} slots",
                 float(bad), 0.5))
    assert bad == 0
