"""Probe (not part of the engine): what NVVM-level inlining of the device functions would change.

Every device function here is `@cuda.jit(device=True, inline="always")`: numba inlines its IR
into the caller before typing the rest, which is most of a kernel's compile time (the PTX check
spends ~19 of CI's minutes in numba, ~1 s a kernel in NVVM). numba-cuda's `forceinline=True`
instead compiles each device function once and lets NVVM inline it. This compiles every
specialization compile_check lists to sm_90 PTX in one arm ("inline": as the code is, or
"force": device functions made `forceinline=True, inline="never"` at decoration), assembles it
(ptxas), disassembles it (nvdisasm) and writes per kernel: compile seconds, registers, spill
bytes, SASS instructions in all and in its largest loop. Comparing the two files says whether
the switch would change the code the GPU runs, before any GPU time is spent on it.

(A device function compiled on its own asks numba for the current device's compute capability,
which fails on a machine without a GPU: the "force" arm answers sm_90, the check's target.)

    python bench/probes/forceinline_parity.py inline JOBS OUT.json --nvdisasm PATH
    python bench/probes/forceinline_parity.py force JOBS OUT.json --nvdisasm PATH
"""
import json
import sys
import time

ARM = sys.argv[1]
NVDISASM = sys.argv[sys.argv.index("--nvdisasm") + 1]


def _force():
    """Device functions decorated after this call are inlined by NVVM, not by numba."""
    import numba.cuda as nc
    import numba.cuda.dispatcher as dispatcher
    jit = nc.jit

    def forced(*args, **kw):
        if kw.get("device") and kw.get("inline") == "always":
            kw["inline"] = "never"
            kw["forceinline"] = True
        return jit(*args, **kw)

    class _Sm90:
        compute_capability = (9, 0)

    nc.jit = forced
    dispatcher.get_current_device = lambda: _Sm90()


def _setup():
    sys.path.insert(0, "bench/probes")
    if ARM == "force":
        _force()
    from strata.cuda_kernels import compile_check
    compile_check._checks(None, None)


def one(i):
    import sass_loops
    from strata.cuda_kernels import compile_check, ptxas
    c = compile_check._checks(None, None)[i]
    t = time.process_time()
    try:
        ptx = compile_check.canonical_ptx(c)
    except Exception as e:  # noqa: BLE001 - a kernel the arm cannot compile is a result
        return c.family + "/" + c.name, {"fail": repr(e)[:300]}
    dt = time.process_time() - t
    info = ptxas.info(ptx)
    body, every = sass_loops.loops(sass_loops.sass(ptx, NVDISASM))
    return c.family + "/" + c.name, {"compile_s": round(dt, 2), "regs": info["registers"],
                                     "spill": info["spill_bytes"], "sass": len(every),
                                     "loop": max((len(o) for _, o in body), default=0)}


if __name__ == "__main__":
    from kernel_pool import map_kernels  # this folder's: the script's, first on the path
    jobs, out = int(sys.argv[2]), sys.argv[3]
    rows, wall = map_kernels(one, _setup, jobs)
    rows = dict(rows)
    json.dump({"arm": ARM, "n": len(rows), "wall_s": round(wall, 1), "kernels": rows},
              open(out, "w"), indent=1)
    ok = [r for r in rows.values() if "fail" not in r]
    print(ARM, len(rows), "kernels", f"{wall:.0f} s wall",
          f"{sum(r['compile_s'] for r in ok):.0f} s compiling", len(rows) - len(ok), "failed")
