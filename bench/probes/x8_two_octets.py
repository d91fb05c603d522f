"""Probe (not part of the engine): the one-token lane matvecs on 8-bit x with x staged one octet a
thread a round against two (`matvec.X8_TWO_OCTETS`: x of 4,096 values in one round of loads
behind the weight loads instead of two), in one process: every (format, shape) is timed under
each setting twice, alternating, with the same weights and x, the outputs compared bit for bit,
and a read of the same bytes beside them. Arms: `one` (frozenset()), `pair` (warp-a-pair
kernels), `both` (pair and rounds kernels; timed only where the shape runs in rounds).

    python bench/probes/x8_two_octets.py [--formats Q4_K,Q6_K_P8,IQ4_XS,IQ3_S] [--json PATH]

Run from bench/probes (it imports matvec_ab's setup).
"""
import argparse
import datetime
import json
import sys

import numpy as np

import strata
from matvec_ab import setup
from strata.bench.kernels import MATVEC_SHAPES, Ctx, random_weights, time_same_size_read
from strata.cuda_kernels import matvec as mv
from strata.cuda_kernels.matvec import matvec

ARMS = {"one": frozenset(), "pair": frozenset({"pair"}), "both": frozenset({"pair", "rounds"})}


def in_rounds(name: str, n_rows: int, n_cols: int) -> bool:
    """Whether this shape's one-token launch runs the rounds kernel (as `launch_lane_matvec`)."""
    lf = mv.launch_decoding(mv.lane_format(mv.get_format(name).ggml_type), None, n_cols,
                            ((None, None, n_rows),))
    n_sb = n_cols // lf.sb_values
    log = mv.lane_split(lf, n_rows + (n_rows & 1), n_sb)
    grid = mv.n_blocks((n_rows + 1) // 2, mv.LANE_WARPS >> log)
    return grid > mv.lane_grid_blocks() and mv.has_rounds(lf)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="Q4_K,Q6_K_P8,IQ4_XS,IQ3_S")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    ctx = Ctx(seed=1)
    shapes = {label: (r, c) for label, r, c in MATVEC_SHAPES}
    n_max = max(r * c for r, c in shapes.values())
    rows = []
    for name in a.formats.split(","):
        big = ctx.upload(random_weights(ctx, name, n_max // 2048, 2048))
        for label, (n_rows, n_cols) in shapes.items():
            w_bytes, dev, views, x, y = setup(ctx, name, n_rows, n_cols, big)
            n_rounds = max(1, 64 // len(views))
            arms = ["one", "both"] if in_rounds(name, n_rows, n_cols) else ["one", "pair"]
            us = {arm: [] for arm in arms}
            out = {}
            for _ in range(2):
                for arm in arms:
                    mv.X8_TWO_OCTETS = ARMS[arm]

                    def record(s, views=views, x=x, y=y, name=name, n_rounds=n_rounds):
                        for _ in range(n_rounds):
                            for v in views:
                                matvec(v, name, x, y, stream=s)
                    us[arm].append(ctx.time_graph(record, n_rounds * len(views)))
                    matvec(views[0], name, x, y, stream=ctx.stream)
                    out[arm] = y.copy_to_host(stream=ctx.stream)
                    ctx.stream.synchronize()
            same = all(np.array_equal(out[arms[0]], out[arm]) for arm in arms)
            row = {"format": name, "shape": label, "bytes": w_bytes, "arms": arms,
                   "us": {arm: [round(t, 3) for t in us[arm]] for arm in arms},
                   "bit_for_bit": bool(same), "finite": bool(np.isfinite(out[arms[0]]).all()),
                   "us_read": round(time_same_size_read(ctx, views, n_rounds), 3)}
            rows.append(row)
            print(row, flush=True)
            del dev, views
        del big
    mv.X8_TWO_OCTETS = ARMS["pair"]
    print(f"{'format':8} {'shape':14} {'one us':>14} {'two us':>14} {'arm':>5} {'read':>6} "
          f"{'one %':>6} {'two %':>6} same")
    for r in rows:
        one, two = r["us"][r["arms"][0]], r["us"][r["arms"][1]]
        print(f"{r['format']:8} {r['shape']:14} {min(one):6.2f} {max(one):6.2f}  "
              f"{min(two):6.2f} {max(two):6.2f} {r['arms'][1]:>5} {r['us_read']:6.2f} "
              f"{r['us_read'] / min(one):6.0%} {r['us_read'] / min(two):6.0%} "
              f"{r['bit_for_bit'] and r['finite']}")
    if a.json:
        doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "device": str(ctx.cuda.get_current_device().name), "strata": strata.__file__,
               "command": " ".join(sys.argv), "formats": a.formats, "rows": rows}
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
