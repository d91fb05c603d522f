"""Probe (not part of the engine): do numba-cuda patches change any kernel's PTX?

Compiles every specialization compile_check lists to sm_90 PTX, with the inliner and SSA patches
(`cuda_kernels/inline_cache.py`, `ssa_blocks.py`; arm "new") or without them (arm "old"), and
writes each kernel's sha256 of its canonical PTX (mangled and shared-array names numbered by
first use, as tests/kernels/test_inline_cache_ssa.py compares them). Run both arms with the CUDA
simulator off (no GPU needed) and compare the two files:
  python bench/probes/ptx_identity.py new 14 new.json; python bench/probes/ptx_identity.py old 14 old.json
The result of 2026-12-02 is bench/results/2026-12-02_ptx_identity_inline_ssa.json."""
import hashlib
import json
import sys
import time

ARM = sys.argv[1] if len(sys.argv) > 1 else "new"


def _setup():
    if ARM == "old":
        from strata.cuda_kernels import inline_cache, ssa_blocks
        inline_cache.apply = lambda: False
        ssa_blocks.apply = lambda: False
    import strata.cuda_kernels.launch  # noqa
    from strata.cuda_kernels import compile_check as cc, inline_cache, ssa_blocks
    assert inline_cache._state["applied"] == (ARM == "new")
    assert ssa_blocks._state["applied"] == (ARM == "new")
    cc._checks(None, None)


def one(i):
    from strata.cuda_kernels import compile_check as cc
    c = cc._checks(None, None)[i]
    t = time.process_time()
    try:
        h = hashlib.sha256(cc.canonical_ptx(c).encode()).hexdigest()
    except Exception as e:
        h = "FAIL " + repr(e)[:200]
    return c.family + "/" + c.name, h, time.process_time() - t


if __name__ == "__main__":
    from kernel_pool import map_kernels  # this folder's: the script's, first on the path
    jobs, out = int(sys.argv[2]), sys.argv[3]
    rows, wall = map_kernels(one, _setup, jobs)
    json.dump({"arm": ARM, "n": len(rows), "wall_s": wall,
               "cpu_s": sum(r[2] for r in rows), "ptx": {r[0]: r[1] for r in rows}},
              open(out, "w"), indent=1)
    print(ARM, len(rows), "kernels", f"{wall:.0f} s wall", f"{sum(r[2] for r in rows):.0f} s cpu",
          sum(1 for r in rows if r[1].startswith("FAIL")), "failed")
