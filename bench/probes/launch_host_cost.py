"""Probe (not part of the engine; no GPU needed): the Python a launch costs the host before the
driver call, on this machine's CPU, with numba device arrays over stand-in memory.

    python bench/probes/launch_host_cost.py OUT.json

* direct launch: key and pack the grouped GEMM's 15 arguments (10 arrays) into the kernel's
  parameter buffer (`direct_launch.key_and_values` + `struct.pack_into`): with the arrays'
  part kept on them (the prompt path reuses its views), and with it cleared before every launch
  (what every launch paid before that cache);
* `dense_matmul`'s launcher with the kernel stubbed: checks, tile, views and the dummy schedule.
Run outside the CUDA simulator (numba's real device arrays).
"""
import json
import os
import platform
import struct
import sys
import timeit

import numpy as np


def main() -> int:
    from gguf import GGMLQuantizationType as T
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.typing.typeof import Purpose, typeof

    from strata.cuda_kernels import direct_launch as dl
    from strata.cuda_kernels import matmul

    class Memory:  # what numba's arrays read of their device memory
        def __init__(self, ptr):
            self.device_pointer = ptr

    def dev(shape, dt):
        dt = np.dtype(dt)
        strides = tuple(int(x) for x in np.empty(shape, dt).strides)
        return DeviceNDArray(shape, strides, dt, gpu_data=Memory(0x7F0000001000))

    # the grouped GEMM's arguments at 32 tokens (x u32, weights, bases, sizes, schedule, out)
    args = [dev((32, 1024), np.uint32), dev((1 << 20,), np.uint8), dev((128,), np.int64),
            dev((128,), np.int64), 1152, 768, 2048, dev((129,), np.int32),
            dev((256,), np.int32), 8, dev((144,), np.int32), dev((144,), np.int32),
            dev((1,), np.int32), 256, dev((256, 384), np.uint32)]
    fmt, _, _ = dl.layout(tuple(typeof(a, Purpose.argument) for a in args))
    buf = bytearray(struct.calcsize(fmt))

    def pack():
        struct.pack_into(fmt, buf, 0, *dl.key_and_values(args)[1])

    def pack_uncached():
        for a in args:
            getattr(a, "__dict__", {}).pop("_direct_launch", None)
        pack()

    class Stub:  # the kernel: its launch is not what is timed
        def __getitem__(self, config):
            return lambda *a: None
    matmul._tc = lambda *a: Stub()
    dummy = dev((1,), np.int32)
    matmul.dummy_i32 = lambda: dummy
    x, out = dev((32, 2048), np.float16), dev((32, 4096), np.float32)
    w = matmul.QuantWeights(dev((4096 * 1152,), np.uint8), dev((1,), np.int64), T.Q4_K, 4096,
                            2048)

    def dense():
        matmul.dense_matmul(x, w, out)

    n, rows = 20000, {}
    for name, fn in (("direct launch key+pack, arrays reused", pack),
                     ("direct launch key+pack, arrays new", pack_uncached),
                     ("dense_matmul launcher, kernel stubbed", dense)):
        fn()
        rows[name] = round(min(timeit.repeat(fn, number=n, repeat=3)) / n * 1e6, 2)
        print(f"{name}: {rows[name]} us", flush=True)
    body = {"date": __import__("datetime").date.today().isoformat(),
            "commit": os.environ.get("STRATA_COMMIT", ""),
            "device": f"CPU only: {platform.processor() or platform.machine()}, "
                      f"{os.cpu_count()} cores, Python {platform.python_version()}",
            "command": "python bench/probes/launch_host_cost.py " + " ".join(sys.argv[1:]),
            "us_per_call": rows}
    with open(sys.argv[1], "w") as f:
        json.dump(body, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
