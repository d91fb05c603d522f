"""Programmatic dependent launch (PDL): in a CUDA graph, a kernel may start while the kernel
before it is still running, on Hopper and later GPUs (compute capability 9.0+).

Decode is a chain of ~400 short kernels where each waits for the one before; between two of
them the GPU idles for the last blocks' tail and the next grid's launch (1.25 us measured on
the H200), and each kernel's first weight loads then wait one memory latency more. A kernel
written for PDL issues the loads that depend on no earlier kernel (its weights, tables) first,
then `grid_wait()` (returns once every earlier kernel it depends on has finished and its
writes are visible), then `grid_release()` (lets the next kernel's blocks start), then the rest.
Releasing only after the wait keeps at most two kernels of the chain in flight.

`make_programmatic(graph)` turns a captured graph's kernel -> kernel edges into programmatic
ones, but only where the kernel at the head of the edge is in `DEPENDENT_KERNELS`: a kernel
that reads before `grid_wait()` must never get such an edge. `compile_check` fails a listed
kernel whose PTX has no `griddepcontrol.wait` and a listed name no kernel has.

Outside a graph with programmatic edges (plain launches, `--no-graph`, the simulator, GPUs
before 9.0) both calls do nothing: the instructions are emitted only when compiling for 9.0+.
`STRATA_PDL=0` keeps every edge plain (an A/B switch for benchmarks).
"""

from __future__ import annotations

import os
import re

from .intrinsics import SIMULATED

# Python names of the kernels that call grid_wait() before reading anything an earlier kernel
# writes (one name covers every specialization a factory makes).
DEPENDENT_KERNELS = frozenset({
    "embed_kernel",            # elementwise: the token from the history
    "matvec_lanes",            # matvec: weight loads, then the wait, then x
    "rope_kv_f16_kernel",      # rope_kv
    "decode_attention_kernel",  # attention (generic)
    "decode_attention_wide",   # attention_wide (f16 KV, tensor cores)
    "combine_splits",          # attention: the split-K combine
    "router_normed_kernel",    # router_normed: router weights, then the wait, then x
    "moe_gate_up_lanes",       # moe (lanes)
    "moe_gate_up_lanes_rows",
    "moe_down_lanes",
    "rms_norm_kernel",         # norm_rope
    "advance_seq_len_kernel",  # kvcache
    "argmax_kernel",           # sampling
    "sample_kernel",
})

MIN_CC = (9, 0)


if SIMULATED:

    def grid_wait():
        """No-op in the simulator (its launches never overlap)."""

    def grid_release():
        """No-op in the simulator."""

else:  # pragma: no cover - compiled for the device (PTX check and GPU tests)
    from llvmlite import ir
    from numba import types
    from numba.cuda.core import targetconfig
    from numba.cuda.extending import intrinsic

    def _compiling_for_pdl() -> bool:
        # The compute capability being compiled for (numba's own cc-dependent lowering reads
        # it the same way): PTX for an older GPU must not hold these instructions.
        flags = targetconfig.ConfigStack.top_or_none()
        cc = getattr(flags, "compute_capability", None)
        return cc is not None and tuple(cc) >= MIN_CC

    def _statement(text):
        @intrinsic
        def statement(typingctx):
            def codegen(context, builder, sig, args):
                if _compiling_for_pdl():
                    # a memory clobber: no load or store moves across it
                    asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}",
                                       side_effect=True)
                    builder.call(asm, [])
                return context.get_dummy_value()
            return types.none(), codegen
        return statement

    grid_wait = _statement("griddepcontrol.wait;")
    grid_release = _statement("griddepcontrol.launch_dependents;")


_COMPONENT = re.compile(r"(\d+)")


def kernel_name(mangled: str) -> str:
    """The Python function name in numba's Itanium-mangled kernel name, e.g.
    `_ZN8__main__4make12_3clocals_3e14lane_kernel_q4B2v1B92cw...E` -> 'lane_kernel_q4'
    (the last `<length><name>` component before the ABI tags); '' if it is not one."""
    if not mangled.startswith("_ZN"):
        return ""
    i, last = 3, ""
    while i < len(mangled) and mangled[i].isdigit():
        m = _COMPONENT.match(mangled, i)
        n = int(m.group(1))
        start = m.end()
        if start + n > len(mangled):
            return ""
        last = mangled[start:start + n]
        i = start + n
    return last


def enabled() -> bool:
    """Whether decode graphs get programmatic edges: not turned off by STRATA_PDL=0, and the
    current GPU is 9.0+."""
    if SIMULATED or os.environ.get("STRATA_PDL", "1").strip() == "0":
        return False
    from numba import cuda
    try:
        return tuple(cuda.get_current_device().compute_capability) >= MIN_CC
    except Exception:  # no context / no GPU: nothing to convert
        return False


def make_programmatic(graph) -> int:
    """Make every edge of `graph` (a CUgraph, not instantiated) from a kernel node to a kernel
    node whose kernel is in DEPENDENT_KERNELS programmatic; returns how many. Each edge is
    removed and re-added as programmatic; if the driver refuses the new one, the plain edge is
    put back, so the graph never loses an ordering."""
    from cuda.bindings import driver as drv

    from .graph import _check

    kernel_type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
    names: dict[int, str] = {}

    def name_of(node) -> str | None:
        """The kernel's Python name, or None for a node that is not a kernel."""
        key = int(node)
        if key not in names:
            if _check(drv.cuGraphNodeGetType(node), "node type") != kernel_type:
                names[key] = None
            else:
                params = _check(drv.cuGraphKernelNodeGetParams(node), "kernel node params")
                raw = _check(drv.cuFuncGetName(params.func), "kernel name")
                names[key] = kernel_name(raw.decode() if isinstance(raw, bytes) else str(raw))
        return names[key]

    res = drv.cuGraphGetEdges(graph, 0)
    _check(res[0], "count graph edges")
    n = int(res[-1])
    if n == 0:
        return 0
    res = drv.cuGraphGetEdges(graph, n)
    _check(res[0], "graph edges")
    frm, to = res[1], res[2]
    port = getattr(drv, "CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC", 1)
    changed = 0
    for a, b in zip(frm[:n], to[:n]):
        if name_of(a) is None or name_of(b) not in DEPENDENT_KERNELS:
            continue
        _check(drv.cuGraphRemoveDependencies(graph, [a], [b], None, 1), "remove edge")
        e = drv.CUgraphEdgeData()
        e.from_port = port
        e.type = drv.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
        err = drv.cuGraphAddDependencies(graph, [a], [b], [e], 1)
        if (err[0] if isinstance(err, tuple) else err) != drv.CUresult.CUDA_SUCCESS:
            _check(drv.cuGraphAddDependencies(graph, [a], [b], None, 1), "restore edge")
            continue
        changed += 1
    return changed
