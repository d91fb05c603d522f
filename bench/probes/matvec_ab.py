"""Probe (not part of the engine): the one-token lane matvecs at the kernel bench's shapes, each
at its default settings, and (with --read) a read of the same bytes, for an A/B of a setting read
at import or at kernel construction (e.g. `matvec.WIDE_ROUNDS`, or 54d3127's span-load width):
run it once per installed copy and compare the JSONs. Prints a table; writes --json. With --ncu
FORMAT:SHAPE it only launches that matvec a few times (no graph), for Nsight Compute's
counters, e.g.
  ncu --clock-control none -k regex:matvec --launch-skip 3 --launch-count 1 \\
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats \\
      --section WarpStateStats --section MemoryWorkloadAnalysis \\
      python bench/probes/matvec_ab.py --ncu Q6_K:2048->151936

    python bench/probes/matvec_ab.py [--formats Q6_K,IQ3_S] [--read] [--json PATH]
        [--flag matvec.X_ASYNC]

--flag MODULE.NAME: a boolean read at launch (strata.cuda_kernels.MODULE.NAME), each shape
timed off, on, off, on in this process, the outputs of both compared bit for bit (with --ncu: the
launches take the "on" value).
--flag MODULE.NAME=A/B: the same for any setting read at launch, A as "off" and B as "on"
(Python literals, e.g. matvec.MIN_LANE_BLOCKS=256/128).
"""
import argparse
import ast
import datetime
import json
import sys

import importlib

import numpy as np

import strata
from strata.bench.kernels import (MATVEC_SHAPES, Ctx, n_rotation, random_weights,
                                  time_same_size_read)
from strata.cuda_kernels.matvec import matvec
from strata.cuda_kernels.qformats import get_format


def setup(ctx: Ctx, name: str, n_rows: int, n_cols: int, big):
    w_bytes = n_rows * get_format(name).row_bytes(n_cols)
    n_copies = n_rotation(w_bytes)
    dev = ctx.replicate(big[:w_bytes], n_copies)
    views = [dev[c * w_bytes:(c + 1) * w_bytes] for c in range(n_copies)]
    x = ctx.upload(ctx.rng.standard_normal(n_cols).astype(np.float32))  # [n_cols] f32
    y = ctx.cuda.device_array(n_rows, np.float32, stream=ctx.stream)  # [n_rows] f32
    return w_bytes, dev, views, x, y


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="Q6_K,IQ3_S,Q4_K")
    ap.add_argument("--read", action="store_true", help="also a read of each shape's bytes")
    ap.add_argument("--json", default="")
    ap.add_argument("--ncu", default="", help="FORMAT:SHAPE: launch only that, 5 times")
    ap.add_argument("--shapes", default="", help="labels, comma-separated (default all)")
    ap.add_argument("--flag", default="", help="MODULE.NAME: time it off and on")
    a = ap.parse_args()
    flag = None
    arms = {False: False, True: True}  # the setting's value in each arm
    if a.flag:
        path, _, values = a.flag.partition("=")
        mod, name = path.rsplit(".", 1)
        flag = (importlib.import_module(f"strata.cuda_kernels.{mod}"), name)
        if values:
            off, on = (ast.literal_eval(v) for v in values.split("/"))
            arms = {False: off, True: on}
    ctx = Ctx(seed=1)
    shapes = {label: (r, c) for label, r, c in MATVEC_SHAPES
              if not a.shapes or label in a.shapes.split(",")}
    if a.ncu:  # with --flag: the flag's "on" value
        if flag is not None:
            setattr(*flag, arms[True])
        name, label = a.ncu.split(":", 1)
        n_rows, n_cols = shapes[label]
        big = ctx.upload(random_weights(ctx, name, n_rows, n_cols))
        _, _, views, x, y = setup(ctx, name, n_rows, n_cols, big)
        for i in range(5):
            matvec(views[i % len(views)], name, x, y, stream=ctx.stream)
        ctx.stream.synchronize()
        out = y.copy_to_host()
        print(f"{name} {label}: y finite {bool(np.isfinite(out).all())}")
        return 0
    n_max = max(r * c for r, c in shapes.values())
    rows = []
    for name in a.formats.split(","):
        big = ctx.upload(random_weights(ctx, name, n_max // 2048, 2048))
        for label, (n_rows, n_cols) in shapes.items():
            w_bytes, dev, views, x, y = setup(ctx, name, n_rows, n_cols, big)
            rounds = max(1, 64 // len(views))

            def record(s, views=views, x=x, y=y, name=name, rounds=rounds):
                for _ in range(rounds):
                    for v in views:
                        matvec(v, name, x, y, stream=s)
            if flag is None:
                us = ctx.time_graph(record, rounds * len(views))
                row = {"format": name, "shape": label, "us": round(us, 3), "bytes": w_bytes}
            else:
                times, outs = {False: [], True: []}, {}
                for on in (False, True, False, True):
                    setattr(*flag, arms[on])
                    times[on].append(ctx.time_graph(record, rounds * len(views)))
                    matvec(views[0], name, x, y, stream=ctx.stream)
                    ctx.stream.synchronize()
                    outs[on] = y.copy_to_host()
                setattr(*flag, arms[False])
                us = min(times[False])
                row = {"format": name, "shape": label, "us": round(us, 3), "bytes": w_bytes,
                       "us_on": round(min(times[True]), 3),
                       "runs_off": [round(t, 3) for t in times[False]],
                       "runs_on": [round(t, 3) for t in times[True]],
                       "same_bits": bool(np.array_equal(outs[False], outs[True]))}
            if a.read:
                row["us_read"] = round(time_same_size_read(ctx, views, rounds), 3)
            rows.append(row)
            print(row, flush=True)
            del dev, views
        del big
    print(f"{'format':8} {'shape':14} {'us':>8} {'GB/s':>7} {'of read':>8}"
          + (f" {'us on':>8} {'of read':>8} bits" if flag else ""))
    for r in rows:
        of = f"{r['us_read'] / r['us']:.0%}" if "us_read" in r else ""
        line = (f"{r['format']:8} {r['shape']:14} {r['us']:8.2f} {r['bytes'] / r['us'] / 1e3:7.0f} "
                f"{of:>8}")
        if flag:
            of_on = f"{r['us_read'] / r['us_on']:.0%}" if "us_read" in r else ""
            line += f" {r['us_on']:8.2f} {of_on:>8} {'same' if r['same_bits'] else 'DIFFER'}"
        print(line)
    if a.json:  # what ran where: the copy's path tells the arms of an A/B apart
        doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "device": str(ctx.cuda.get_current_device().name), "strata": strata.__file__,
               "formats": a.formats, "flag": a.flag, "rows": rows}
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
