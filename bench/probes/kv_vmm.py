"""Probe (not part of the engine): a KV cache whose older rows sit in VRAM and whose newer rows sit
in host memory, in ONE device address range (CUDA virtual memory management: a reserved range,
device memory mapped over its first part and host memory over the rest), so the unchanged
attention kernels read and write a layer's whole context through one pointer.

What it answers before the engine is built on it:
1. Does the driver map host-located physical memory (`cuMemCreate` with
   CU_MEM_LOCATION_TYPE_HOST) beside device memory in one range, and do numba kernels, copies
   and the KV write kernel work across the boundary (bytes compared)?
2. How fast does a kernel read the host part (GB/s, against the device part)?
3. Decode attention (split-K, one read of each key) and causal prefill attention (each key
   read by every query block, the L2 between them and PCIe) over such a layer: the same bits
   as over an all-VRAM copy, and their time against it.

    python bench/probes/kv_vmm.py [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from cuda.bindings import driver as drv
from numba import cuda
from numba.cuda.cudadrv import devicearray
from numba.cuda.cudadrv import driver as nbdrv

from strata.bench.timing import time_graph_ms, time_ms
from strata.cuda_kernels import attention, attention_prefill, kvcache


def check(res):
    err, *rest = res if isinstance(res, tuple) else (res,)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver: {err}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


def _prop(where: str, dev: int):
    p = drv.CUmemAllocationProp()
    p.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.location.type = (drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE if where == "device"
                       else drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST)
    p.location.id = dev
    return p


def granularity(where: str, dev: int = 0) -> int:
    return int(check(drv.cuMemGetAllocationGranularity(
        _prop(where, dev), drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)))


class SplitRange:
    """One reserved range: `pieces` [(where, n_bytes)] mapped in order (each a multiple of the
    granularity), readable and writable by device `dev`; `.array` a numba uint8 view of it."""

    def __init__(self, pieces, dev: int = 0):
        self.size = sum(n for _, n in pieces)
        self.ptr = check(drv.cuMemAddressReserve(self.size, 0, 0, 0))
        self.handles = []
        off = 0
        for where, n in pieces:
            h = check(drv.cuMemCreate(n, _prop(where, dev), 0))
            self.handles.append(h)
            check(drv.cuMemMap(int(self.ptr) + off, n, 0, h, 0))
            off += n
        acc = drv.CUmemAccessDesc()
        acc.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        acc.location.id = dev
        acc.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        check(drv.cuMemSetAccess(self.ptr, self.size, [acc], 1))
        mp = nbdrv.MemoryPointer(cuda.current_context(), drv.CUdeviceptr(int(self.ptr)),
                                 self.size)
        self.array = devicearray.DeviceNDArray((self.size,), (1,), np.uint8, gpu_data=mp)

    def close(self):
        cuda.synchronize()
        self.array = None
        check(drv.cuMemUnmap(self.ptr, self.size))
        for h in self.handles:
            check(drv.cuMemRelease(h))
        check(drv.cuMemAddressFree(self.ptr, self.size))


@cuda.jit
def _read(a, n_words, out):
    # sum of uint32 words, grid-stride (a read of every byte)
    i = cuda.grid(1)
    s = np.uint32(0)
    while i < n_words:
        s += a[i]
        i += cuda.gridsize(1)
    if s == np.uint32(0x12345678):
        out[0] = s


@cuda.jit
def _bump(a, n):
    i = cuda.grid(1)
    while i < n:
        a[i] = a[i] + np.uint8(1)
        i += cuda.gridsize(1)


def read_gbps(words) -> float:
    out = cuda.device_array(1, np.uint32)
    n = words.shape[0]
    ms = time_ms(lambda: _read[1056, 256](words, n, out), reps=10)
    return words.nbytes / (ms * 1e6)


def bytes_roundtrip(rng) -> dict:
    g = max(granularity("device"), granularity("host"))
    r = SplitRange([("device", g), ("host", g), ("device", g)])
    src = rng.integers(0, 256, r.size, dtype=np.uint8)
    r.array.copy_to_device(src)
    _bump[264, 256](r.array, r.size)
    back = r.array.copy_to_host()
    ok = bool(np.array_equal(back, src + np.uint8(1)))
    w = r.array.view(np.uint32)
    gw = g // 4
    res = {"granularity_device": granularity("device"), "granularity_host": granularity("host"),
           "bytes_ok": ok, "read_gbps_device": read_gbps(w[:gw]),
           "read_gbps_host": read_gbps(w[gw:2 * gw])}
    r.close()
    return res


def _kv_pair(lay, rng, n_resident, length):
    """(vmm sides, plain sides, ranges): the same K/V bytes written by `kv_write` into a split
    range (rows < n_resident in VRAM) and into device arrays."""
    side_bytes = lay.n_ctx * lay.n_kv_head * lay.row_bytes
    dev_bytes = n_resident * lay.n_kv_head * lay.row_bytes
    g = max(granularity("device"), granularity("host"))
    assert dev_bytes % g == 0 and side_bytes % g == 0, (dev_bytes, side_bytes, g)
    spare = cuda.device_array(1, np.float16)
    seq = cuda.to_device(np.zeros(1, np.int32))
    vmm, plain, ranges = [], [], []
    for _ in range(2):
        pieces = [("device", dev_bytes)] if dev_bytes else []
        r = SplitRange(pieces + [("host", side_bytes - dev_bytes)])
        ranges.append(r)
        src = cuda.to_device(rng.standard_normal((length, lay.n_kv_head, lay.head_dim))
                             .astype(np.float32))
        a = kvcache.KvSide(lay, r.array, spare)
        b = kvcache.allocate_kv_side(lay)
        kvcache.kv_write(src, a, seq)
        kvcache.kv_write(src, b, seq)
        vmm.append(a)
        plain.append(b)
    cuda.synchronize()
    same = all(np.array_equal(a.data.copy_to_host(), b.data.copy_to_host())
               for a, b in zip(vmm, plain))
    return vmm, plain, ranges, same


def decode_case(rng, n_ctx, n_resident, n_head=32, n_kv=4, hd=128) -> dict:
    lay = kvcache.KvLayout("f16", n_ctx, n_kv, hd)
    vmm, plain, ranges, same = _kv_pair(lay, rng, n_resident, n_ctx)
    q = cuda.to_device(rng.standard_normal((n_head, hd)).astype(np.float32))
    parts = attention.allocate_partials(n_head, hd, n_ctx, n_kv_head=n_kv)
    seq = cuda.to_device(np.array([n_ctx - 1], np.int32))
    outs, times = [], []
    for k, v in (vmm, plain):
        out = cuda.device_array((n_head, hd), np.float32)
        ms, how = time_graph_ms(lambda s: attention.decode_attention(q, k, v, seq, out, parts,
                                                                      stream=s), reps=20)
        outs.append(out.copy_to_host())
        times.append(ms)
    for r in ranges:
        r.close()
    host_bytes = 2 * (n_ctx - n_resident) * lay.n_kv_head * lay.row_bytes
    return {"case": f"decode {n_ctx} keys, {n_resident} in VRAM", "writes_same": same,
            "same_bits": bool(np.array_equal(outs[0], outs[1])), "ms_split": times[0],
            "ms_vram": times[1],
            # the host rows' bytes over the time the split layer takes past the VRAM rows' share
            "host_gbps": host_bytes / (max(times[0] - times[1] * n_resident / n_ctx, 1e-6) * 1e6)}


def prefill_case(rng, n_ctx, n_resident, n_q=4096, n_head=32, n_kv=4, hd=128) -> dict:
    lay = kvcache.KvLayout("f16", n_ctx, n_kv, hd)
    vmm, plain, ranges, same = _kv_pair(lay, rng, n_resident, n_ctx)
    start = n_ctx - n_q
    q = cuda.to_device(rng.standard_normal((n_q, n_head, hd)).astype(np.float32))
    seq = cuda.to_device(np.array([start], np.int32))
    outs, times = [], []
    for k, v in (vmm, plain):
        out = cuda.device_array((n_q, n_head, hd), np.float32)
        ms = time_ms(lambda: attention_prefill.prefill_attention(q, k, v, seq, out,
                                                                 variant="gqa"), reps=5)
        outs.append(out.copy_to_host())
        times.append(ms)
    for r in ranges:
        r.close()
    host_bytes = 2 * (n_ctx - n_resident) * lay.n_kv_head * lay.row_bytes
    return {"case": f"prefill {n_q} at {start}, {n_resident} of {n_ctx} in VRAM",
            "writes_same": same, "same_bits": bool(np.array_equal(outs[0], outs[1])),
            "ms_split": times[0], "ms_vram": times[1],
            "host_bytes_over_extra_ms_gbps": host_bytes / (max(times[0] - times[1], 1e-6)
                                                           * 1e6)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(5)
    rows = {"device": cuda.get_current_device().name.decode()
            if isinstance(cuda.get_current_device().name, bytes)
            else cuda.get_current_device().name}
    rows["roundtrip"] = bytes_roundtrip(rng)
    print(rows["roundtrip"], flush=True)
    rows["cases"] = []
    for fn, args in ((decode_case, (32768, 16384)), (decode_case, (131072, 32768)),
                     (decode_case, (32768, 0)), (prefill_case, (32768, 16384)),
                     (prefill_case, (65536, 16384))):
        try:
            r = fn(rng, *args)
        except Exception as e:  # the next case still runs
            r = {"case": f"{fn.__name__}{args}", "error": f"{type(e).__name__}: {e}"}
        rows["cases"].append(r)
        print(r, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
