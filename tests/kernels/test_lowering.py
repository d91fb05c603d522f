"""The linear stand-in for numba-cuda's singly-assigned-variable scan (`cuda_kernels/lowering.py`)
finds the same variables as numba-cuda's own method, on real kernels.

Lowering needs the simulator off, so the check runs in a child process, as the PTX compile test
does: every lowering there runs both methods on the same function and compares their sets.
"""

from __future__ import annotations

import textwrap

import pytest

from helpers.compile_child import run_patch_check

pytestmark = pytest.mark.slow  # a minute of numba lowering and NVVM

CHILD = textwrap.dedent('''
    import numba.cuda.lowering as low
    from numba import cuda
    original = low.Lower._find_singly_assigned_variable
    from strata.cuda_kernels import lowering
    import strata.cuda_kernels.launch  # applies the linear method at import
    applied = low.Lower._find_singly_assigned_variable is lowering.find_singly_assigned_variable
    if not applied:  # a numba-cuda this was not written against: its own method is untouched
        assert low.Lower._find_singly_assigned_variable is original
        print("not applied")
        raise SystemExit(0)
    n = {"functions": 0, "variables": 0}

    def both(self):
        original(self)
        want = self._singly_assigned_vars
        lowering.find_singly_assigned_variable(self)
        assert self._singly_assigned_vars == want, (
            sorted(self._singly_assigned_vars ^ want)[:20])
        n["functions"] += 1
        n["variables"] += len(want)

    low.Lower._find_singly_assigned_variable = both
    from strata.cuda_kernels import compile_check as cc
    names = ("router_normed_F32", "moe_down_lanes_Q6_K", "matvec_lanes_normed_Q8_0", "argmax")
    checks = [c for c in cc._checks(None, None) if c.name in names]
    assert len(checks) == len(names), [c.name for c in checks]
    for c in checks:
        fn, sig = c.build()
        cuda.compile_ptx(fn, sig, cc=(9, 0), **c.options)
    print("applied", n["functions"], n["variables"])
''')


def test_linear_scan_finds_numba_cudas_variables():
    counts = run_patch_check(CHILD, timeout=900)
    if counts is None:  # another numba-cuda: its own method left in place (checked)
        return
    # the check ran on every function lowered (each kernel and its non-inlined helpers):
    # thousands of variables
    n_functions, n_variables = counts
    assert n_functions >= 4 and n_variables > 1000, counts
