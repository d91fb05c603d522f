"""Benchmarks of the prefill-side kernels against measured ceilings, on random (never zero) data.

    python -m strata.bench.kernels_prefill [--quick] [--json PATH]

* grouped MoE matmul at the 30B expert shapes (d 2048, ff 768, 128 experts, top-8), a 4096-token
  chunk, Q4_K: tensor cores and the FMA fallback, TFLOP/s of the three expert GEMMs;
* dense chunk projection (4096 x 2048 -> 4096, Q8_0), tensor cores;
* decode attention at 32K context, f16 / int8 / q4_0 KV (32 query heads, 4 KV heads, d 128):
  GB/s of cache read, against the measured read bandwidth (one kernel pair, timed as a CUDA graph
  replay when the driver bindings allow, so Python launch cost is not counted); f16 also at 600
  and 4096 live keys of a 4K cache over 48 layers, with the split following the length and with
  the fixed 256-key split ("_fixed");
* causal prefill attention of a 4096-token chunk (f16 and int8 KV) and a 16384-token one (f16),
  the base kernel and the GQA-shared variant ("_gqa", with knob variations): TFLOP/s of the
  unmasked work.
Ceilings: device-to-device copy (read + write bytes), a streaming read kernel, and a dense f16
matrix product through torch where torch is present. `ENTRIES` lists the benchmarks for the
shared runner (strata.bench.kernels).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import sys
import time

import numpy as np

from .kernels_attention import ENTRIES as ATTENTION_ENTRIES
from .timing import cuda_module, resources, time_ms

MOE = dict(n_tok=4096, d=2048, ff=768, n_exp=128, k_top=8)


def ceilings() -> dict:
    """Measured device ceilings: copy GB/s (read + write), streaming read GB/s, f16 TFLOP/s."""
    cuda = cuda_module()
    n = 1 << 30  # 4 GiB of u32
    src = cuda.device_array(n, np.uint32)
    dst = cuda.device_array(n, np.uint32)
    _fill_random_u32(src)
    ms = time_ms(lambda: dst.copy_to_device(src), reps=10)
    copy = 2 * 4 * n / ms / 1e6
    part = cuda.device_array(132 * 8 * 256, np.uint32)
    ms_r = time_ms(lambda: _read_kernel()[132 * 8, 256](src, part), reps=10)
    read = 4 * n / ms_r / 1e6
    out = {"copy_gbps": copy, "read_gbps": read, "f16_tflops": None}
    try:
        import torch
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        out["f16_tflops"] = 2 * 8192 ** 3 * 10 / (time.perf_counter() - t0) / 1e12
    except Exception as e:
        print(f"  (no torch f16 GEMM ceiling: {type(e).__name__})")
    return out


_KERNELS: dict = {}


def _read_kernel():
    if "read" not in _KERNELS:
        cuda = cuda_module()

        @cuda.jit
        def read(src, out):  # four independent sums: several loads in flight per thread
            i, stride = cuda.grid(1), cuda.gridsize(1)
            a = b = c = d = np.uint32(0)
            n4 = src.shape[0] // 4
            for j in range(i, n4, stride):
                a ^= src[j]
                b ^= src[j + n4]
                c ^= src[j + 2 * n4]
                d ^= src[j + 3 * n4]
            out[i] = a ^ b ^ c ^ d
        _KERNELS["read"] = read
    return _KERNELS["read"]


def _fill_random_u32(a, seed: int = 1):
    """Random device contents without a host round trip of the whole array."""
    cuda = cuda_module()
    if "fill" not in _KERNELS:
        @cuda.jit
        def fill(a, seed):
            i, stride = cuda.grid(1), cuda.gridsize(1)
            for j in range(i, a.shape[0], stride):
                x = np.uint32(j) * np.uint32(2654435761) + np.uint32(seed)
                x ^= x >> np.uint32(15)
                a[j] = x * np.uint32(2246822519)
        _KERNELS["fill"] = fill
    _KERNELS["fill"][1024, 256](a, seed)


def moe_inputs(rng, *, ggml_type="Q4_K", n_tok, d, ff, n_exp, k_top):
    """Host arrays of a random MoE chunk: weights (gate|up|down per expert in one buffer), base
    offsets, activations, routing. Returns a dict."""
    from strata.quant.random_blocks import random_blocks
    from strata.quant.types import quant_type
    q = quant_type(ggml_type)
    mat_bytes = {"gate": q.row_bytes(d) * ff, "up": q.row_bytes(d) * ff, "down": q.row_bytes(ff) * d}
    expert_bytes = sum(mat_bytes.values())
    n_blocks = n_exp * expert_bytes // q.block_bytes
    buf = random_blocks(q.ggml_type, n_blocks, rng).reshape(-1)  # [n_exp * expert_bytes] u8
    base, off = {}, 0
    for name, nb in mat_bytes.items():
        base[name] = (np.arange(n_exp, dtype=np.int64) * expert_bytes + off)
        off += nb
    ids = np.argsort(rng.random((n_tok, n_exp)), axis=1)[:, :k_top].astype(np.int32)
    w = rng.random((n_tok, k_top)).astype(np.float32)
    w /= w.sum(axis=1, keepdims=True)
    x = (rng.standard_normal((n_tok, d)) * 0.5).astype(np.float32)
    return dict(buf=buf, base=base, ids=ids, w=w, x=x, type=q.ggml_type)


def bench_moe(*, tensor_cores: bool = True, ggml_type: str = "Q4_K", quick=False, tile=None,
              split_loader: bool = True, **shape) -> dict:
    """Grouped expert GEMMs of one chunk (gate/up + SwiGLU, down), TFLOP/s. split_loader=False:
    the tensor-core kernels decode through the format's dq32 even where it has a split loader
    (`matmul_loads`), for an A/B in one process."""
    import contextlib

    from strata.cuda_kernels import matmul, matmul_loads
    from strata.cuda_kernels.qformats import get_format
    with contextlib.ExitStack() as undo:
        if not split_loader:
            t = int(get_format(ggml_type).ggml_type)
            saved = matmul_loads.LOADERS.pop(t, None)
            matmul._tc.cache_clear()  # kernels made with the loader: made again without
            undo.callback(matmul._tc.cache_clear)
            if saved is not None:
                undo.callback(matmul_loads.LOADERS.__setitem__, t, saved)
        res = _bench_moe(tensor_cores=tensor_cores, ggml_type=ggml_type, quick=quick, tile=tile,
                         **shape)
    if not split_loader:
        res["name"] += "_dq32"
    return res


def _bench_moe(*, tensor_cores, ggml_type, quick, tile, **shape) -> dict:
    from strata.cuda_kernels import matmul, route
    from strata.cuda_kernels.matmul_tiles import FMA_TILE, tc_tile
    cuda = cuda_module()
    s = dict(MOE, **shape)
    inp = moe_inputs(np.random.default_rng(0), ggml_type=ggml_type, **s)
    tile = tile or (tc_tile(inp["type"]) if tensor_cores else FMA_TILE)
    buf = cuda.to_device(inp["buf"])
    qw = {k: matmul.QuantWeights(buf, cuda.to_device(v), inp["type"],
                                 *((s["ff"], s["d"]) if k != "down" else (s["d"], s["ff"])))
          for k, v in inp["base"].items()}
    routing = route.allocate_routing(s["n_tok"], s["k_top"], s["n_exp"], tile_rows=tile.bm)
    ids = cuda.to_device(inp["ids"])
    route.route_tokens(ids, routing)
    n_e = s["n_tok"] * s["k_top"]
    xdt = np.float16 if tensor_cores else np.float32
    x = cuda.to_device(inp["x"].astype(xdt))
    h = cuda.device_array((n_e, s["ff"]), xdt)
    y = cuda.device_array((n_e, s["d"]), np.float32)
    out = cuda.device_array((s["n_tok"], s["d"]), np.float32)
    wts = cuda.to_device(inp["w"])
    reps = 3 if quick else 10
    t_gu = time_ms(lambda: matmul.moe_gate_up(x, qw["gate"], qw["up"], routing, h,
                                              tensor_cores=tensor_cores, tile=tile), reps=reps)
    t_dn = time_ms(lambda: matmul.moe_down(h, qw["down"], routing, y, tensor_cores=tensor_cores,
                                           tile=tile), reps=reps)
    kern = (matmul._tc(inp["type"], tile, True, True, True, True, True) if tensor_cores
            else matmul._fma(inp["type"], tile, True, True, True))
    kern_dn = (matmul._tc(inp["type"], tile, True, True, False, False, False) if tensor_cores
               else matmul._fma(inp["type"], tile, True, False, False))
    t_rt = time_ms(lambda: route.route_tokens(ids, routing), reps=reps)
    t_cb = time_ms(lambda: route.combine(y, routing, wts, out), reps=reps)
    flops = 3 * 2 * n_e * s["d"] * s["ff"]
    label = f"{tile.bm}x{tile.bn}" + (f"k{tile.k_step}" if tensor_cores else "")
    if tensor_cores:  # the session-2 kernel's loads lacked both
        label += (f"w{tile.warps_m}x{tile.warps_n}" + ("" if tile.ldsm else "_noldsm")
                  + ("" if tile.pipe else "_nopipe")
                  + (f"_lb{tile.min_blocks}" if tile.min_blocks else "")
                  + f"_rt{tile.row_threads}" + ("_skip" if tile.skip_pad else "")
                  + f"_a{tile.a_stages}")
    return {"name": f"moe_{ggml_type}_{'tc' if tensor_cores else 'fma'}_{label}", **s,
            "gate_up_kernel": resources(kern), "down_kernel": resources(kern_dn),
            "gate_up_ms": t_gu, "down_ms": t_dn, "route_ms": t_rt, "combine_ms": t_cb,
            "tflops": flops / ((t_gu + t_dn) * 1e9),
            "weight_gb": inp["buf"].nbytes / 1e9}


def bench_dense(*, n_tok=4096, n_in=2048, n_out=4096, ggml_type="Q8_0", x_half=False,
                quick=False, tile=None) -> dict:
    from strata.cuda_kernels import matmul
    from strata.quant.random_blocks import random_blocks
    from strata.quant.types import quant_type
    cuda = cuda_module()
    q = quant_type(ggml_type)
    rng = np.random.default_rng(1)
    raw = random_blocks(q.ggml_type, n_out * q.row_bytes(n_in) // q.block_bytes, rng).reshape(-1)
    w = matmul.QuantWeights(cuda.to_device(raw), cuda.to_device(np.zeros(1, np.int64)),
                            q.ggml_type, n_out, n_in)
    x = cuda.to_device(rng.standard_normal((n_tok, n_in)).astype(
        np.float16 if x_half else np.float32))
    out = cuda.device_array((n_tok, n_out), np.float32)
    t = time_ms(lambda: matmul.dense_matmul(x, w, out, tile=tile), reps=3 if quick else 10)
    lb = f"_lb{tile.min_blocks}" if tile is not None and tile.min_blocks else ""
    return {"name": f"dense_{ggml_type}_tc" + ("_f16in" if x_half else "") + lb, "n_tok": n_tok,
            "n_in": n_in, "n_out": n_out,
            "ms": t, "tflops": 2 * n_tok * n_in * n_out / (t * 1e9)}


def _moe_loader(quick, *, ggml_type, split_loader):
    return bench_moe(tensor_cores=True, ggml_type=ggml_type, quick=quick,
                     split_loader=split_loader)


def _moe_tile(quick, *, ggml_type, **flags):
    from dataclasses import replace

    from strata.cuda_kernels.matmul_tiles import TC_TILE
    return bench_moe(tensor_cores=True, ggml_type=ggml_type, quick=quick,
                     tile=replace(TC_TILE, **flags))


def _tc_tile(bm, bn, wm, wn, kch=1, **flags):
    from strata.cuda_kernels.matmul_tiles import TcTile
    return TcTile(bm, bn, wm, wn, kch, **flags)


ENTRIES = {
    "moe_q4k_tc": lambda quick: bench_moe(tensor_cores=True, quick=quick),
    "moe_q4k_tc_v3": lambda quick: bench_moe(tensor_cores=True, quick=quick,
                                             tile=_tc_tile(128, 128, 2, 4, ldsm=False,
                                                           pipe=False)),
    "moe_q4k_tc_nopipe": lambda quick: bench_moe(tensor_cores=True, quick=quick,
                                                 tile=_tc_tile(128, 128, 2, 4, pipe=False)),
    # the default tile without its launch bounds (one block an SM where ptxas takes > 128 regs)
    "moe_q4k_tc_lb0": lambda quick: _moe_tile(quick, ggml_type="Q4_K", row_threads=1,
                                              skip_pad=False, min_blocks=0),
    # the per-format settings (tile_shapes.FORMAT_TILE) against the other choices
    **{f"moe_{fmt.lower()}_tc_rt{rt}{'_skip' if skip else ''}": functools.partial(
        _moe_tile, ggml_type=fmt, row_threads=rt, skip_pad=skip)
       for fmt in ("Q4_K", "Q8_0") for rt in (1, 2) for skip in (False, True)},
    # two activation stages (the default tile has three: TcTile.a_stages) in each split-loader
    # format
    **{f"moe_{fmt.lower()}_tc_a2": functools.partial(
        _moe_tile, ggml_type=fmt, a_stages=2,
        **({"row_threads": 1} if fmt == "Q4_K" else {}))
       for fmt in ("Q4_K", "Q8_0", "Q6_K")},
    "moe_q8_0_tc": lambda quick: bench_moe(tensor_cores=True, ggml_type="Q8_0", quick=quick),
    "moe_q6_k_tc": lambda quick: bench_moe(tensor_cores=True, ggml_type="Q6_K", quick=quick),
    # IQ4_XS and Q5_K through their split loaders and through dq32 (before the loaders)
    **{f"moe_{t.lower()}_tc{tag}": functools.partial(_moe_loader, ggml_type=t,
                                                     split_loader=not tag)
       for t in ("IQ4_XS", "Q5_K") for tag in ("", "_dq32")},
    "moe_q4k_tc_64x128": lambda quick: bench_moe(tensor_cores=True, quick=quick,
                                                 tile=_tc_tile(64, 128, 2, 2)),
    "moe_q4k_tc_64x64k64": lambda quick: bench_moe(tensor_cores=True, quick=quick,
                                                   tile=_tc_tile(64, 64, 2, 2, 2)),
    "moe_q4k_fma": lambda quick: bench_moe(tensor_cores=False, quick=quick),
    "dense_q8_0_tc": lambda quick: bench_dense(quick=quick),
    "dense_q8_0_tc_f16in": lambda quick: bench_dense(x_half=True, quick=quick),
    **ATTENTION_ENTRIES,
}


def _table(ceil: dict, rows: list[dict]) -> str:
    lines = [f"ceilings: copy {ceil['copy_gbps']:.0f} GB/s (r+w), read {ceil['read_gbps']:.0f} "
             f"GB/s, f16 GEMM {ceil['f16_tflops'] or float('nan'):.0f} TFLOP/s (torch)",
             f"{'benchmark':<26} {'time ms':>9} {'achieved':>16} {'of ceiling':>11}  target"]
    read = max(ceil["read_gbps"], ceil["copy_gbps"] / 2)
    for r in rows:
        if "gbps" in r:
            lines.append(f"{r['name']:<26} {r['ms']:>9.4f} {r['gbps']:>10.0f} GB/s "
                         f"{r['gbps'] / read:>10.0%}  >=60% read ({r['timing']}); "
                         f"{r['of_read']:.0%} of a read of the same bytes")
        else:
            ms = r.get("ms", r.get("gate_up_ms", 0) + r.get("down_ms", 0))
            ref = ceil["f16_tflops"] or math.nan
            target = {"moe": ">=150 TFLOP/s", "pre": ">=50 TFLOP/s"}.get(r["name"][:3], "")
            lines.append(f"{r['name']:<26} {ms:>9.3f} {r['tflops']:>8.1f} TFLOP/s "
                         f"{r['tflops'] / ref:>10.1%}  {target}")
    return "\n".join(lines)


def _write_json(path: str, *, commit, dev, argv, ceil: dict, rows: list[dict]) -> None:
    if commit is None:
        from .engine_cuda import _commit  # STRATA_COMMIT first: a device copy has no .git
        commit = _commit()
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "commit": commit, "device": dev.name.decode() if isinstance(dev.name, bytes)
           else str(dev.name), "command": " ".join(["python -m strata.bench.kernels_prefill"]
                                                   + (argv if argv is not None else sys.argv[1:])),
           "ceilings": ceil, "results": rows}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--json", help="write the results here (rewritten after every benchmark)")
    p.add_argument("-k", dest="only", help="run entries whose name contains this (several: "
                   "comma-separated, or an exact name with a trailing '$')")
    p.add_argument("--commit", help="commit id to record (default: git rev-parse HEAD)")
    a = p.parse_args(argv)
    cuda = cuda_module()
    dev = cuda.get_current_device()
    ceil = ceilings()
    rows = []
    for name, fn in ENTRIES.items():
        if a.only and not any(name == k[:-1] if k.endswith("$") else k in name
                               for k in a.only.split(",")):
            continue
        t0 = time.perf_counter()
        rows.append(fn(a.quick))
        print(f"  {name}: {time.perf_counter() - t0:.1f} s (compile + setup + timing)", flush=True)
        if a.json:  # a run cut short still leaves what it measured
            _write_json(a.json, commit=a.commit, dev=dev, argv=argv, ceil=ceil, rows=rows)
    print(_table(ceil, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
