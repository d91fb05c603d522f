"""numba's CUDA simulator with each block's threads as greenlets on the launching thread.

The simulator runs a block as one OS thread per CUDA thread. With a few hundred of them
runnable at once, CPython hands its GIL round on a 5 ms timer: every waiting thread wakes to ask
for it, so most of a launch went on lock hand-offs and context switches (an engine test spent
more system than kernel time). Here a block's threads are greenlets on the launching thread,
run one at a time in thread order, each until it finishes or waits (at a block barrier or a
simulated warp exchange); a barrier opens when every thread still running waits at it, as
numba's does, and the threads it releases run again in thread order. That order is one a GPU
may take (threads between barriers are unordered), and the only one the thread version took in
practice: it switches threads on a 5 ms timer, longer than a kernel body runs.

Kept as numba's: a thread's exception aborts the block and is raised by the launch (with its
tid/ctaid message); blocks run one after another; `threading.current_thread()` inside a kernel
is the simulated thread (kernel code and numba's fake `cuda` module read its threadIdx,
blockIdx, thread_id, _manager and syncthreads). A block whose threads all wait with no barrier
or exchange able to open raises (the thread version hung there, or timed out at an exchange).

Used by tests/helpers/simulator.py when the greenlet package is present (a dev dependency);
STRATA_TEST_SIM_THREADS=1 keeps the OS threads.
"""

from __future__ import annotations

import sys
import threading
from collections import deque

import numpy as np
from greenlet import GreenletExit, greenlet

_real_current_thread = threading.current_thread


class _Green(greenlet):
    __slots__ = ("sim",)  # the simulated thread this greenlet runs


def current_thread():
    """The simulated thread inside a greenlet launch, else threading's own answer (other OS
    threads have their own greenlets, which hold no simulated thread)."""
    sim = getattr(greenlet.getcurrent(), "sim", None)
    return _real_current_thread() if sim is None else sim


class _Block:
    """One block's scheduler: threads ready to run, threads waiting at the barrier."""

    def __init__(self, threads):
        self.ready = deque(threads)
        self.n_live = len(threads)
        self.at_barrier: list = []
        self.parked = 0  # threads waiting at a warp exchange
        self.failed = None

    def open_barrier_if_complete(self) -> None:
        if self.at_barrier and len(self.at_barrier) == self.n_live:
            self.ready.extend(self.at_barrier)  # in arrival order: thread order
            self.at_barrier = []


def _park() -> None:
    """Give the launching greenlet control until a barrier or exchange resumes this thread."""
    greenlet.getcurrent().parent.switch()


class SimThread:
    """What numba's BlockThread is to kernel code, run in a greenlet instead of an OS thread."""

    def __init__(self, f, manager, block, block_idx, thread_idx, debug, dim3):
        self._f = f
        self._manager = manager
        self._block = block
        self.blockIdx = dim3(*block_idx)
        self.threadIdx = dim3(*thread_idx)
        bd = manager._block_dim
        self.thread_id = thread_idx[0] + bd[0] * (thread_idx[1] + bd[1] * thread_idx[2])
        self.exception = None
        self.abort = False
        self.debug = debug

    def __str__(self):
        return "Thread <<<%s, %s>>>" % (self.blockIdx, self.threadIdx)

    __repr__ = __str__

    def run(self) -> None:
        """The kernel body; an exception is kept in self.exception as numba's BlockThread
        keeps it (message prefixed with the thread and block)."""
        try:
            if self.debug:
                np.seterr(divide="raise")
            self._f()
        except Exception as e:
            tid, ctaid = "tid=%s" % list(self.threadIdx), "ctaid=%s" % list(self.blockIdx)
            msg = "%s %s" % (tid, ctaid) if str(e) == "" else "%s %s: %s" % (tid, ctaid, e)
            self.exception = (type(e)(msg), sys.exc_info()[2])
        finally:
            block = self._block
            block.n_live -= 1
            if self.exception is not None and block.failed is None:
                block.failed = self
            block.open_barrier_if_complete()

    def syncthreads(self) -> None:
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        block = self._block
        block.at_barrier.append(self)
        block.open_barrier_if_complete()
        _park()
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads clear")


class WarpExchange:
    """mma.py's simulated warp exchange (all-gather among the 32 lanes of one warp), waiting by
    parking the greenlet: the 32nd lane to arrive computes `combine(slots)` and releases the
    others; a released lane reads the result before any lane can arrive at the next exchange
    (the next result needs all 32 again), so the object is reused at once, as mma's is."""

    def __init__(self):
        self.slots = [None] * 32
        self.result = None
        self.waiting: list = []

    def run(self, lane, value, combine):
        self.slots[lane] = value
        me = current_thread()
        block = me._block
        if len(self.waiting) == 31:
            result = self.result = combine(self.slots)
            block.ready.extend(self.waiting)
            block.parked -= 31
            self.waiting = []
            return result
        self.waiting.append(me)
        block.parked += 1
        _park()
        return self.result


def run_block(manager, grid_point, *args, dim3) -> None:
    """BlockManager.run: the block's threads as greenlets, scheduled here until all finished."""
    def target():
        manager._f(*args)

    threads = [SimThread(target, manager, None, grid_point, p, manager._debug, dim3)
               for p in np.ndindex(*manager._block_dim)]
    block = _Block(threads)
    for t in threads:
        t._block = block
        g = t._green = _Green(t.run)
        g.sim = t
    while block.ready and block.failed is None:
        block.ready.popleft()._green.switch()
    failed = block.failed
    if failed is None and not block.n_live:
        return
    stuck = RuntimeError(
        f"simulated block {tuple(grid_point)} deadlocked: {block.n_live} threads still running "
        f"wait, {len(block.at_barrier)} at the block barrier and {block.parked} at a warp "
        "exchange (do all threads of the block, all 32 lanes of each warp, take part?)")
    for t in threads:  # the others stop where they wait (numba aborts them likewise)
        t.abort = True
        if t._green:  # started, not finished
            t._green.throw(GreenletExit)
    if failed is None:
        raise stuck
    raise failed.exception[0].with_traceback(failed.exception[1])


def patch_mma() -> None:
    """Point mma_sim.py's simulated warp exchanges at the greenlet one (its own waits on a lock,
    which would stop the one OS thread every lane runs on). Called at each launch: mma is
    imported by the kernel modules, after install()."""
    for name in _MMA_MODULES:
        mma = sys.modules.get(name)
        if mma is not None and getattr(mma, "_WarpExchange", None) is not WarpExchange:
            mma._WarpExchange = WarpExchange


# the installed package's, and the checkout's when a test imports cuda_kernels from the top
_MMA_MODULES = ("strata.cuda_kernels.mma_sim", "cuda_kernels.mma_sim")
