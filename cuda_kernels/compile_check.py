"""Compile every registered kernel specialization to PTX for sm_90, without a GPU.

    python -m strata.cuda_kernels.compile_check [--family matvec] [-k Q4_K] [--jobs 2] [--ptxas]

Kernel modules register their specializations with `launch.register_ptx` at import; the modules
checked are listed in MODULES (another family adds its module there). Prints one line per kernel
(PTX lines, whether it spills to local memory, its 64-bit integer divisions, CPU seconds in
numba's typing and lowering and in NVVM) and exits non-zero if any fails to compile. Must run
with the CUDA simulator off (NUMBA_ENABLE_CUDASIM unset or 0). With --ptxas (a CUDA toolkit's
ptxas installed: `ptxas.find`) also each kernel's registers a thread, spilled bytes and stack
frame for sm_90 (`ptxas.info`), and a kernel ptxas rejects counts as a failure.

Each kernel is compiled as `numba.cuda.compile_ptx` does it (numba-cuda's
`_compile_pyfunc_with_fixup`, then NVVM at the default -opt=3), in two steps so the table can
say where the time went: numba's Python passes take nine tenths of it, NVVM the rest. With
--jobs N the kernels go one at a time to whichever of N processes is free, so a process that
shares its core with other work (the rest of the test suite) takes fewer of them.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from . import ptxas

MODULES = (
    "strata.cuda_kernels.dequant",
    "strata.cuda_kernels.matvec",
    "strata.cuda_kernels.compile_matvec",  # the lane matvecs
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


def canonical_ptx(check) -> str:
    """The PTX of one registered specialization (`compile_ptx` for CC, as the engine compiles
    it) with its mangled names and shared-array names numbered by first use: they carry
    per-process counters, so two compiles of the same kernel differ only there. What the tests
    and `bench/probes/ptx_identity.py` compare when they check that a numba-cuda patch changes
    no code."""
    from numba import cuda
    fn, sig = check.build()
    text, _ = cuda.compile_ptx(fn, sig, cc=CC, **check.options)
    seen: dict[str, str] = {}
    return re.sub(r"_ZN\w+|_cudapy_smem_\d+",
                  lambda m: seen.setdefault(m.group(0), f"NAME{len(seen)}"), text)


def _worker_setup(family: str | None, pattern: str | None, use_ptxas: bool = False) -> None:
    """Import the kernel modules, then make CPython's cycle collector cheaper for what follows.
    A compile allocates millions of short-lived IR objects, so with the default thresholds the
    collector ran every few hundred allocations and, every hundred of those, over everything
    alive, numba's registries and the kernel modules included. Frozen objects (what the
    imports made) are never scanned, and with larger thresholds it runs far less often; cycles
    are still freed. The whole check on the 2-core machine: 1,009 s of CPU against 1,120 s,
    at 470 MB instead of 330 MB per worker. The compiles themselves are untouched."""
    _checks(family, pattern)
    _state["ptxas"] = use_ptxas
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


# a 64-bit integer division or remainder in PTX: about 30 SASS instructions on the H200, and
# numba emits one for every `range` with a runtime step (its trip count) and every `//` or `%`
# of runtime integers (its integers are 64-bit). The table counts them (statically).
DIV64 = re.compile(r"\b(?:div|rem)\.[su]64\b")
_state = {"ptxas": False}  # this process's --ptxas (set by _worker_setup)


def _compile_one(args: tuple[str | None, str | None, int]) -> tuple:
    """(family, name, ok, PTX lines, spills, 64-bit divisions, numba s, NVVM s, error, ptxas
    info or None) of one kernel; the seconds are this process's CPU time."""
    family, pattern, i = args
    from numba.cuda.compiler import _compile_pyfunc_with_fixup
    c = _checks(family, pattern)[i]
    t0, t1 = time.process_time(), None
    try:
        fn, sig = c.build()
        lib, _ = _compile_pyfunc_with_fixup(fn, sig, device=False, cc=CC, abi="numba",
                                            **c.options)
        t1 = time.process_time()
        ptxs = lib.get_asm_strs(cc=CC)
        if len(ptxs) != 1:  # as compile_ptx
            raise RuntimeError(f"{len(ptxs)} PTX modules, expected one")
        ptx = ptxs[0]
        t2 = time.process_time()
        regs = ptxas.info(ptx, arch=f"sm_{CC[0]}{CC[1]}") if _state["ptxas"] else None
        return (c.family, c.name, True, len(ptx.splitlines()), ".local" in ptx,
                len(DIV64.findall(ptx)), t1 - t0, t2 - t1, "", regs)
    except Exception as e:  # reported in the table, counted as a failure
        t2 = time.process_time()
        numba_s, nvvm_s = (t2 - t0, 0.0) if t1 is None else (t1 - t0, t2 - t1)
        return (c.family, c.name, False, 0, False, 0, numba_s, nvvm_s,
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200], None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family")
    p.add_argument("-k", dest="pattern")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--ptxas", action="store_true",
                   help="also registers, spills and stack of each kernel (needs ptxas)")
    a = p.parse_args(argv)
    if a.ptxas and ptxas.find() is None:
        print("compile_check: --ptxas needs a CUDA toolkit's ptxas (PATH or CUDA_HOME)",
              file=sys.stderr)
        return 2
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
    tasks = [(a.family, a.pattern, i) for i in range(n)]
    if jobs == 1:
        _worker_setup(a.family, a.pattern, a.ptxas)
        rows = [_compile_one(t) for t in tasks]
    else:
        with ProcessPoolExecutor(jobs, initializer=_worker_setup,
                                 initargs=(a.family, a.pattern, a.ptxas)) as ex:
            rows = list(ex.map(_compile_one, tasks))
    rows.sort(key=lambda r: (r[0], r[1]))
    print(f"{'family':<12} {'kernel':<34} {'ok':<4} {'ptx lines':>9} {'local':>6} "
          f"{'div64':>5} {'numba s':>8} {'nvvm s':>7}"
          + (f" {'regs':>5} {'spill B':>7} {'stack B':>7}" if a.ptxas else ""))
    for fam, name, ok, lines, local, div64, numba_s, nvvm_s, err, regs in rows:
        extra = (f" {regs['registers']:>5} {regs['spill_bytes']:>7} {regs['stack_bytes']:>7}"
                 if regs else "")
        print(f"{fam:<12} {name:<34} {'ok' if ok else 'FAIL':<4} {lines:>9} "
              f"{'yes' if local else '-':>6} {div64:>5} {numba_s:>8.2f} {nvvm_s:>7.2f}"
              f"{extra} {err}".rstrip())
    n_fail = sum(1 for r in rows if not r[2])
    print(f"{len(rows)} kernels, {n_fail} failed, sm_{CC[0]}{CC[1]}, "
          f"{time.perf_counter() - t0:.1f} s (CPU: numba {sum(r[6] for r in rows):.0f} s, "
          f"NVVM {sum(r[7] for r in rows):.0f} s)")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
