"""Probe (not part of the engine): decode attention at the 30B shape (32 query heads over 4 KV
heads, head_dim 128, f16 KV) over 32K live keys, launched a few times without a graph, for Nsight
Compute (ncu) to read the pass-1 kernel's and the combine's hardware counters (DRAM throughput,
stall reasons, occupancy). Run with strata installed, on a GPU machine, e.g.
  ncu --clock-control none -k regex:"kernel|combine" --launch-skip 4 --launch-count 2 \\
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \\
      --section WarpStateStats --section SchedulerStats --print-details all \\
      python bench/probes/ncu_attention.py [--fmt int8] [--max-split 512]
(numba names the pass-1 kernel `kernel`, the combine `_combine`; the first two rounds are
compiles and warm-up). On its own it checks the output is finite.
"""
import math
import sys

import numpy as np
from numba import cuda

from strata.bench.kernels_attention import _kv_sides
from strata.cuda_kernels import attention


def main() -> int:
    argv = sys.argv[1:]
    fmt = argv[argv.index("--fmt") + 1] if "--fmt" in argv else "f16"
    max_split = int(argv[argv.index("--max-split") + 1]) if "--max-split" in argv else 256
    n_ctx, n_kv, n_head, hd = 32768, 4, 32, 128
    rng = np.random.default_rng(2)
    _, (k, v) = _kv_sides(fmt, n_ctx, n_kv, hd, n_ctx, rng)
    q = cuda.to_device(rng.standard_normal((n_head, hd)).astype(np.float32))  # [n_head, hd]
    out = cuda.device_array((n_head, hd), np.float32)
    parts = attention.allocate_partials(n_head, hd, n_ctx, n_kv_head=n_kv, max_split=max_split)
    seq = cuda.to_device(np.array([n_ctx - 1], np.int32))
    for _ in range(4):
        attention.decode_attention(q, k, v, seq, out, parts, n_new=1, max_split=max_split)
    cuda.synchronize()
    o = out.copy_to_host()
    if not np.isfinite(o).all():
        print("non-finite output", file=sys.stderr)
        return 1
    print(f"{fmt}: out[0, :4] = {o[0, :4]}, scale {1 / math.sqrt(hd):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
