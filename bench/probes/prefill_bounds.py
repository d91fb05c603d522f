"""Probe (not part of the engine): the prefill GEMMs at one or two blocks an SM.

ptxas gave most tensor-core GEMM kernels 148-168 registers a thread unbounded (the tiles of
2026-12-02, padding MMAs skipped), which leaves one 256-thread block an SM; Q4_K's gate/up took
128 and kept two. Launch bounds of (256, 2) cap every kernel at 128, some with spills. Each row
times the grouped MoE GEMMs (30B expert shapes, 4,096 tokens, 8 of 128 experts) or a dense
projection both ways (the format's default tile with and without the bounds), after warm-up, on
random weights.

With --tiles, the grouped GEMMs at two blocks an SM with each split-loader setting instead:
one or two threads per weight row, padding tiles' MMAs skipped or issued (`TcTile.row_threads`,
`skip_pad`), which were chosen when the kernels ran unbounded.

Run from the repository root on a GPU machine:
`python bench/probes/prefill_bounds.py [--out F] [--tiles]` (prints a table, writes JSON).
"""
import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, ".")
from strata.bench.kernels_prefill import bench_dense, bench_moe  # noqa: E402
from strata.cuda_kernels.matmul_tiles import tc_tile  # noqa: E402
from strata.quant.types import quant_type  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="")
    p.add_argument("--formats", default="Q4_K,Q8_0,Q6_K,Q5_K")
    p.add_argument("--tiles", action="store_true",
                   help="row_threads x skip_pad at two blocks an SM")
    a = p.parse_args()
    rows = []
    for fmt in a.formats.split(",") if a.tiles else ():
        base = tc_tile(quant_type(fmt).ggml_type)
        for rt in (1, 2):
            for skip in (False, True):
                tile = dataclasses.replace(base, min_blocks=2, row_threads=rt, skip_pad=skip)
                r = bench_moe(ggml_type=fmt, tile=tile)
                rows.append(dict(r, kind="moe", format=fmt, min_blocks=2, row_threads=rt,
                                 skip_pad=skip))
                print(f"{fmt:6} moe rt{rt} {'skip' if skip else 'all '}  gate/up "
                      f"{r['gate_up_ms']:.3f} ms  down {r['down_ms']:.3f} ms  "
                      f"{r['tflops']:.1f} TFLOP/s", flush=True)
    for fmt in a.formats.split(",") if not a.tiles else ():
        base = tc_tile(quant_type(fmt).ggml_type)
        for mb in (0, 2):
            tile = dataclasses.replace(base, min_blocks=mb)
            r = bench_moe(ggml_type=fmt, tile=tile)
            rows.append(dict(r, kind="moe", format=fmt, min_blocks=mb))
            print(f"{fmt:6} moe   lb{mb}  gate/up {r['gate_up_ms']:.3f} ms "
                  f"({r['gate_up_kernel'].get('regs')} regs)  down {r['down_ms']:.3f} ms "
                  f"({r['down_kernel'].get('regs')} regs)  {r['tflops']:.1f} TFLOP/s", flush=True)
        if fmt in ("Q8_0", "Q6_K"):
            for mb in (0, 2):
                r = bench_dense(ggml_type=fmt, x_half=True,
                                tile=dataclasses.replace(base, min_blocks=mb))
                rows.append(dict(r, kind="dense", format=fmt, min_blocks=mb))
                print(f"{fmt:6} dense lb{mb}  {r['ms']:.3f} ms  {r['tflops']:.1f} TFLOP/s",
                      flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"commit": os.environ.get("STRATA_COMMIT", ""), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
