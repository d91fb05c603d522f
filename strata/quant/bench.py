"""Host dequantization speed per format: `python -m strata.quant.bench [--mib N] [--json PATH]`.

For each supported format it times `dequantize` (all cores, a fresh float32 output each call, as
callers get it) and `decode_blocks` on one thread into a reused buffer (the CPU expert path's
inner loop), on random valid blocks; best of `--repeat` runs. Prints one table and optionally
writes the same rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from strata.cpus import usable_cpus
from strata.quant.blocks import block_decoder, decode_blocks
from strata.quant.dequant import dequantize
from strata.quant.random_blocks import random_blocks
from strata.quant.types import quant_type, supported_types


def _best_seconds(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(name: str, ggml_type: int, *, n_input_bytes: int, repeat: int) -> dict:
    """One format's row: input bytes, and GB/s in / Gvalues/s for both paths."""
    block_size, block_bytes, _ = block_decoder(ggml_type)
    n_blocks = max(1, n_input_bytes // block_bytes)
    n_values = n_blocks * block_size
    # random_blocks counts GGML blocks (one value for a float type)
    n_ggml_blocks = n_values // quant_type(ggml_type).block_size
    raw = random_blocks(ggml_type, n_ggml_blocks, np.random.default_rng(0)).reshape(-1)
    dequantize(raw[:block_bytes], ggml_type)  # compile / load from the disk cache
    t_all = _best_seconds(lambda: dequantize(raw, ggml_type), repeat)
    out = np.empty(n_values, dtype=np.float32)  # [n_values] f32, reused
    decode_blocks(ggml_type, raw, 0, out, 0, n_blocks)
    t_one = _best_seconds(lambda: decode_blocks(ggml_type, raw, 0, out, 0, n_blocks), repeat)
    return {
        "format": name, "input_bytes": int(raw.nbytes), "n_values": int(n_values),
        "dequantize_gb_s_in": raw.nbytes / t_all / 1e9,
        "dequantize_gvalues_s": n_values / t_all / 1e9,
        "one_thread_gb_s_in": raw.nbytes / t_one / 1e9,
        "one_thread_gvalues_s": n_values / t_one / 1e9,
    }


def _table(rows: list[dict], n_threads: int) -> str:
    head = (f"{'format':8} {'MiB in':>7}  {'dequantize (' + str(n_threads) + ' thr)':>24}  "
            f"{'decode_blocks (1 thr)':>24}")
    sub = f"{'':8} {'':>7}  {'GB/s in':>11} {'Gval/s':>12}  {'GB/s in':>11} {'Gval/s':>12}"
    lines = [head, sub]
    for r in rows:
        lines.append(f"{r['format']:8} {r['input_bytes'] / 2**20:7.1f}  "
                     f"{r['dequantize_gb_s_in']:11.2f} {r['dequantize_gvalues_s']:12.2f}  "
                     f"{r['one_thread_gb_s_in']:11.2f} {r['one_thread_gvalues_s']:12.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata.quant.bench", description=__doc__)
    p.add_argument("--mib", type=float, default=16.0, help="input MiB per format (default 16)")
    p.add_argument("--repeat", type=int, default=5, help="runs per measurement; best is kept")
    p.add_argument("--formats", default="", help="comma-separated names (default: all supported)")
    p.add_argument("--json", default="", help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    if args.mib <= 0 or args.repeat < 1:
        p.error("--mib must be positive and --repeat at least 1")
    wanted = {n.strip().upper() for n in args.formats.split(",") if n.strip()}
    types = [q for q in supported_types() if not wanted or q.name in wanted]
    unknown = wanted - {q.name for q in types}
    if unknown:
        p.error(f"not supported formats: {', '.join(sorted(unknown))}")
    n_bytes = int(args.mib * 2**20)
    rows = [measure(q.name, q.ggml_type, n_input_bytes=n_bytes, repeat=args.repeat) for q in types]
    n_threads = usable_cpus()
    print(_table(rows, n_threads))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"n_threads": n_threads, "rows": rows}, fh, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
