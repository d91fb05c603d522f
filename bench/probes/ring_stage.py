"""Probe (not part of the engine): what staging an expert blob into the prompt path's VRAM ring
costs the host and the copy engine, by the kind of host memory, and inside a short prompt at a
small budget (where the 2026-12-03 prefill profile showed the stream idle ~21 ms a layer).

    python bench/probes/ring_stage.py [MODEL.gguf] > OUT.txt

Part 1 (no model): 78 blobs of 2.65 MB (a 30B Q4_K layer's non-resident experts) staged with
`ExpertRing.stage` from a registered (mapped) buffer as the expert store makes it
(`hostmem.map_host`), from `cuda.pinned_array` memory and from plain pageable memory: the host
time of the staging loop and the time until the copies land. Part 2 (with a model): a 64-token
prompt on the batch engine at --gpu-mem 8GiB, with `ExpertRing.stage` timed on the host, staged
through numba as before (its logits compared with the direct staging's) and directly."""
import sys
import time

import numpy as np
from numba import cuda

from strata.cuda_kernels.ring import ExpertRing
from strata.engine.cuda.hostmem import map_host

BLOB, N = 2654208, 78


def part1():
    slot = -(-BLOB // 256) * 256
    dev = cuda.device_array(slot * 100, np.uint8)
    kinds = {}
    plain = np.random.default_rng(0).integers(0, 255, BLOB * N + 4096, dtype=np.uint8)
    kinds["pageable"] = plain
    reg = plain.copy()
    kinds["registered (map_host)"] = reg
    keep = map_host(reg)
    pin = cuda.pinned_array(BLOB * N + 4096, np.uint8)
    pin[:] = plain
    kinds["pinned_array"] = pin
    for name, host in kinds.items():
        for rep in range(3):
            ring = ExpertRing(dev, slot, cuda.stream())
            cuda.synchronize()
            t0 = time.perf_counter()
            slots = [ring.stage(host[i * BLOB:(i + 1) * BLOB]) for i in range(N)]
            t1 = time.perf_counter()
            ring.copy_stream.synchronize()
            t2 = time.perf_counter()
            for s in slots:
                ring.acquire(s, cuda.default_stream())
                ring.release(s, cuda.default_stream())
        gb = BLOB * N / 1e9
        print(f"{name:<24} host loop {1e3 * (t1 - t0):7.2f} ms ({1e6 * (t1 - t0) / N:6.1f} us a "
              f"blob), landed after {1e3 * (t2 - t0):7.2f} ms = {gb / (t2 - t0):5.1f} GB/s",
              flush=True)
    del keep


def part2(path):
    import strata.cuda_kernels.ring as ring_mod
    from strata.engine.cuda.batch import batch_options, load_batch
    from strata.gguf import open_model
    from strata.plan.devices import parse_size
    from strata.plan.options import PlanOptions
    mf = open_model(path)
    opts = batch_options(mf, 1, PlanOptions(max_context=4096), gpu_mem=parse_size("8GiB"),
                         progress=False)
    eng = load_batch(mf, opts)
    spent = [0.0, 0]
    orig = ring_mod.ExpertRing.stage

    def timed(self, blob):
        t0 = time.perf_counter()
        try:
            return orig(self, blob)
        finally:
            spent[0] += time.perf_counter() - t0
            spent[1] += 1
    ring_mod.ExpertRing.stage = timed
    rng = np.random.default_rng(1)
    toks = rng.integers(1, eng.shape.n_vocab, 64).tolist()
    ref = np.array(eng.prefill(0, toks))  # compiles
    eng.release(0)

    class NumbaOps(ring_mod.CudaRingOps):  # the staging of before: numba's slice, copy, events
        def copy(self, dst, dst_offset, src, stream):
            dst[dst_offset:dst_offset + src.nbytes].copy_to_device(src, stream=stream)

        def record(self, event, stream):
            event.record(stream)

        def wait(self, stream, event):
            event.wait(stream)
    ops, eng.m.ring_ops = eng.m.ring_ops, NumbaOps()
    for rep in range(2):
        spent[:] = [0.0, 0]
        t0 = time.perf_counter()
        got = np.array(eng.prefill(0, toks))
        wall = time.perf_counter() - t0
        eng.release(0)
        print(f"numba staging: wall {1e3 * wall:7.1f} ms, {spent[1]} stages took "
              f"{1e3 * spent[0]:7.1f} ms of host time; logits equal the direct staging's: "
              f"{np.array_equal(got, ref)}", flush=True)
    eng.m.ring_ops = ops
    for rep in range(3):
        spent[:] = [0.0, 0]
        toks = rng.integers(1, eng.shape.n_vocab, 64).tolist()
        t0 = time.perf_counter()
        eng.prefill(0, toks)
        wall = time.perf_counter() - t0
        eng.release(0)
        print(f"64-token prompt {rep}: wall {1e3 * wall:7.1f} ms, {spent[1]} stages took "
              f"{1e3 * spent[0]:7.1f} ms of host time ({1e6 * spent[0] / max(1, spent[1]):6.1f} "
              f"us each)", flush=True)


if __name__ == "__main__":
    part1()
    if len(sys.argv) > 1:
        part2(sys.argv[1])
