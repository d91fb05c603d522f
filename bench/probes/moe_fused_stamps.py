"""Probe (not part of the engine): where the one-launch MoE decode kernel's time goes.

The fused kernel (`cuda_kernels/moe_fused.py`: gate/up, a barrier across the grid, down) took
15.9 µs a layer for Q4_K at the 30B shape (8 of 128 experts, all hits) against 8.3 µs for a read
of the same bytes, and a barrier 0.45 µs cheaper did not move it (2026-12-04): the blocks reach
the barrier at different times, and the time is in what comes before it or after it. A copy of
the kernel's factory is compiled with thread 0 of every block stamping %clock64 and
%globaltimer (`phase_stamps.stamped`) after the experts are resolved, after its gate/up items,
after the first down loads are issued, after the barrier, after h is staged, after its row blocks' units, and at the end; 12 layers in a CUDA graph, Q4_K/Q4_K and Q4_K/Q6_K. Per phase: the median, 90th
percentile and maximum over blocks of the time since the block's start, the launch's span, and
the stamps of the block that ends last.

Run from the repository root on a GPU machine: `python bench/probes/moe_fused_stamps.py`.
"""
import argparse
import sys

import numpy as np
from numba import cuda

sys.path.insert(0, ".")
from decode_parts import moe_case  # noqa: E402  (this folder: the script's, first on the path)
from phase_stamps import report, stamped  # noqa: E402

from strata.bench.kernels import Ctx  # noqa: E402
from strata.cuda_kernels import moe_fused  # noqa: E402

MARKS = [("s_where, s_base, phase != 1)", "after", 8),
         ("pass  # gate/up done", "after", 12),
         ("last_u, dn_n_sb, inv_n_sb, off_a, off_b, part)", "after", 12),
         ("if has_td:", "before", 12),
         ("cuda.syncthreads()  # h staged", "after", 12),
         ("dn_finish(acc_a, acc_b, s_part", "after", 16)]
NAMES = ["start", "experts resolved", "gate/up items done", "first down loads issued",
         "barrier passed", "h staged", "its row blocks' units done", "end"]
# lines the kernel has no text of its own for, marked: the end of gate/up, the barrier after
# h's staging
REPLACE = (("        else:\n            cuda.syncthreads()  # down's list",
            "            pass  # gate/up done\n        else:\n"
            "            cuda.syncthreads()  # down's list"),
           ("s_dwt[t] = weights[s_dkk[t]]\n            cuda.syncthreads()",
            "s_dwt[t] = weights[s_dkk[t]]\n            cuda.syncthreads()  # h staged"))
MAX_BLOCKS = 1024  # stamp rows a launch (the fused grid: at most what the GPU holds at once)


class _Compiled:
    """A compiled stamped kernel that `moe_fused.launch` drives as its own: each launch gets
    the next layer's stamp rows as a last argument."""

    def __init__(self, compiled, owner):
        self._c, self._owner = compiled, owner

    @property
    def cooperative(self):
        return self._c.cooperative

    @cooperative.setter
    def cooperative(self, value):
        self._c.cooperative = value

    def max_cooperative_grid_blocks(self, *args):
        return self._c.max_cooperative_grid_blocks(*args)

    def launch(self, args, grid, block, stream, shmem):
        o = self._owner
        if grid[0] * grid[1] * grid[2] > MAX_BLOCKS:
            raise RuntimeError(f"grid {grid} has more blocks than the stamps hold")
        self._c.launch(tuple(args) + (o.st[o.i],), grid, block, stream, shmem)
        o.i = (o.i + 1) % o.st.shape[0]


class _Stamped:
    """Stands in for `moe_fused._kernel`'s dispatcher: compiles the stamped kernel for the
    launcher's argument types plus the stamp rows'."""

    def __init__(self, kern, st):
        self.kern, self.st, self.i, self._compiled = kern, st, 0, {}

    def typeof_pyval(self, value):
        return self.kern.typeof_pyval(value)

    def compile(self, sig):
        if sig not in self._compiled:
            full = tuple(sig) + (self.kern.typeof_pyval(self.st[0]),)
            self._compiled[sig] = _Compiled(self.kern.compile(full), self)
        return self._compiled[sig]


def stamped_factory():
    """(the stamped copy of `moe_fused._fused`, its stamps a block); a mark the kernel's source
    no longer holds is an error here, before any GPU work."""
    factory, n_st = stamped(moe_fused._fused, "def moe_fused_lanes(", MARKS,
                            "return moe_fused_lanes", REPLACE)
    if n_st != len(NAMES):
        raise RuntimeError(f"{n_st} stamps placed, {len(NAMES)} named: a mark was not found")
    return factory, n_st


def fused_stamps(ctx, gu: str, dn: str, n_layer: int = 12) -> None:
    factory, n_st = stamped_factory()
    st = cuda.to_device(np.zeros((n_layer, MAX_BLOCKS, n_st, 2), np.int64))
    made = {}
    real = moe_fused._kernel

    def stamped_kernel(gu_lf, dn_lf):
        key = (gu_lf.ggml_type, gu_lf.x8, dn_lf.ggml_type)
        if key not in made:
            made[key] = _Stamped(factory(gu_lf, dn_lf, moe_fused.BLOCKS_AN_SM), st)
        return made[key]
    record = moe_case(ctx, gu, dn, n_layer, fused=True)
    moe_fused._kernel = stamped_kernel
    try:
        us = ctx.time_graph(record, n_layer)
    finally:
        moe_fused._kernel = real
    host = st.copy_to_host()
    if not made or not host[:, :, 0, 1].any():
        raise RuntimeError(f"{gu}/{dn}: the fused kernel did not run (two launches instead?)")
    report(f"fused MoE {gu}/{dn}, 8 of 128 experts, all hits: {us:.2f} us a layer in the graph",
           host, NAMES)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--h-six", type=int, default=int(moe_fused.H_SIX))
    ap.add_argument("--split", type=int, default=int(moe_fused.SPLIT_ARRIVE))
    a = ap.parse_args()
    # the stamped copy is made from the factory's source in the module's namespace: it reads
    # these as the kernel does
    moe_fused.H_SIX, moe_fused.SPLIT_ARRIVE = bool(a.h_six), bool(a.split)
    print(f"H_SIX={moe_fused.H_SIX} SPLIT_ARRIVE={moe_fused.SPLIT_ARRIVE}")
    ctx = Ctx()
    for gu, dn in (("Q4_K", "Q4_K"), ("Q4_K", "Q6_K")):
        fused_stamps(ctx, gu, dn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
