"""Probe (not part of the engine): the latency-bound decode kernels of one 30B-A3B layer, each
launched a few times without a graph, for Nsight Compute (ncu) to read their hardware counters:
MoE (routing the logits itself, 8-bit x, Q4_K/Q6_K, 8 of 128 experts, all cached) as the
engine launches it, one kernel (`moe_fused`: gate/up, a barrier across the grid, down), or with
`--two` as the gate/up and down kernels; and the lane matvec of attn_output (Q4_K, 2048 rows of
4096).

Run with strata installed, on a GPU machine, under ncu with the clocks left alone, e.g.
  ncu --clock-control none -k regex:"moe|matvec" --launch-skip 6 --launch-count 3 \\
      --section SpeedOfLight --section Occupancy --section WarpStateStats \\
      --section SchedulerStats --section SourceCounters --print-details all \\
      python bench/probes/ncu_layer.py
(the first two rounds are compiles and warm-up: six launches with `--two`, three a round; four
without, two a round: `--launch-skip 4 --launch-count 2`). On its own it prints the routed ids
and checks the outputs are finite. What it found on the H200 (2026-12-02, `--two`): all three
kernels at 25% theoretical occupancy (two 256-thread blocks an SM, by registers), 0.43
instructions issued a cycle per scheduler, stalls led by fixed-latency waits, long scoreboard
and the block barrier (`2026-12-02_moe_gate_up_occupancy_tried.json`); per SASS instruction,
the down kernel spent 58% of its stall samples before its unit loop (staging h, resolving the
slots, the first weight loads) and 463 instructions a loop pass for 64 weights a lane
(`2026-12-02_ncu_moe_down_sass.json`).
"""
import sys

import numpy as np

from strata.bench.kernels import Ctx, moe_setup, random_weights
from strata.cuda_kernels import matvec as mv
from strata.cuda_kernels.moe import moe_decode


def main() -> int:
    two = "--two" in sys.argv[1:]  # gate/up and down as two launches (moe_fused.FUSE_DOWN off)
    ctx = Ctx(seed=1)
    cuda, k, n_expert = ctx.cuda, 8, 128
    lay, cache, slot_table, slot_off, host_off = moe_setup(ctx, "Q4_K", "Q6_K", n_layer=1,
                                                           n_expert=n_expert, n_slot_layer=16)
    x = ctx.upload(ctx.rng.standard_normal(lay.n_embd).astype(np.float32))  # [n_embd] f32
    logits = ctx.upload((ctx.rng.standard_normal(n_expert) * 2).astype(np.float32))
    ids = cuda.device_array(k, np.int32)                                     # routed: outputs
    wts = cuda.device_array(k, np.float32)
    h = cuda.device_array((k, lay.n_ff), np.float32)                         # [k, n_ff] f32
    out = cuda.device_array(lay.n_embd, np.float32)
    miss = cuda.device_array(k, np.int32)
    counters = ctx.upload(np.zeros((1, 2), np.int64))
    sync = None if two else ctx.upload(np.zeros(2, np.int32))  # [2] i32: the barrier's state
    n_out, n_in = 2048, 4096
    w = ctx.upload(random_weights(ctx, "Q4_K", n_out, n_in))                 # [n_out rows] u8
    xa = ctx.upload(ctx.rng.standard_normal(n_in).astype(np.float32))
    ya = cuda.device_array(n_out, np.float32)
    for _ in range(6):
        moe_decode(x, ids, wts, layer=0, layout=lay, slot_table=slot_table, cache=cache,
                   slot_off=slot_off, host=cache, host_off=host_off, h=h, out=out,
                   miss_list=miss, counters=counters, route_logits=logits, sync=sync)
        mv.matvec(w, "Q4_K", xa, ya)
    cuda.synchronize()
    o, y = out.copy_to_host(), ya.copy_to_host()
    if not (np.isfinite(o).all() and np.isfinite(y).all()):
        print("non-finite outputs", file=sys.stderr)
        return 1
    print("routed ids", ids.copy_to_host().tolist(), "|out|", float(np.linalg.norm(o)),
          "|y|", float(np.linalg.norm(y)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
