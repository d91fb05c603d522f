"""Probe (not part of the engine): does programmatic dependent launch (PDL) shorten a CUDA graph
of small dependent kernels on the H200? A chain of 384 matvec-like kernels (int8 rows,
2048 <-> 4096, weights rotating past the L2), captured plainly and with its kernel-to-kernel
edges made programmatic (`griddepcontrol.wait` before the kernel reads its input;
`griddepcontrol.launch_dependents` at its start, at its end, or not at all). Prints us per graph
and per kernel, and whether the output equals the plain graph's.

Run from the repository root on a GPU machine: `python bench/probes/pdl_chain.py`. The result
of 2026-12-01 is in bench/results/2026-12-01_pdl_probe.json."""
import sys, math
import numpy as np
from numba import cuda, types
from numba.core.extending import intrinsic
from llvmlite import ir
from cuda.bindings import driver as drv
sys.path.insert(0, ".")
from strata.cuda_kernels.intrinsics import ld_nc_u32x4
from strata.cuda_kernels.graph import _check, Graph, _stream_handle

def _ptx_statement(text):
    """An intrinsic emitting one PTX statement with side effects (a memory clobber)."""
    @intrinsic
    def statement(typingctx):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}",
                               side_effect=True)
            builder.call(asm, [])
            return context.get_dummy_value()
        return types.none(), codegen
    return statement


grid_wait = _ptx_statement("griddepcontrol.wait;")
grid_release = _ptx_statement("griddepcontrol.launch_dependents;")


def make(mode):
    @cuda.jit
    def mv(w, x, y, n_cols, n_rows):
        if mode == 1 or mode == 2:
            grid_release()
        if mode == 1 or mode == 3 or mode == 5:
            grid_wait()
        lane = cuda.threadIdx.x & 31
        row = cuda.blockIdx.x * 8 + (cuda.threadIdx.x >> 5)
        r = min(row, n_rows - 1)
        off = r * n_cols
        n_ch = n_cols // 512  # 16-byte chunks per lane
        a0, a1, a2, a3 = ld_nc_u32x4(w, off + 16 * lane)
        if mode == 2 or mode == 4:
            grid_wait()
        acc = np.float32(0)
        for c in range(n_ch):
            if c + 1 < n_ch:
                b0, b1, b2, b3 = ld_nc_u32x4(w, off + 512 * (c + 1) + 16 * lane)
            base = 512 * c + 16 * lane
            for k in range(4):
                wd = a0 if k == 0 else (a1 if k == 1 else (a2 if k == 2 else a3))
                for b in range(4):
                    q = np.float32(np.int8((wd >> (8 * b)) & 0xFF))
                    acc += q * x[base + 4 * k + b]
            a0, a1, a2, a3 = b0, b1, b2, b3
        for o in (16, 8, 4, 2, 1):
            acc += cuda.shfl_xor_sync(0xFFFFFFFF, acc, o)
        if lane == 0 and row < n_rows:
            y[row] = acc * (np.float32(1.0 / 128.0) / math.sqrt(np.float32(n_cols)))
        if mode == 3 or mode == 4:
            grid_release()
    return mv

def programmatic(graph, port):
    err, frm, to, data, n = drv.cuGraphGetEdges(graph, 0)
    _check(err, "count edges")
    err, frm, to, data, n = drv.cuGraphGetEdges(graph, n)
    _check(err, "edges")
    changed = 0
    for a, b in zip(frm[:n], to[:n]):
        if (_check(drv.cuGraphNodeGetType(a), "t") != drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
                or _check(drv.cuGraphNodeGetType(b), "t") != drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL):
            continue
        _check(drv.cuGraphRemoveDependencies(graph, [a], [b], None, 1), "remove")
        e = drv.CUgraphEdgeData()
        e.from_port = port
        e.type = drv.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
        _check(drv.cuGraphAddDependencies(graph, [a], [b], [e], 1), "add")
        changed += 1
    return changed

def capture_pdl(record, stream, port):
    h = _stream_handle(stream)
    with cuda.defer_cleanup():
        _check(drv.cuStreamBeginCapture(h, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "b")
        record(stream)
        graph = _check(drv.cuStreamEndCapture(h), "e")
        n = programmatic(graph, port) if port is not None else 0
        exe = _check(drv.cuGraphInstantiate(graph, 0), "inst")
    return Graph(graph, exe, n), n

def main():
    print("cuda-bindings", drv.__file__)
    s = cuda.stream()
    rng = np.random.default_rng(0)
    N_LAYER = 48
    E, F = 2048, 4096
    ws = []
    for i in range(2 * N_LAYER):
        n_rows, n_cols = (F, E) if i % 2 == 0 else (E, F)
        ws.append((cuda.to_device(rng.integers(0, 256, n_rows * n_cols, dtype=np.uint8)), n_rows, n_cols))
    x = cuda.to_device((rng.standard_normal(E) * 0.1).astype(np.float32))
    y = cuda.to_device(np.zeros(F, np.float32))
    kern = {m: make(m) for m in range(6)}
    def record_for(m, reps=4):
        def rec(st):
            for _ in range(reps):
                for i, (w, n_rows, n_cols) in enumerate(ws):
                    src, dst = (x, y) if i % 2 == 0 else (y, x)
                    kern[m][(n_rows + 7) // 8, 256, st](w, src, dst, n_cols, n_rows)
        return rec
    n_k = 4 * 2 * N_LAYER
    bytes_step = 4 * sum(w.size for w, _, _ in ws)
    rows = []
    x0 = x.copy_to_host()
    P = drv.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC if hasattr(drv, "CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC") else 1
    LO = getattr(drv, "CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER", 2)
    for name, m, port in (("plain graph, no pdl instr", 0, None), ("plain graph, pdl instr", 2, None),
                          ("P: release+wait at top", 1, P), ("P: release top, prefetch, wait", 2, P),
                          ("P: wait top, release at end", 3, P), ("P: prefetch, wait, release end", 4, P),
                          ("P: wait top, no release", 5, P), ("LO: wait top, no release", 5, LO),
                          ("LO: prefetch, wait, release end", 4, LO)):
        rec = record_for(m)
        x.copy_to_device(x0, stream=s); rec(s); s.synchronize()
        x.copy_to_device(x0, stream=s)
        g, n = capture_pdl(rec, s, port)
        x.copy_to_device(x0, stream=s)
        g.replay(s); s.synchronize()
        out = x.copy_to_host()
        for _ in range(3): g.replay(s)
        s.synchronize()
        ts = []
        for _ in range(5):
            a, b = cuda.event(), cuda.event()
            a.record(s)
            for _ in range(10): g.replay(s)
            b.record(s); b.synchronize()
            ts.append(cuda.event_elapsed_time(a, b) / 10 * 1e3)
        us = float(np.median(ts))
        rows.append((name, n, us, us / n_k, bytes_step / us / 1e3, out))
    ref = rows[0][5]
    print(f"{'variant':36s} {'edges':>6s} {'us/graph':>9s} {'us/kern':>8s} {'GB/s':>7s} same")
    for name, n, us, per, gbps, out in rows:
        print(f"{name:36s} {n:6d} {us:9.1f} {per:8.2f} {gbps:7.0f} {np.array_equal(out, ref)} {np.abs(out-ref).max():.3g}")

main()
