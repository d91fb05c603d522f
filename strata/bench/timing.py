"""Timing for the kernel benchmarks: event-timed launches and CUDA-graph replays (so Python's
launch cost is not counted), and a compiled kernel's resources."""

from __future__ import annotations

import numpy as np


def cuda_module():
    """numba.cuda, imported at first use (the runner lists its benchmarks without it)."""
    from numba import cuda
    return cuda


def time_ms(fn, *, reps: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of `fn()` (device work enqueued on the default stream), event-timed."""
    cuda = cuda_module()
    for _ in range(warmup):
        fn()
    cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = cuda.event(), cuda.event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def time_graph_ms(fn, *, reps: int = 50) -> tuple[float, str]:
    """Median ms of one replay of a CUDA graph capturing `fn(stream)`; falls back to event timing
    of plain launches (then launch overhead is included) when capture is unavailable."""
    cuda = cuda_module()
    try:
        from cuda.bindings import driver as drv
        s = cuda.stream()
        fn(s)  # warm: compile and load outside the capture
        s.synchronize()
        h = s.handle
        if not isinstance(h, drv.CUstream):
            h = drv.CUstream(int(getattr(h, "value", h)))
        n_inner = 20
        with cuda.defer_cleanup():
            check(drv.cuStreamBeginCapture(h, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
            for _ in range(n_inner):
                fn(s)
            graph = check(drv.cuStreamEndCapture(h))
        gexec = check(drv.cuGraphInstantiate(graph, 0))
        check(drv.cuGraphLaunch(gexec, h))
        s.synchronize()
        times = []
        for _ in range(reps):
            a, b = cuda.event(), cuda.event()
            a.record(s)
            check(drv.cuGraphLaunch(gexec, h))
            b.record(s)
            b.synchronize()
            times.append(a.elapsed_time(b) / n_inner)
        return float(np.median(times)), "graph"
    except Exception as e:  # measured anyway, and labelled as launch-bound
        print(f"  (graph capture unavailable: {type(e).__name__}: {e}; timing plain launches)")
        return time_ms(lambda: fn(0), reps=reps), "launches"


def check(res):
    err, *rest = res if isinstance(res, tuple) else (res,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver error {err}")
    return rest[0] if len(rest) == 1 else rest


def resources(dispatcher) -> dict:
    """Registers / local bytes per thread and static shared bytes of a compiled kernel."""
    try:
        return {"regs": max(dispatcher.get_regs_per_thread().values()),
                "local_bytes": max(dispatcher.get_local_mem_per_thread().values()),
                "shared_bytes": max(dispatcher.get_shared_mem_per_block().values())}
    except Exception as e:
        return {"resources": f"unavailable: {type(e).__name__}"}
