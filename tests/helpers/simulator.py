"""numba's CUDA simulator made cheaper for the tests, its semantics unchanged.

Block barrier. The simulator runs a block as one Python thread per CUDA thread; its block
manager finds out that every thread reached `syncthreads()` by polling all of them in a loop that
never blocks, so it takes the GIL from the simulated threads for the whole launch. Here the last
thread to arrive at the barrier releases the others, and the manager sleeps until the block is
done or a thread failed. The semantics are numba's: a barrier completes when every thread still
running has reached it (threads that returned no longer count); a thread's exception aborts the
block's other threads and is raised by the launch; blocks run one after another.

Device-function calls. Inside a launch, every call of a `@cuda.jit(device=True)` function
swaps the `cuda` names of its module's globals for the launch's fake module and back (a module
scan, three locks shared by every simulated thread and a context manager per call: about a sixth
of the CPU of the engine's simulator tests). Here a module is swapped at its first device call of
a launch and restored when the launch ends: the kernel code sees the same fake module either way
(the kernel's own module is swapped for the whole launch already).

`install()` replaces `BlockManager.run`, `BlockThread.syncthreads`/`run`, `FakeCUDAKernel.__call__`
(device calls inside a launch only) and `_push_kernel_context` of numba-cuda's simulator
(pyproject pins numba-cuda to 0.30.x, whose simulator this was written against).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np

_STATE = "_strata_block"  # the manager's attribute holding its _Block
_SWAPPED = "_strata_swapped"  # the launch's fake module's attribute: {id(globals): (globals, keys)}
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


def _swap_in(globs, fake_cuda, swapped) -> None:
    """Point the module's `cuda` names at the launch's fake module until the launch ends."""
    from numba import cuda  # the simulator's module, as numba's own swap compares with

    with _SWAP_LOCK:
        if id(globs) in swapped:
            return
        keys = [k for k, v in globs.items() if v is cuda]
        for k in keys:
            globs[k] = fake_cuda
        swapped[id(globs)] = (globs, keys)


def _call(self, *args, base_call, sim):
    fake_cuda = sim._kernel_context
    swapped = getattr(fake_cuda, _SWAPPED, None) if self._device else None
    if swapped is None:  # a launch, or a device function called outside one: numba's path
        return base_call(self, *args)
    globs = self.fn.__globals__
    if id(globs) not in swapped:
        _swap_in(globs, fake_cuda, swapped)
    return self.fn(*args)


def _push_context(fake_cuda, *, base_push):
    @contextmanager
    def pushed():
        from numba import cuda

        setattr(fake_cuda, _SWAPPED, {})
        with base_push(fake_cuda):
            try:
                yield
            finally:
                with _SWAP_LOCK:
                    for globs, keys in getattr(fake_cuda, _SWAPPED).values():
                        for k in keys:
                            globs[k] = cuda
                    setattr(fake_cuda, _SWAPPED, None)

    return pushed()


def install() -> None:
    """Swap in the waiting barrier and the per-launch module swap (idempotent)."""
    from numba.cuda.simulator import kernel as sim

    if getattr(sim.BlockManager, "_strata_waits", False):
        return
    base_run, base_call, base_push = (sim.BlockThread.run, sim.FakeCUDAKernel.__call__,
                                      sim._push_kernel_context)
    sim.BlockThread.syncthreads = _syncthreads
    sim.BlockThread.run = lambda self: _thread_run(self, base_run=base_run)
    sim.BlockManager.run = lambda self, grid_point, *args: _manager_run(
        self, grid_point, *args, thread_cls=sim.BlockThread)
    sim.FakeCUDAKernel.__call__ = lambda self, *args: _call(self, *args, base_call=base_call,
                                                            sim=sim)
    sim._push_kernel_context = lambda fake_cuda: _push_context(fake_cuda, base_push=base_push)
    sim.BlockManager._strata_waits = True
