"""Direct launches (cuda_kernels/direct_launch.py) against numba's own argument handling.

No GPU is needed: the layout is checked against numba's argument packer (the LLVM parameter list
of a kernel), the packed values against numba's marshalling (`_Kernel._prepare_args`) on device
arrays over stand-in memory, and the cache key against numba's typing. The checks run in a child
with the simulator off, since they need numba's real CUDA target (the tests run the simulator).
The launches themselves are checked on the GPU (tests/gpu/test_direct_launch_gpu.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(r"""
    import ctypes, itertools, struct, types as pytypes
    import numpy as np
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.descriptor import cuda_target
    from numba.cuda.dispatcher import _Kernel
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.errors import normalize_kernel_dimensions
    from numba.cuda.typing.typeof import Purpose, typeof
    from strata.cuda_kernels import direct_launch as dl

    class Mem:  # stand-in device memory: what numba's marshalling reads of a buffer
        def __init__(self, ptr):
            self.device_pointer = ptr
        @property
        def device_ctypes_pointer(self):
            return ctypes.c_size_t(self.device_pointer)

    def dev(shape, dtype, strides=None, ptr=0x7F0000001000):
        dt = np.dtype(dtype)
        if strides is None:
            strides = tuple(int(s) for s in np.empty(shape, dt).strides)
        return DeviceNDArray(shape, strides, dt, gpu_data=Mem(ptr))

    def llvm_bytes(t):
        if isinstance(t, ir.PointerType):
            return 8
        if isinstance(t, ir.IntType):
            return max(1, t.width // 8)
        return {ir.HalfType: 2, ir.FloatType: 4, ir.DoubleType: 8}[type(t)]

    args = [dev((5, 7), np.float32), np.int32(-3), 12345678901, np.float16(1.5), True,
            dev((64,), np.uint8, ptr=0x7F0000002000), 0.25, np.float32(2.5),
            dev((2, 3, 4), np.int32, strides=(96, 32, 4)),   # C
            dev((4, 3), np.float16, strides=(2, 8)),         # F
            dev((4, 3), np.float16, strides=(16, 2)),        # A: a strided view
            np.uint8(200), np.int64(-(1 << 40)), np.uint32(4000000000)]
    argtypes = tuple(typeof(a, Purpose.argument) for a in args)

    # 1. the layout is numba's kernel parameter list, parameter by parameter
    fmt, offsets, kinds = dl.layout(argtypes)
    packer = cuda_target.target_context.get_arg_packer(argtypes)
    want = [llvm_bytes(t) for t in packer.argument_types]
    have = [struct.calcsize("@" + c) for c in fmt[1:]]
    assert have == want, (have, want)
    assert kinds == [(t.ndim + 1) if isinstance(t, types.Array) else 0 for t in argtypes]
    assert all(o % s == 0 for o, s in zip(offsets, have)), "a parameter off its alignment"
    assert dl.layout((types.UniTuple(types.int32, 2),)) is None
    assert dl.layout((types.complex64,)) is None

    # 2. the values are numba's marshalling of the same arguments
    ref = []
    shim = pytypes.SimpleNamespace(extensions=[])
    for t, v in zip(argtypes, args):
        _Kernel._prepare_args(shim, t, v, 0, [], ref)
    ref = [getattr(v, "value", v) for v in ref]  # ctypes scalars to Python
    buf = ctypes.create_string_buffer(struct.calcsize(fmt))
    struct.pack_into(fmt, buf, 0, *dl.key_and_values(args)[1])
    mine = list(struct.unpack(fmt.replace("e", "H"), buf.raw))  # float16 as numba's bits
    assert len(mine) == len(ref), (len(mine), len(ref))
    assert mine == [int(v) if isinstance(v, (bool, np.bool_)) else v for v in ref], (mine, ref)

    # 3. one key, one numba type: arguments whose keys agree are typed alike
    pool = args + [dev((4, 3), np.float32), dev((3, 4), np.float32), dev((4,), np.float32),
                   dev((4, 3), np.float32, strides=(0, 4)),  # broadcast: A
                   dev((1, 4), np.float32, strides=(16, 4)), dev((4, 1), np.float32),
                   7, -7, 1.0, False, np.float64(1.0), np.bool_(True), np.int8(1), np.uint64(9)]
    seen = {}
    for a in pool:
        k = dl.key_and_values((a,))[0]
        assert k is not None, a
        t = typeof(a, Purpose.argument)
        assert seen.setdefault(k, t) == t, (k, seen[k], t)
    assert len(seen) >= 20, len(seen)
    for big in (1 << 63, -(1 << 63), 1 << 70):
        assert dl.key_and_values((big,))[0] is None
    for other in ((1, 2), np.zeros(3), "x", None, 1j):
        assert dl.key_and_values((other,))[0] is None, other

    # 4. launch dimensions as numba normalises them, or left to numba
    for g in (5, (5,), (5, 6), (5, 6, 7)):
        assert dl._dim3(g) == normalize_kernel_dimensions(g, 1)[0], g
    for g in (0, -1, (0, 2), (2, -1), (1, 2, 3, 4), np.int64(3), (np.int64(3),), 2.0, [2, 3]):
        assert dl._dim3(g) is None, g
    print("ok", len(want), len(seen))
""")


def test_layout_values_and_key_follow_numba():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stdout + proc.stderr
