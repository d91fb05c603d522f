"""Compile every registered kernel specialization to PTX for sm_90, without a GPU.

    python -m strata.cuda_kernels.compile_check [--family matvec] [-k Q4_K] [--jobs 2]

Kernel modules register their specializations with `launch.register_ptx` at import; the modules
checked are listed in MODULES (another family adds its module there). Prints one line per kernel
(PTX lines, whether it spills to local memory) and exits non-zero if any fails to compile. Must run
with the CUDA simulator off (NUMBA_ENABLE_CUDASIM unset or 0).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

MODULES = (
    "strata.cuda_kernels.dequant",
    "strata.cuda_kernels.matvec",
    "strata.cuda_kernels.matvec_mixed",
    "strata.cuda_kernels.moe",
    "strata.cuda_kernels.batch_moe",
    "strata.cuda_kernels.batch_attention",
    "strata.cuda_kernels.batch_tc",
    "strata.cuda_kernels.norm_rope",
    "strata.cuda_kernels.rope_kv",
    "strata.cuda_kernels.router",
    "strata.cuda_kernels.router_normed",
    "strata.cuda_kernels.elementwise",
    "strata.cuda_kernels.sampling",
    "strata.cuda_kernels.compile_prefill",  # matmul, routing, attention, KV write (family "prefill")
)
CC = (9, 0)


def _checks(family: str | None, pattern: str | None):
    for m in MODULES:
        importlib.import_module(m)
    from strata.cuda_kernels.launch import PTX_CHECKS
    return [c for c in PTX_CHECKS
            if (family is None or c.family == family) and (pattern is None or pattern in c.name)]


def _compile_range(args: tuple[str | None, str | None, list[int]]) -> list[tuple]:
    family, pattern, indices = args
    from numba import cuda
    checks = _checks(family, pattern)
    rows = []
    for i in indices:
        c = checks[i]
        t0 = time.perf_counter()
        try:
            fn, sig = c.build()
            ptx, _ = cuda.compile_ptx(fn, sig, cc=CC, **c.options)
            local = ".local" in ptx
            rows.append((c.family, c.name, True, len(ptx.splitlines()), local,
                         time.perf_counter() - t0, ""))
        except Exception as e:  # reported in the table, counted as a failure
            rows.append((c.family, c.name, False, 0, False, time.perf_counter() - t0,
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family")
    p.add_argument("-k", dest="pattern")
    p.add_argument("--jobs", type=int, default=1)
    a = p.parse_args(argv)
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        print("compile_check: unset NUMBA_ENABLE_CUDASIM (the simulator cannot emit PTX)",
              file=sys.stderr)
        return 2
    n = len(_checks(a.family, a.pattern))
    if n == 0:
        print("compile_check: no kernel matches", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    jobs = max(1, min(a.jobs, n))
    parts = [(a.family, a.pattern, list(range(k, n, jobs))) for k in range(jobs)]
    if jobs == 1:
        rows = _compile_range(parts[0])
    else:
        with ProcessPoolExecutor(jobs) as ex:
            rows = [r for part in ex.map(_compile_range, parts) for r in part]
    rows.sort(key=lambda r: (r[0], r[1]))
    print(f"{'family':<12} {'kernel':<34} {'ok':<4} {'ptx lines':>9} {'local':>6} {'s':>6}")
    for fam, name, ok, lines, local, secs, err in rows:
        print(f"{fam:<12} {name:<34} {'ok' if ok else 'FAIL':<4} {lines:>9} "
              f"{'yes' if local else '-':>6} {secs:>6.2f} {err}")
    n_fail = sum(1 for r in rows if not r[2])
    print(f"{len(rows)} kernels, {n_fail} failed, sm_{CC[0]}{CC[1]}, "
          f"{time.perf_counter() - t0:.1f} s")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
