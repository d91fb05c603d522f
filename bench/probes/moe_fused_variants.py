"""Probe (not part of the engine): variants of the one-launch MoE decode kernel
(`cuda_kernels/moe_fused.py`), made from its module constants, timed in one process.

Its stamps (`moe_fused_stamps.py`, 2026-12-04, Q4_K/Q6_K at the 30B shape: 8 of 128 experts, all
hits) put 1.4 us of an 18.4 us layer in resolving the slots, 5.7 in gate/up, ~3.3 until the
barrier passes, 1.75 in staging h and 4.2 in down's units. Variants (module constants; each
variant names the ones it changes from the defaults):
  H_SIX                h staged six quads a thread at a time (one round of loads, not two)
  SPLIT_ARRIVE         a block arrives at the barrier before it issues its first down loads
                       (both made defaults on 2026-12-04)
  BARRIER             "count" (default since 2026-12-06) or "generation" (`gridsync`)
  X_BETWEEN            gate/up on 8-bit x asks for x between each warp's first gate and up
                       rows (`lanes_between`; default since 2026-12-07)
Tried and dropped (`bench/results/2026-12-04_kernels_moe_fused_variants_2.json`, code in
112040a): the block's down rows L2-prefetched at its barrier arrival, the layer's slot-table row
read whole beside the ids, each warp's first two down units' loads issued before the barrier.
Then (2026-12-06) no barrier, down polling h's per-launch tags (code in 2c0961c), and the
block's down rows staged in shared memory by cp.async (code in 09a4378): each slower at every
pair (`2026-12-06_moe_tagged_h_tried_h200.json`, `2026-12-06_moe_down_staged_tried_h100.json`).
12 layers in a CUDA graph; each variant's output compared with the first's (bit for bit: the
same dots in the same order). L2 prefetches of the down and gate/up rows issued right after the
resolve, during gate/up, made every pair slower
(`bench/results/2026-12-04_kernels_moe_prefetch.json`).

Run from the repository root on a GPU machine:
`python bench/probes/moe_fused_variants.py [--only NAMES] [--json FILE]`; the best variant is
printed last as `best: NAME {settings}`.
"""
import argparse
import json
import sys

import numpy as np

sys.path.insert(0, ".")
from decode_parts import moe_case  # noqa: E402  (this folder: the script's, first on the path)

from strata.bench.kernels import Ctx, time_same_size_read  # noqa: E402
from strata.cuda_kernels import moe_fused  # noqa: E402

VARIANTS = {"defaults": {}, "h in two rounds": {"H_SIX": False},
            "arrival after the first down loads": {"SPLIT_ARRIVE": False},
            "neither": {"H_SIX": False, "SPLIT_ARRIVE": False},
            "generation barrier": {"BARRIER": "generation"},
            "no x between": {"X_BETWEEN": False}}
PAIRS = (("Q4_K", "Q4_K"), ("Q4_K", "Q6_K"), ("Q6_K", "Q6_K"))
DEFAULTS = {n: getattr(moe_fused, n) for n in ("H_SIX", "SPLIT_ARRIVE", "BARRIER", "X_BETWEEN")}


def run(ctx, gu, dn, settings):
    for name, value in {**DEFAULTS, **settings}.items():
        setattr(moe_fused, name, value)
    moe_fused._CACHE.clear()  # the kernels are made with the constants they read
    ctx.rng = np.random.default_rng(7)  # the same weights, x and experts for every variant
    record = moe_case(ctx, gu, dn, 12, fused=True)
    us = ctx.time_graph(record, 12)
    out = record.out.copy_to_host()
    read_us = time_same_size_read(ctx, record.reads, 1)
    del record
    return us, out, read_us


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--pairs", default=",".join(f"{g}/{d}" for g, d in PAIRS))
    ap.add_argument("--only", help="variant names, comma-separated (default: all)")
    a = ap.parse_args()
    pairs = [tuple(p.split("/")) for p in a.pairs.split(",")]
    names = a.only.split(",") if a.only else list(VARIANTS)
    ctx = Ctx()
    rows, total = [], {n: 0.0 for n in names}
    for gu, dn in pairs:
        base = None
        for name in names:
            us, out, read_us = run(ctx, gu, dn, VARIANTS[name])
            if base is None:
                base = out
            elif not np.array_equal(out, base):
                raise RuntimeError(f"{gu}/{dn} {name}: output differs from the first variant's")
            total[name] += us
            rows.append({"pair": f"{gu}/{dn}", "variant": name, **DEFAULTS, **VARIANTS[name],
                         "us": us, "us reading the same bytes": round(read_us, 3),
                         "of the read": round(read_us / us, 4)})
            print(f"{gu}/{dn:5s} {name:28s}: {us:7.2f} us a layer, a read of its bytes "
                  f"{read_us:5.2f} us = {100 * read_us / us:4.1f}%", flush=True)
    runs = {n: names.count(n) * len(pairs) for n in names}  # a name listed twice runs twice
    best = min(names, key=lambda n: total[n] / runs[n])
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "best": best, "defaults": DEFAULTS}, f, indent=1)
    print(f"best: {best} {VARIANTS[best]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
