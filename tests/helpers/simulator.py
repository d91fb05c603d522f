"""numba's CUDA simulator made cheaper for the tests, its semantics unchanged.

Blocks as greenlets (tests/helpers/simulator_green.py, where the greenlet package is present: a
dev dependency). The simulator runs a block as one OS thread per CUDA
thread, and a few hundred runnable threads spend most of a launch handing CPython's GIL round
(the engine tests spent more system than kernel time); a block's threads run as greenlets on
the launching thread instead, each until it finishes or waits at a barrier or warp exchange.

Block barrier (without greenlets, or STRATA_TEST_SIM_THREADS=1). numba's block manager finds out
that every thread reached `syncthreads()` by polling all of them in a loop that never blocks, so
it takes the GIL from the simulated threads for the whole launch. Here the last thread to arrive
at the barrier releases the others, and the manager sleeps until the block is done or a thread
failed. The semantics are numba's: a barrier completes when every thread still running has
reached it (threads that returned no longer count); a thread's exception aborts the block's
other threads and is raised by the launch; blocks run one after another.

Device-function calls. Inside a launch, every call of a `@cuda.jit(device=True)` function
swaps the `cuda` names of its module's globals for the launch's fake module and back (a module
scan, three locks shared by every simulated thread and a context manager per call). Here a
module is swapped once per launch (the kernel's own at its start, another at its first device
call), and its device functions are pointed at their Python functions for the launch, so kernel
code calls them without a wrapper (kernels make millions of calls); all restored when the launch
ends: the kernel code sees the same fake module and runs the same functions either way.

In-kernel arrays and shared arrays. Element access goes through one Python layer instead of
numba's two; `cuda.shared.array` finds its calling line from the caller's frame instead of
extracting the whole stack with its source lines (an os.stat per frame and thread): the same
(file, line) key numba uses.

`install()` replaces `BlockManager.run` (and `BlockThread.syncthreads`/`run` without greenlets),
`FakeCUDAKernel.__call__`, `_push_kernel_context`, `FakeCUDAShared.array` and the in-kernel array
wrapper's indexing of numba-cuda's simulator (pyproject pins numba-cuda to 0.30.x, whose
simulator this was written against).
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager

import numpy as np

_STATE = "_strata_block"  # the manager's attribute holding its _Block
_SWAPPED = "_strata_swapped"  # the fake module's {id(globals): (globals, [(name, was)])}
_SWAP_LOCK = threading.Lock()


class _Block:
    """Barrier state of one block: threads still running, threads waiting at the barrier, the
    first failed thread."""

    def __init__(self, n_threads: int):
        self.mutex = threading.Lock()
        self.n_live = n_threads
        self.waiting: list = []
        self.failed = None
        self.done = threading.Event()

    def release_if_complete(self) -> None:
        """Open the barrier when every running thread waits at it (caller holds mutex)."""
        if self.waiting and len(self.waiting) == self.n_live:
            for t in self.waiting:
                t._strata_wake.release()
            self.waiting = []


def _syncthreads(self):
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads call")
    block = getattr(self._manager, _STATE)
    with block.mutex:  # the launch sets abort under the mutex: no thread waits after it
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        block.waiting.append(self)
        block.release_if_complete()
    self._strata_wake.acquire()
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads clear")


def _thread_run(self, *, base_run):
    try:
        base_run(self)  # numba's: runs the kernel body, keeps an exception in self.exception
    finally:
        block = getattr(self._manager, _STATE)
        with block.mutex:
            block.n_live -= 1
            if self.exception is not None and block.failed is None:
                block.failed = self
            if block.failed is not None or block.n_live == 0:
                block.done.set()
            else:
                block.release_if_complete()


def _manager_run(self, grid_point, *args, thread_cls):
    threads = []
    for block_point in np.ndindex(*self._block_dim):
        def target():
            self._f(*args)

        t = thread_cls(target, self, grid_point, block_point, self._debug)
        t._strata_wake = threading.Lock()
        t._strata_wake.acquire()  # released once per barrier the thread waits at
        threads.append(t)
    block = _Block(len(threads))
    setattr(self, _STATE, block)
    for t in threads:
        t.start()
    block.done.wait()
    with block.mutex:
        failed = block.failed
        if failed is not None:  # wake every waiting thread into its abort error
            for t in threads:
                t.abort = True
            for t in block.waiting:
                t._strata_wake.release()
            block.waiting = []
    if failed is not None:
        raise failed.exception[0].with_traceback(failed.exception[1])
    for t in threads:
        t.join()


def _swap_in(globs, fake_cuda, swapped, kernel_cls) -> None:
    """Until the launch ends, point the module's `cuda` names at the launch's fake module and
    its device functions at their Python functions (their modules swapped in likewise, first),
    so kernel code calls them without a wrapper frame."""
    from numba import cuda  # the simulator's module, as numba's own swap compares with

    with _SWAP_LOCK:
        _swap_in_locked(globs, fake_cuda, swapped, kernel_cls, cuda)


def _swap_in_locked(globs, fake_cuda, swapped, kernel_cls, cuda) -> None:
    if id(globs) in swapped:
        return
    saved: list = []
    swapped[id(globs)] = (globs, saved)  # before the callees: modules import each other
    for k, v in list(globs.items()):
        if v is cuda:
            saved.append((k, v))
            globs[k] = fake_cuda
        elif type(v) is kernel_cls and v._device:
            _swap_in_locked(v.fn.__globals__, fake_cuda, swapped, kernel_cls, cuda)
            saved.append((k, v))
            globs[k] = v.fn


def _call_method(base_call, sim, launching: list):
    """FakeCUDAKernel.__call__: a device function inside a launch calls its Python function
    directly (kernels make millions of calls), its module swapped in first; a launch notes its
    kernel for `_push_context`."""
    kernel_cls = sim.FakeCUDAKernel

    def call(self, *args):
        if self._device:
            fake_cuda = sim._kernel_context
            swapped = getattr(fake_cuda, _SWAPPED, None)
            if swapped is not None:
                fn = self.fn
                if id(fn.__globals__) not in swapped:
                    _swap_in(fn.__globals__, fake_cuda, swapped, kernel_cls)
                return fn(*args)
            return base_call(self, *args)  # called outside a launch: numba's path
        launching.append(self.fn)
        try:
            return base_call(self, *args)
        finally:
            launching.pop()

    return call


def _fast_kernel_arrays() -> None:
    """numba's in-kernel array wrapper indexes through two Python layers (the wrapper, then the
    FakeCUDAArray it holds) per element; the same results in one: a scalar as is, a sub-array
    wrapped as numba wraps it."""
    from numba.cuda.simulator.cudadrv import devicearray as da

    within, fake, nd, void = da.FakeWithinKernelCUDAArray, da.FakeCUDAArray, np.ndarray, np.void

    def getitem(self, idx):
        item = self._item
        ret = item._ary[idx]
        t = type(ret)
        if t is nd or t is void:
            return within(fake(ret, stream=item.stream))
        return ret

    def setitem(self, idx, val):
        self._item._ary[idx] = val

    within.__getitem__ = getitem
    within.__setitem__ = setitem
    within.__len__ = lambda self: len(self._item._ary)


def _push_context(fake_cuda, *, base_push, kernel_cls, launching: list):
    """numba's kernel context, with the launching kernel's module swapped in (see `_swap_in`)
    for the launch and every swapped module restored at its end."""
    @contextmanager
    def pushed():
        swapped: dict = {}
        setattr(fake_cuda, _SWAPPED, swapped)
        with base_push(fake_cuda):
            try:
                if launching:
                    _swap_in(launching[-1].__globals__, fake_cuda, swapped, kernel_cls)
                yield
            finally:
                with _SWAP_LOCK:
                    for globs, saved in swapped.values():
                        for k, v in saved:
                            globs[k] = v
                    setattr(fake_cuda, _SWAPPED, None)

    return pushed()


def _shared_array_method(base_array):
    """FakeCUDAShared.array: numba's static shared array of the calling line, keyed as numba
    keys it by the caller's (file, line), but read from the caller's frame (numba extracts the
    whole stack with its source lines, an os.stat per frame, for every simulated thread and
    array)."""
    from numba.core import types
    from numba.np import numpy_support

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0:
            return base_array(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        f = sys._getframe(1)  # the kernel line calling cuda.shared.array
        caller = (f.f_code.co_filename, f.f_lineno)
        res = self._allocations.get(caller)
        if res is None:
            res = self._allocations[caller] = np.empty(shape, dtype)
        return res

    return array


def _use_greenlets() -> bool:
    if os.environ.get("STRATA_TEST_SIM_THREADS") == "1":
        return False
    try:
        import greenlet  # noqa: F401
    except ImportError:
        return False
    return True


def install() -> None:
    """Swap in the cheaper block scheduling (greenlets where the package is present, else the
    waiting barrier), the per-launch module swap and the frame-keyed shared arrays
    (idempotent)."""
    from numba.cuda.simulator import kernel as sim
    from numba.cuda.simulator import kernelapi

    if getattr(sim.BlockManager, "_strata_waits", False):
        return
    base_run, base_call, base_push = (sim.BlockThread.run, sim.FakeCUDAKernel.__call__,
                                      sim._push_kernel_context)
    kernelapi.FakeCUDAShared.array = _shared_array_method(kernelapi.FakeCUDAShared.array)
    if _use_greenlets():
        from helpers import simulator_green as green

        threading.current_thread = green.current_thread

        def run_block(self, grid_point, *args):
            green.patch_mma()
            green.run_block(self, grid_point, *args, dim3=kernelapi.Dim3)

        sim.BlockManager.run = run_block
    else:
        sim.BlockThread.syncthreads = _syncthreads
        sim.BlockThread.run = lambda self: _thread_run(self, base_run=base_run)
        sim.BlockManager.run = lambda self, grid_point, *args: _manager_run(
            self, grid_point, *args, thread_cls=sim.BlockThread)
    launching: list = []  # the kernel being launched (one launch at a time)
    sim.FakeCUDAKernel.__call__ = _call_method(base_call, sim, launching)
    _fast_kernel_arrays()
    sim._push_kernel_context = lambda fake_cuda: _push_context(
        fake_cuda, base_push=base_push, kernel_cls=sim.FakeCUDAKernel, launching=launching)
    sim.BlockManager._strata_waits = True
