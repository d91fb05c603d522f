"""`strata.telemetry.compile_clock`: numba's compiles timed, a nest counted once, cache loads and
calls of compiled functions not at all."""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.telemetry.compile_clock import compile_clock


def test_a_compile_nest_counts_once_and_a_compiled_call_not_at_all():
    @njit
    def inner(a):
        return a.sum()

    @njit
    def outer(a):
        return inner(a) * 2.0  # compiling outer compiles inner inside it

    x = np.arange(10.0)
    with compile_clock() as first:
        assert outer(x) == 90.0
    assert first.count == 1 and first.seconds > 0
    with compile_clock() as again:
        assert outer(x) == 90.0
    assert again.count == 0 and again.seconds == 0.0
    with compile_clock() as other:
        outer(np.arange(10, dtype=np.int64))  # a new signature: one more nest
    assert other.count == 1 and other.seconds > 0
    assert outer(x) == 90.0  # no clock installed: nothing counted, nothing fails
