"""The shared-memo copy in numba-cuda's inliner (`cuda_kernels/inline_copy.py`) changes nothing
but compile time: real kernels compile to the same PTX with it and with numba-cuda's own
per-block copies, and deep copies outside the inliner are the standard library's.

Compiling needs the simulator off, so the check runs in a child process, as the PTX compile test
does.
"""

from __future__ import annotations

import textwrap

import pytest

from helpers.compile_child import run_patch_check

pytestmark = pytest.mark.slow  # a minute or two of numba compiles

CHILD = textwrap.dedent('''
    import copy
    from numba.cuda.core import inline_closurecall as icc
    import strata.cuda_kernels.launch  # applies the shared-memo copy at import
    from strata.cuda_kernels import compile_check as cc, inline_copy
    if not inline_copy._state["applied"]:  # a numba-cuda this was not written against
        assert icc.copy is copy
        print("not applied")
        raise SystemExit(0)
    assert icc.copy.deepcopy([[1], {2: 3}]) == [[1], {2: 3}]  # outside inline_ir: plain
    names = ("router_normed_F32", "moe_down_lanes_Q6_K", "decode_attn_f16_stream_hd128_g8",
             "argmax")
    checks = [c for c in cc._checks(None, None) if c.name in names]
    assert len(checks) == len(names), [c.name for c in checks]

    ptx = cc.canonical_ptx  # names numbered by first use: they carry per-process counters

    shared = [ptx(c) for c in checks]
    inline_copy.restore()
    assert icc.copy is copy and not inline_copy._state["applied"]
    own = [ptx(c) for c in checks]
    for c, a, b in zip(checks, shared, own):
        assert a == b, c.name
    print("applied", len(checks), sum(len(a.splitlines()) for a in shared))
''')


def test_shared_memo_inlining_gives_the_same_ptx():
    counts = run_patch_check(CHILD, timeout=1200)
    if counts is None:  # another numba-cuda: its own inliner left in place (checked)
        return
    # four kernels (thousands of PTX lines) came out the same both ways
    n_kernels, n_lines = counts
    assert n_kernels == 4 and n_lines > 3000, counts
