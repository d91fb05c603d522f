"""Seconds numba spends compiling during a block of work.

The first run of a version compiles the CPU engine's kernels (numba's cache keeps them for later
runs: `strata.aot.numba_cache`), tens of seconds on a small machine, all of it inside the first
prompt. A tokens-per-second figure that hides it reads as an engine 100x slower than it is, so
`strata generate` measures it apart and says so.

numba triggers a `numba:compile` event around each function it compiles (never for one loaded
from its cache); a caller's compile triggers its callees' inside its own, so only the outermost
event of a nest is counted. numba-cuda (0.30) triggers no event when it compiles a kernel, so a
developer install's first CUDA run (the binary loads its kernels from its bundle) is not said
apart: its prompt figure includes the GPU kernels' compile.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator


class CompileClock:
    """Total seconds of compiles seen (`seconds`) and how many outermost ones (`count`)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.count = 0
        self._depth = threading.local()

    def _started(self) -> None:
        depth = getattr(self._depth, "n", 0)
        if depth == 0:
            self._depth.t0 = time.perf_counter()
        self._depth.n = depth + 1

    def _ended(self) -> None:
        depth = getattr(self._depth, "n", 0)
        if depth == 0:  # a compile begun before the clock was installed: not timed
            return
        self._depth.n = depth - 1
        if depth == 1:
            self.seconds += time.perf_counter() - self._depth.t0
            self.count += 1


@contextmanager
def compile_clock() -> Iterator[CompileClock]:
    """A `CompileClock` counting numba's compiles (on any thread) while the block runs."""
    from numba.core import event

    clock = CompileClock()

    class _Listener(event.Listener):
        def on_start(self, ev) -> None:
            clock._started()

        def on_end(self, ev) -> None:
            clock._ended()

    with event.install_listener("numba:compile", _Listener()):
        yield clock
