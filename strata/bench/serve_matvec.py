"""`python -m strata.bench.serve_matvec`: the small-batch matvecs on the shapes `strata serve
--batch N` runs, for 1, 2, 4 and 8 tokens — the one-token lane kernel at 1, then the lane batch
kernel (`lanes_batch`) and, where the format has one, the tensor-core kernel (`batch_tc`, what the
batched step launches): microseconds per call (CUDA
graph of 20 calls, after warm-up, random valid rows, weights rotated over enough copies that L2
does not serve them) and the weight bytes read per second against the HBM read ceiling.
One JSON object (date, commit, device, command) goes to --json."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone

import numpy as np

READ_CEILING_GBPS = 4542.0  # ld.global.nc.v4 over 4 GiB on the H200 (kernels bench)
SHAPES = (("Q4_K", 2048, 4096), ("Q4_K", 4096, 2048), ("Q6_K", 2048, 512),
          ("Q6_K", 2048, 151936))
CALLS = 20


def _time_us(fn, stream) -> float:
    from numba import cuda

    from strata.cuda_kernels.graph import capture
    fn(stream)
    stream.synchronize()
    g = capture(lambda st: [fn(st) for _ in range(CALLS)], stream)
    g.replay(stream)
    start, end = cuda.event(), cuda.event()
    start.record(stream)
    for _ in range(5):
        g.replay(stream)
    end.record(stream)
    end.synchronize()
    return 1e3 * cuda.event_elapsed_time(start, end) / (5 * CALLS)


def measure(tokens=(1, 2, 4, 8)) -> list[dict]:
    from numba import cuda

    from strata.cuda_kernels.batch_tc import matvec_tc, tc_fits
    from strata.cuda_kernels.lanes_batch import matvec_batch
    from strata.cuda_kernels.matvec import matvec
    from strata.quant.random_blocks import random_blocks
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

    rng = np.random.default_rng(0)
    stream = cuda.stream()
    rows = []
    for name, n_cols, n_rows in SHAPES:
        t = T[name]
        per = GGML_QUANT_SIZES[t][0]
        blocks = random_blocks(t, n_rows * n_cols // per, rng, scale=1.0).reshape(-1)
        n_copy = max(2, -(-200_000_000 // blocks.size))  # > L2 (50 MB) between two reads
        ws = [cuda.to_device(blocks) for _ in range(min(n_copy, 12))]
        for n in tokens:
            kernels = ["lane"] if n == 1 else ["lane_batch"] + (["tc"] if tc_fits(t, n_cols)
                                                                else [])
            for kernel in kernels:
                x = cuda.to_device(rng.standard_normal((n, n_cols)).astype(np.float32))
                y = cuda.device_array((n, n_rows), np.float32)
                i = [0]

                def call(st, x=x, y=y, ws=ws, i=i, t=t, kernel=kernel):
                    w = ws[i[0] % len(ws)]
                    i[0] += 1
                    if kernel == "lane":
                        matvec(w, int(t), x[0], y[0], stream=st)
                    elif kernel == "tc":
                        matvec_tc(w, int(t), x, y, stream=st)
                    else:
                        matvec_batch(w, int(t), x, y, stream=st)
                us = _time_us(call, stream)
                gbps = blocks.size / us / 1e3
                rows.append({"format": name, "shape": f"{n_cols}->{n_rows}", "tokens": n,
                             "kernel": kernel, "us": us, "weight_gbps": gbps,
                             "frac_of_read_ceiling": gbps / READ_CEILING_GBPS})
                print(f"{name} {n_cols}->{n_rows} x{n} {kernel:10s}: {us:8.2f} us {gbps:7.0f} "
                      f"GB/s ({gbps / READ_CEILING_GBPS:.2f})", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata.bench.serve_matvec", description=__doc__)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    from strata.bench.engine_cuda import _commit
    from strata.bench.serve_batch import _device_name
    out = {"bench": "serve_matvec", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "commit": _commit(), "device": _device_name(),
           "command": " ".join(["python -m strata.bench.serve_matvec"]
                               + (argv if argv is not None else sys.argv[1:])),
           "read_ceiling_gbps": READ_CEILING_GBPS, "results": measure()}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
