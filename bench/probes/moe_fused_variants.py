"""Probe (not part of the engine): variants of the one-launch MoE decode kernel
(`cuda_kernels/moe_fused.py`), made from its module constants, timed in one process.

Its stamps (`moe_fused_stamps.py`, 2026-12-04, Q4_K/Q6_K at the 30B shape: 8 of 128 experts, all
hits) put 1.4 us of an 18.4 us layer in resolving the slots, 5.7 in gate/up, ~3.3 until the
barrier passes, 1.75 in staging h and 4.2 in down's units. Variants (module constants):
  H_SIX         h staged six quads a thread at a time: 8 x 768 values in one round of loads
                (not two)
  SPLIT_ARRIVE  a block arrives at the barrier before it issues its first down loads, then
                waits (not both after)
12 layers in a CUDA graph; each variant's output compared with the first's (bit for bit: the
same dots in the same order). L2 prefetches of the down and gate/up rows were tried the same
way and made every pair slower (`bench/results/2026-12-04_kernels_moe_prefetch.json`).

Run from the repository root on a GPU machine:
`python bench/probes/moe_fused_variants.py [--json FILE]`; the best variant is printed last as
`best: NAME=VALUE ...`.
"""
import argparse
import json
import sys

import numpy as np

sys.path.insert(0, ".")
from decode_parts import moe_case  # noqa: E402  (this folder: the script's, first on the path)

from strata.bench.kernels import Ctx  # noqa: E402
from strata.cuda_kernels import moe_fused  # noqa: E402

NAMES = ("H_SIX", "SPLIT_ARRIVE")
VARIANTS = [(False, False), (True, False), (False, True), (True, True)]
PAIRS = (("Q4_K", "Q4_K"), ("Q4_K", "Q6_K"), ("Q6_K", "Q6_K"))


def run(ctx, gu, dn, variant):
    for name, value in zip(NAMES, variant):
        setattr(moe_fused, name, value)
    moe_fused._CACHE.clear()  # the kernels are made with the constants they read
    ctx.rng = np.random.default_rng(7)  # the same weights, x and experts for every variant
    record = moe_case(ctx, gu, dn, 12, fused=True)
    us = ctx.time_graph(record, 12)
    out = record.out.copy_to_host()
    del record
    return us, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--pairs", default=",".join(f"{g}/{d}" for g, d in PAIRS))
    a = ap.parse_args()
    pairs = [tuple(p.split("/")) for p in a.pairs.split(",")]
    ctx = Ctx()
    rows, total = [], {v: 0.0 for v in VARIANTS}
    for gu, dn in pairs:
        base = None
        for v in VARIANTS:
            us, out = run(ctx, gu, dn, v)
            if base is None:
                base = out
            elif not np.array_equal(out, base):
                raise RuntimeError(f"{gu}/{dn} {dict(zip(NAMES, v))}: output differs from "
                                   f"the first variant's")
            total[v] += us
            rows.append({"pair": f"{gu}/{dn}", **dict(zip(NAMES, v)), "us": us})
            print(f"{gu}/{dn:5s} " + " ".join(f"{n}={int(x)}" for n, x in zip(NAMES, v))
                  + f": {us:7.2f} us a layer", flush=True)
    best = min(VARIANTS, key=lambda v: total[v])
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "best": dict(zip(NAMES, best))}, f, indent=1)
    print("best: " + " ".join(f"{n}={int(x)}" for n, x in zip(NAMES, best)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
