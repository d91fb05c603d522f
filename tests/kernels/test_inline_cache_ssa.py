"""Two numba-cuda patches change nothing but compile time, on real kernels:

- the block-skipping SSA rewrite (`cuda_kernels/ssa_blocks.py`): every function SSA'd while
  the kernels compile is also run through numba-cuda's own `_run_ssa` on a deep copy, and the
  two give the same IR, statement for statement, with the same variables in scope;
- the per-compile cache of inlined callees (`cuda_kernels/inline_cache.py`, with inline_copy's
  skipped second copy): the kernels compile to the same PTX with it and without it.

Compiling needs the simulator off, so the check runs in a child process, as the PTX compile test
does.
"""

from __future__ import annotations

import textwrap

import pytest

from helpers.compile_child import run_patch_check

pytestmark = pytest.mark.slow  # a minute of numba compiles

CHILD = textwrap.dedent('''
    import copy
    import io
    from numba.cuda.core import inline_closurecall as icc, ssa
    run_ssa, rewrite = ssa._run_ssa, ssa._run_block_rewrite
    inline_function = icc.InlineWorker.inline_function
    import strata.cuda_kernels.launch  # applies the patches at import
    from strata.cuda_kernels import compile_check as cc, inline_cache, ssa_blocks
    if not (inline_cache._state["applied"] and ssa_blocks._state["applied"]):
        # a numba-cuda these were not written against: its own functions are untouched
        if not inline_cache._state["applied"]:
            assert icc.InlineWorker.inline_function is inline_function
        if not ssa_blocks._state["applied"]:
            assert ssa._run_ssa is run_ssa and ssa._run_block_rewrite is rewrite
        print("not applied")
        raise SystemExit(0)
    names = ("router_normed_F32", "matvec_lanes_IQ4_XS_f32", "sample", "moe_gate_up_tc_Q4_K")
    checks = [c for c in cc._checks(None, None) if c.name in names]
    assert len(checks) == len(names), [c.name for c in checks]
    n = {"functions": 0, "statements": 0}

    def dump(blocks):
        out = io.StringIO()
        for label, blk in blocks.items():
            print("block", label, file=out)
            blk.dump(file=out)
        scope = next(iter(blocks.values())).scope
        return out.getvalue(), sorted(scope.localvars._con)

    patched_ssa, patched_rewrite = ssa._run_ssa, ssa._run_block_rewrite

    def both(blocks):
        twin = copy.deepcopy(blocks)  # one memo: the copies share one copied scope
        ssa._run_block_rewrite = rewrite
        try:
            want = dump(run_ssa(twin))
        finally:
            ssa._run_block_rewrite = patched_rewrite
        got = patched_ssa(blocks)
        assert dump(got) == want
        n["functions"] += 1
        n["statements"] += sum(len(b.body) for b in got.values())
        return got

    ptx = cc.canonical_ptx  # names numbered by first use: they carry per-process counters

    ssa._run_ssa = both
    cached = [ptx(c) for c in checks]
    ssa._run_ssa = patched_ssa
    inline_cache.restore()
    assert icc.InlineWorker.inline_function is inline_function
    own = [ptx(c) for c in checks]
    for c, a, b in zip(checks, cached, own):
        assert a == b, c.name
    print("applied", len(checks), sum(len(a.splitlines()) for a in cached), n["functions"],
          n["statements"])
''')


def test_inline_cache_and_ssa_blocks_change_nothing_but_time():
    counts = run_patch_check(CHILD, timeout=1200)
    if counts is None:  # another numba-cuda: its own functions left in place (checked)
        return
    # four kernels (thousands of PTX lines) came out the same both ways, and every function
    # SSA'd on the way (each kernel, thousands of statements) came out the same both ways
    n_kernels, n_lines, n_functions, n_statements = counts
    assert n_kernels == 4 and n_lines > 5000, counts
    assert n_functions >= 4 and n_statements > 3000, counts
