"""Probe (not part of the engine): does a 16-byte-aligned Q6_K (or, with --format IQ4_XS, IQ4_XS)
layout pay in the one-token lane matvec? GGUF's Q6_K super-block is 210 bytes, so a lane's slice starts at an even offset and
`spans.span4` reads it with three 8-byte loads, five selects and four funnel shifts; ptxas counts
the rounds kernel's loop at 837 SASS instructions a step against 652 with aligned vector loads
(`sass_loops.py`). Here the same blocks, each padded to 224 bytes, go through the same 8-bit
kernel with `ld.global.nc.v4` loads (6.7% more bytes read); both arms launch exactly as
`matvec.launch_lane_matvec` does (rounds, wide rounds) and must give the same y.

IQ4_XS (136 bytes: an 8-byte head, then qs at 8-aligned offsets, read as 8-byte pairs): each
block padded to 144 with the head's 8 bytes followed by 8 zero bytes, so qs sits at +16 and a
lane's 32 quant bytes come in two 16-byte loads instead of four 8-byte ones (5.9% more bytes).

    python bench/probes/q6k_aligned.py [--format Q6_K|IQ4_XS] [--json PATH]

Prints, per shape: us of each arm, GB/s of the GGUF bytes, the ratio; writes --json.
"""
import argparse
import datetime
import json
import os
import sys
from dataclasses import replace

import numpy as np
from numba import cuda

from strata.bench.kernels import MATVEC_SHAPES, Ctx, n_rotation, random_weights
from strata.cuda_kernels import matvec as mv
from strata.cuda_kernels.intrinsics import ld_nc_u32x2, ld_nc_u32x4, ld_u16
from strata.cuda_kernels.lanes_x8 import x8_format
from strata.cuda_kernels.launch import device_table, n_blocks

PAD = 224


@cuda.jit(device=True, inline="always")
def load_q6_k_x8_a16(w, off, part):
    """lanes_x8.load_q6_k_x8 for super-blocks at 16-aligned offsets (the layout unchanged)."""
    n = part >> 1
    h = part & 1
    a0, a1, a2, a3 = ld_nc_u32x4(w, off + 64 * n + 16 * h)
    b0, b1, b2, b3 = ld_nc_u32x4(w, off + 64 * n + 32 + 16 * h)
    c0, c1, c2, c3 = ld_nc_u32x4(w, off + 128 + 32 * n + 16 * h)
    s0, s1 = ld_nc_u32x2(w, off + 192 + 8 * n)
    sh = 8 * h
    return (a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, s0 >> sh, s1 >> sh,
            ld_u16(w, off + 208))


@cuda.jit(device=True, inline="always")
def load_iq4_xs_x8_a16(w, off, part):
    """lanes_x8.load_iq4_xs_x8 for 144-byte blocks: head at +0, qs at +16 (16-aligned)."""
    h0, h1 = ld_nc_u32x2(w, off)
    q0, q1, q2, q3 = ld_nc_u32x4(w, off + 16 + 32 * part)
    q4, q5, q6, q7 = ld_nc_u32x4(w, off + 32 + 32 * part)
    return (h0, h1, q0, q1, q2, q3, q4, q5, q6, q7)


def _pad_q6_k(host):
    padded = np.zeros((host.shape[0], 224), np.uint8)  # [n_blocks, 224]
    padded[:, :210] = host
    return padded


def _pad_iq4_xs(host):
    padded = np.zeros((host.shape[0], 144), np.uint8)  # [n_blocks, 144]
    padded[:, :8] = host[:, :8]
    padded[:, 16:] = host[:, 8:]
    return padded


# format: (GGML type, GGUF block bytes, padded block bytes, padding, aligned loader)
ARMS = {"Q6_K": (14, 210, PAD, _pad_q6_k, load_q6_k_x8_a16),
        "IQ4_XS": (23, 136, 144, _pad_iq4_xs, load_iq4_xs_x8_a16)}


def launcher(lf, n_rows, n_cols):
    """(kernel, grid, args but w, x, y) as launch_lane_matvec makes them for one matrix."""
    n_sb = n_cols // lf.sb_values
    n_pairs = (n_rows + 1) // 2
    log = mv.lane_split(lf, 2 * n_pairs, n_sb)
    grid = n_blocks(n_pairs, mv.LANE_WARPS >> log)
    rounds = grid > mv.lane_grid_blocks() and mv.has_rounds(lf)
    min_blocks = 0
    if rounds:
        grid, min_blocks = mv.rounds_launch(lf, grid)
    kern = mv._lanes_single(lf, False, rounds, min_blocks)
    smem = lf.stage_bytes(n_cols)
    tab = device_table(lf)

    def launch(w, x, y, s):
        kern[grid, mv.LANE_THREADS, s, smem](
            w, w, w, n_sb * lf.sb_bytes, n_sb, n_rows, n_rows, n_rows, n_rows, 0,
            lf.stage_len(n_cols), log, x, y[:0], np.float32(0), y[:0], y, y[:0], y[:0], False,
            tab)
    return launch, rounds, min_blocks


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--format", default="Q6_K", choices=sorted(ARMS))
    a = ap.parse_args()
    ctx = Ctx(seed=3)
    t, gguf_bytes, pad_bytes, pad, loader = ARMS[a.format]
    base = x8_format(t)  # the rounds kernels take their own decoding (`lane_body`)
    aligned = replace(base, sb_bytes=pad_bytes, load=loader)
    rows = []
    for label, n_rows, n_cols in MATVEC_SHAPES:
        host = random_weights(ctx, a.format, n_rows, n_cols).reshape(-1, gguf_bytes)
        padded = pad(host)                                  # [n_blocks, pad_bytes] u8
        x = ctx.upload(ctx.rng.standard_normal(n_cols).astype(np.float32))
        row = {"shape": label, "gguf_bytes": host.size}
        ys = {}
        for arm, lf, blocks in (("gguf", base, host), ("aligned", aligned, padded)):
            flat = blocks.reshape(-1)
            n_copies = n_rotation(flat.size)
            dev = ctx.replicate(flat, n_copies)
            views = [dev[c * flat.size:(c + 1) * flat.size] for c in range(n_copies)]
            y = cuda.device_array(n_rows, np.float32, stream=ctx.stream)
            launch, rounds, min_blocks = launcher(lf, n_rows, n_cols)
            reps = max(1, 64 // n_copies)

            def record(s, views=views, x=x, y=y, launch=launch, reps=reps):
                for _ in range(reps):
                    for v in views:
                        launch(v, x, y, s)
            row[f"us_{arm}"] = round(ctx.time_graph(record, reps * n_copies), 3)
            launch(views[0], x, y, ctx.stream)
            ctx.stream.synchronize()
            ys[arm] = y.copy_to_host()
            row["rounds"], row["min_blocks"] = rounds, min_blocks
            del dev, views
        diff = np.abs(ys["aligned"] - ys["gguf"]).max() / np.abs(ys["gguf"]).max()
        row["max_rel_diff"] = float(diff)
        rows.append(row)
        print(row, flush=True)
    g, p_ = gguf_bytes, pad_bytes
    print(f"{a.format}: {'shape':14} {f'{g} us':>8} {f'{p_} us':>8} {f'{g} GB/s':>9} "
          f"{f'{p_} GB/s':>9} {'gain':>6}")
    for r in rows:
        a_, b_ = r["us_gguf"], r["us_aligned"]
        print(f"{r['shape']:14} {a_:8.2f} {b_:8.2f} {r['gguf_bytes'] / a_ / 1e3:9.0f} "
              f"{r['gguf_bytes'] / b_ / 1e3:9.0f} {a_ / b_ - 1:6.1%}")
    bad = [r["shape"] for r in rows if not r["max_rel_diff"] < 1e-5]
    if a.json:
        doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "commit": os.environ.get("STRATA_COMMIT", ""),
               "device": str(cuda.get_current_device().name),
               "command": f"python bench/probes/q6k_aligned.py --format {a.format}",
               "rows": rows}
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    if bad:
        print(f"the aligned arm's y differs at {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
