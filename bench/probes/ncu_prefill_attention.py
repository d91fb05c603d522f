"""Probe (not part of the engine): the prompt path's causal attention (the GQA-shared kernel,
`attention_prefill_gqa`) at the 30B shape (32 query heads over 4 KV heads, head_dim 128, f16 KV)
for the last 4,096-token chunk of a 16K prompt (12,288 cached keys), launched a few times, for
Nsight Compute to read its counters (tensor and issue utilisation, stall reasons), e.g.
  ncu --clock-control none -k regex:kernel --launch-skip 3 --launch-count 1 \\
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \\
      --section SchedulerStats --section InstructionStats --section Occupancy \\
      --section LaunchStats --print-details all python bench/probes/ncu_prefill_attention.py
On its own it prints the kernel's time (CUDA events) and TFLOP/s, and checks the output is
finite. --start N --n-q N pick another chunk.
"""
import sys

import numpy as np
from numba import cuda

from strata.bench.kernels_attention import _kv_sides
from strata.cuda_kernels import attention_prefill, attention_prefill_gqa as gqa


def main() -> int:
    argv = sys.argv[1:]
    start = int(argv[argv.index("--start") + 1]) if "--start" in argv else 12288
    n_q = int(argv[argv.index("--n-q") + 1]) if "--n-q" in argv else 4096
    n_head, n_kv, hd = 32, 4, 128
    rng = np.random.default_rng(3)
    _, (k, v) = _kv_sides("f16", start + n_q, n_kv, hd, start + n_q, rng)
    q = cuda.to_device(rng.standard_normal((n_q, n_head, hd)).astype(np.float32))
    out = cuda.device_array((n_q, n_head, hd), np.float32)
    seq = cuda.to_device(np.array([start], np.int32))
    for _ in range(3):  # compile, warm up
        gqa.prefill_attention_gqa(q, k, v, seq, out)
    cuda.synchronize()
    t0, t1 = cuda.event(), cuda.event()
    t0.record()
    for _ in range(5):
        gqa.prefill_attention_gqa(q, k, v, seq, out)
    t1.record()
    t1.synchronize()
    ms = cuda.event_elapsed_time(t0, t1) / 5
    flops = attention_prefill.attention_flops(n_q, start, n_head, hd)
    o = out.copy_to_host()
    if not np.isfinite(o).all():
        print("non-finite output", file=sys.stderr)
        return 1
    print(f"gqa prefill attention, {n_q} queries over {start} cached keys: {ms:.3f} ms, "
          f"{flops / (ms * 1e9):.1f} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
