"""Probe (not part of the engine): where the Q4_K grouped gate/up GEMM's time goes.

The gate/up GEMM of a 4,096-token chunk (30B-A3B expert shapes, 8 of 128 experts) runs at
~139 TFLOP/s, about 0.16 MMAs a cycle an SM where mma.sync can issue ~0.6. Each row below
rebuilds the kernel with one part of its work removed or made cheap and times it (CUDA events
after warm-up, same inputs):

* base / base, exact rows: the engine's kernel; random routing (~256 rows an expert, so ~20% of
  the 128-row tiles' rows are padding) or every expert given exactly 256 rows (no padding);
* B from L1: every weight row read from the same 1,152 bytes (the loads hit L1: no DRAM or L2
  latency behind the decode);
* B loads, no decode: the weight words stored into the B tile as they are (no f16x2 arithmetic);
* no B: neither loads nor decode (constant B tile);
* no MMA: the MMAs replaced by one dependent add (fragments still read by ldmatrix);
* no MMA, no B: only the activation copies (cp.async), the fragment reads and the barriers;
* 3 A stages: the activation tile a ring of three swizzled stages (`TcTile.a_stages`), copied
  two steps ahead instead of one; skip pad: the warps whose 16-row tiles are all past the
  expert's rows skip their fragment reads and MMAs; down: the down projection (K = 768).

`--only "NAME;NAME"` runs only those variants (one with `--reps 1`, for ncu: `-k regex:kernel --launch-skip 2
--launch-count 1`). Run with strata installed, on a GPU machine:
`python bench/probes/gemm_anatomy.py [--out F] [--only NAME]`.
"""
import argparse
import dataclasses
import json
import os
import sys

import numpy as np


from numba import cuda, float32, uint32  # noqa: E402

from strata.bench.kernels_prefill import MOE, moe_inputs, time_ms  # noqa: E402
from strata.cuda_kernels import matmul_tiles as mt  # noqa: E402
from strata.cuda_kernels import route  # noqa: E402
from strata.cuda_kernels.launch import as_u32  # noqa: E402
from strata.cuda_kernels.matmul_loads import q4k_loader  # noqa: E402
from strata.cuda_kernels.qformats import get_format  # noqa: E402
from strata.quant.types import quant_type  # noqa: E402

ONE2 = np.uint32(0x3C003C00)  # two halves of 1.0


def loader(kind):
    def make(parts):
        fetch, decode, n_raw = q4k_loader(parts)
        if kind == "base":
            return fetch, decode, n_raw

        @cuda.jit(device=True, inline="always")
        def fetch_l1(wbuf, boff, kt, raw, part):
            fetch(wbuf, 0, kt, raw, part)

        @cuda.jit(device=True, inline="always")
        def decode_raw(raw, kt, part, sB, dst):
            for t in range(8):
                sB[dst + 2 * t] = raw[4 + t] & uint32(0x3BFF3BFF)  # finite halves below 1
                sB[dst + 2 * t + 1] = (raw[4 + t] >> 1) & uint32(0x3BFF3BFF)

        @cuda.jit(device=True, inline="always")
        def fetch_none(wbuf, boff, kt, raw, part):
            raw[0] = uint32(kt)

        @cuda.jit(device=True, inline="always")
        def decode_const(raw, kt, part, sB, dst):
            for t in range(16):
                sB[dst + t] = ONE2

        return {"l1": (fetch_l1, decode, n_raw), "nodecode": (fetch, decode_raw, n_raw),
                "none": (fetch_none, decode_const, n_raw)}[kind]
    return make


@cuda.jit(device=True, inline="always")
def fake_mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """One dependent add per accumulator: keeps the fragment reads live without tensor work."""
    return (c0 + float32(a0 & 1), c1 + float32(b0 & 1), c2 + float32(a2 & 1),
            c3 + float32(b1 & 1))


VARIANTS = {  # name: (loader kind, real MMAs, routing, activation stages, GEMM)
    "base": ("base", True, "random", 2, "gate_up"),
    "base, exact rows": ("base", True, "exact", 2, "gate_up"),
    "B from L1": ("l1", True, "random", 2, "gate_up"),
    "B loads, no decode": ("nodecode", True, "random", 2, "gate_up"),
    "no B": ("none", True, "random", 2, "gate_up"),
    "no MMA": ("base", False, "random", 2, "gate_up"),
    "no MMA, no B": ("none", False, "random", 2, "gate_up"),
    "3 A stages": ("base", True, "random", 3, "gate_up"),
    "3 A stages, exact rows": ("base", True, "exact", 3, "gate_up"),
    "3 A stages, no MMA, no B": ("none", False, "random", 3, "gate_up"),
    "skip pad": ("base", True, "random", 2, "gate_up"),
    "down": ("base", True, "random", 2, "down"),
    "down, 3 A stages": ("base", True, "random", 3, "down"),
}


def build(kind, tile, *, swiglu):
    q4k = int(quant_type("Q4_K").ggml_type)
    return mt.tc_kernel(get_format(q4k).dq32, tile=tile, x_half=True, grouped=True,
                        gather=swiglu, swiglu=swiglu, out_half=swiglu, loader=loader(kind))


# STRATA_PROBE_SMALL=1: a tiny shape, for checking the probe itself under the simulator
SHAPE = dict(n_tok=32, d=256, ff=256, n_exp=8) if os.environ.get("STRATA_PROBE_SMALL") else {}


def run(name, reps):
    kind, real_mma, routing_kind, stages, gemm = VARIANTS[name]
    s = dict(MOE, **SHAPE)
    tile = dataclasses.replace(mt.tc_tile(quant_type("Q4_K").ggml_type), a_stages=stages,
                               skip_pad=name == "skip pad")
    inp = moe_inputs(np.random.default_rng(0), ggml_type="Q4_K", **s)
    if routing_kind == "exact":  # token t's k-th expert (8t + k) % 128: 256 rows an expert
        t = np.arange(s["n_tok"])[:, None] * s["k_top"] + np.arange(s["k_top"])[None, :]
        inp["ids"] = (t % s["n_exp"]).astype(np.int32)
    q = quant_type("Q4_K")
    buf = cuda.to_device(inp["buf"])
    gate, up = cuda.to_device(inp["base"]["gate"]), cuda.to_device(inp["base"]["up"])
    routing = route.allocate_routing(s["n_tok"], s["k_top"], s["n_exp"], tile_rows=tile.bm)
    route.route_tokens(cuda.to_device(inp["ids"]), routing)
    n_e = s["n_tok"] * s["k_top"]
    x = cuda.to_device(inp["x"].astype(np.float16))        # [n_tok, d] f16
    h = cuda.to_device((np.random.default_rng(1).standard_normal((n_e, s["ff"])) * 0.5)
                       .astype(np.float16))                # [n_entries, ff] f16
    y = cuda.device_array((n_e, s["d"]), np.float32)       # [n_entries, d] f32
    saved = mt.mma_16816
    if not real_mma:
        mt.mma_16816 = fake_mma
    gu = gemm == "gate_up"
    kernel = build(kind, tile, swiglu=gu)
    sched = (routing.offsets, routing.perm, routing.k_top, routing.tile_group, routing.tile_m0,
             routing.n_tiles, n_e)
    if gu:
        grid = (mt.n_col_blocks(s["ff"], tile.bn, True), routing.max_tiles)
        args = (as_u32(x), buf, gate, up, q.row_bytes(s["d"]), s["ff"], s["d"], *sched,
                as_u32(h))
    else:
        down = cuda.to_device(inp["base"]["down"])
        grid = (mt.n_col_blocks(s["d"], tile.bn, False), routing.max_tiles)
        args = (as_u32(h), buf, down, down, q.row_bytes(s["ff"]), s["d"], s["ff"], *sched, y)
    try:
        kernel[grid, tile.threads](*args)  # compiles with the patched names
        cuda.synchronize()
    finally:
        mt.mma_16816 = saved
    n_tiles = int(routing.n_tiles.copy_to_host()[0])
    ms = time_ms(lambda: kernel[grid, tile.threads](*args), reps=reps)
    regs = max(kernel.get_regs_per_thread().values())
    flops = (2 if gu else 1) * 2 * n_e * s["d"] * s["ff"]
    return {"name": name, "ms": ms, "tflops": flops / (ms * 1e9), "row_tiles": n_tiles,
            "regs": regs, "local_bytes": max(kernel.get_local_mem_per_thread().values())}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="")
    p.add_argument("--only", default="", help="variant names, separated by ;")
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    names = a.only.split(";") if a.only else list(VARIANTS)
    rows = [run(n, a.reps) for n in names]
    print(f"{'variant':22s} {'ms':>7s} {'TFLOP/s':>8s} {'row tiles':>9s} {'regs':>5s} {'local':>5s}")
    for r in rows:
        print(f"{r['name']:22s} {r['ms']:7.3f} {r['tflops']:8.1f} {r['row_tiles']:9d} "
              f"{r['regs']:5d} {r['local_bytes']:5d}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"date": os.environ.get("STRATA_DATE", ""), "commit":
                       os.environ.get("STRATA_COMMIT", ""),
                       "device": cuda.get_current_device().name.decode()
                       if isinstance(cuda.get_current_device().name, bytes)
                       else cuda.get_current_device().name,
                       "command": "python bench/probes/gemm_anatomy.py " + " ".join(sys.argv[1:]),
                       "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
