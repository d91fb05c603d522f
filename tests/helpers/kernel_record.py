"""Which kernel specializations an engine run launches, recorded in numba's CUDA simulator.

The frozen binary serves kernels from its bundle by (kernel key, argument types) and refuses any
other (`strata.aot.loader`); a kernel variant the engine launches but the AOT registry does not
list works in a developer install (it JIT-compiles) and fails only in the binary. Recording the
launches of a simulated run names each one exactly as the frozen dispatcher would: the key of its
Python function and its argument types as numba types them (`numba.typeof`, which the dispatcher
uses for each argument).
"""

from __future__ import annotations

import contextlib
import functools

import numba
import numpy as np

from strata.aot.identity import UnstableKeyError, kernel_key, signature_key


def _arg_type(a):
    ary = getattr(a, "_ary", None)  # the simulator's FakeCUDAArray wraps a numpy array
    if ary is not None:
        a = ary
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        # device arrays are never read-only; a host view handed to the simulator may be
        a = a.copy()
    return numba.typeof(a)


@contextlib.contextmanager
def record_launches(run=None):
    """Yield a dict {(kernel key, signature): 'module.qualname'} filled by every kernel launch
    (not device-function call) made in the simulator inside the block. `run(name)` says which
    kernels also execute (default: all); the others are only recorded, which keeps a run of
    full-width kernels affordable in the simulator when their results do not steer the host."""
    from numba.cuda.simulator import kernel as sim

    seen: dict[tuple[str, str], str] = {}
    call = sim.FakeCUDAKernel.__call__

    def recording(self, *args):
        if not self._device and not sim._kernel_context:
            fn = self.fn
            name = f"{fn.__module__}.{fn.__qualname__}"
            try:
                key = kernel_key(fn)
            except UnstableKeyError:
                key = f"unkeyable:{name}"
            seen[(key, signature_key(tuple(_arg_type(a) for a in args)))] = name
            if run is not None and not run(name):
                return None
        return call(self, *args)

    sim.FakeCUDAKernel.__call__ = recording
    try:
        yield seen
    finally:
        sim.FakeCUDAKernel.__call__ = call


@functools.cache
def registered_options() -> dict[tuple[str, str], list[tuple[str, dict]]]:
    """(kernel key, signature) -> [(registry name, compile options as the bundle keeps them)] of
    every specialization the binary's kernel bundle is built from."""
    from strata.aot.build import registry
    from strata.aot.bundle import options_key

    out: dict[tuple[str, str], list[tuple[str, dict]]] = {}
    for check in registry():
        fn, sig = check.build()
        key = (kernel_key(fn), signature_key(tuple(sig)))
        out.setdefault(key, []).append((check.name, options_key(getattr(check, "options", None))))
    return out


def registered() -> frozenset[tuple[str, str]]:
    """(kernel key, signature) of every specialization the binary's kernel bundle is built from."""
    return frozenset(registered_options())
