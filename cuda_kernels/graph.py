"""Capture numba kernel launches into a CUDA graph and replay it (stream capture through the
driver API on a numba stream). A graph replay costs ~1 us per kernel where a Python launch costs
20-50 us, which is why the decode step is a graph.

Rules for what is captured: every kernel must have run once before (no JIT inside capture), no
allocation and no host arrays (a host argument would be a synchronous copy), and every value that
changes between replays (positions, routing, token ids) must live in device memory: scalars and
pointers are frozen into the graph.
"""

from __future__ import annotations

from typing import Callable

from numba import cuda


def _drv():
    from cuda.bindings import driver
    return driver


def _check(result, what: str):
    err = result[0] if isinstance(result, tuple) else result
    drv = _drv()
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")
    return result[1] if isinstance(result, tuple) and len(result) > 1 else None


def _stream_handle(stream):
    drv = _drv()
    h = stream.handle
    if isinstance(h, drv.CUstream):
        return h
    return drv.CUstream(int(getattr(h, "value", h) or 0))


class Graph:
    """An instantiated CUDA graph; `replay(stream)` launches it (asynchronously)."""

    def __init__(self, graph, exec_handle, n_nodes: int):
        self._graph = graph
        self._exec = exec_handle
        self.n_nodes = n_nodes

    def replay(self, stream) -> None:
        _check(_drv().cuGraphLaunch(self._exec, _stream_handle(stream)), "cuGraphLaunch")

    def __del__(self):
        drv = _drv()
        try:
            drv.cuGraphExecDestroy(self._exec)
            drv.cuGraphDestroy(self._graph)
        except Exception:  # interpreter shutdown: the driver may already be gone
            pass


def capture(record: Callable[[object], None], stream) -> Graph:
    """Run `record(stream)` under stream capture and return the instantiated graph. `record`
    must only launch kernels (already compiled) on `stream`."""
    drv = _drv()
    h = _stream_handle(stream)
    with cuda.defer_cleanup():
        _check(drv.cuStreamBeginCapture(
            h, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "begin capture")
        try:
            record(stream)
        finally:
            graph = _check(drv.cuStreamEndCapture(h), "end capture")
        n_nodes = _node_count(graph)
        exe = _check(drv.cuGraphInstantiate(graph, 0), "instantiate graph")
    return Graph(graph, exe, n_nodes)


def _node_count(graph) -> int:
    drv = _drv()
    res = drv.cuGraphGetNodes(graph, 0)  # (err, nodes, count): with 0 slots, only the count
    _check(res[0], "count graph nodes")
    return int(res[-1])
