"""Kernel launches straight to cuLaunchKernel, each kernel's parameter layout built once.

numba-cuda types and marshals every argument again on every launch (typeof, a strided-memory
view per array, a LaunchConfig, a cuda.core stream): 20-50 us a launch, more with more arrays
(shared/REFERENCE.md). The prompt path launches ~1,000 kernels a 4,096-token chunk, and its host
time, mostly that dispatcher, was the prompt's time (2026-12-03_prefill_host_profile.json);
it is also every short prompt's floor on time to first token.

`apply()` routes `kernel[grid, block, stream, shmem](*args)` here. The first launch of a kernel
with arguments of given kinds (per CUDA context) goes through numba unchanged: it compiles,
types, checks and launches. It also records the compiled kernel's parameter layout. Later
launches whose arguments have the same kinds pack their values with `struct` into that layout
and call cuLaunchKernel: a few microseconds. Whatever this does not know goes through numba as
before: a host array, a record, a tuple, a cooperative or debug kernel, a launch-config-sensitive
one, a kernel compiled for an explicit signature, a stream that is not numba's, grid dimensions
that are not positive ints, or a value that does not fit its parameter.

The layout is numba's data model for kernel arguments: an array is meminfo, parent, nitems,
itemsize, data, shape[ndim], strides[ndim]; a scalar is its C type
(tests/unit/test_direct_launch.py checks it against numba's argument packer and marshalling).
`STRATA_DIRECT_LAUNCH=0` turns it off; `ENABLED` does the same at run time (tests, A/B probes).
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading

_STATE: dict = {}
_DRV: dict = {}  # what every launch reads, set by apply(): the driver binding and numba's types
ENABLED = os.environ.get("STRATA_DIRECT_LAUNCH", "1") not in ("0", "", "no", "off")
COUNTS = {"direct": 0, "numba": 0}  # launches each way since apply() (probes, tests)
_MISSING = object()


def scalar_codes() -> dict:
    """numba scalar type -> struct code of its kernel parameter (native size and alignment)."""
    from numba.cuda import types
    return {types.int8: "b", types.uint8: "B", types.int16: "h", types.uint16: "H",
            types.int32: "i", types.uint32: "I", types.int64: "q", types.uint64: "Q",
            types.float16: "e", types.float32: "f", types.float64: "d", types.boolean: "?"}


def layout(argtypes) -> tuple[str, list[int], list[int]] | None:
    """(struct format, each parameter's byte offset, each argument's kind) of a kernel's
    parameters, or None where an argument type is not handled here. kind 0: a scalar;
    n + 1: an array of n dimensions (2n + 5 parameters)."""
    from numba.cuda import types
    codes_of = scalar_codes()
    codes: list[str] = []
    kinds: list[int] = []
    for t in argtypes:
        if isinstance(t, types.Array):
            kinds.append(t.ndim + 1)
            codes += ["P", "P", "q", "q", "P"] + ["q"] * (2 * t.ndim)
        elif t in codes_of:
            kinds.append(0)
            codes.append(codes_of[t])
        else:
            return None
    # '@': native sizes and alignment, as the driver reads each parameter through its pointer
    offsets = [struct.calcsize("@" + "".join(codes[:i + 1])) - struct.calcsize("@" + c)
               for i, c in enumerate(codes)]
    return "@" + "".join(codes), offsets, kinds


def key_and_values(args) -> tuple[tuple | None, list]:
    """(what numba's typing of these arguments depends on, their flat parameter values in
    `layout`'s order), in one cheap pass; the key is None where an argument is of a kind this
    module leaves to numba. An array's part of both is kept on the array object: its shape,
    strides and memory never change (a slice or reshape is a new object), and the prompt path
    passes the same views to every layer."""
    if not _DRV:
        _load()
    DeviceNDArray, scalars = _DRV["DeviceNDArray"], _DRV["scalars"]
    key: list = []
    vals: list = []
    for a in args:
        t = type(a)
        if t is DeviceNDArray:
            info = a.__dict__.get("_direct_launch")
            if info is None:
                info = a.__dict__["_direct_launch"] = _array_info(a)
            key.append(info[0])
            vals += info[1]
        elif t is int:
            if not -(1 << 63) < a < (1 << 63):  # numba types these uint64 or refuses them
                return None, vals
            key.append(int)
            vals.append(a)
        elif t in scalars:
            key.append(t)
            vals.append(a)
        else:
            return None, vals
    return tuple(key), vals


def _array_info(a) -> tuple[tuple, tuple]:
    """An array's key (numba types it C, F or A from these: DeviceNDArray._numba_type_) and its
    parameter values: meminfo, parent, nitems, itemsize, data, shape, strides."""
    d, g = a._dummy, a.gpu_data
    key = (a.dtype, a.ndim, d.is_c_contig, d.is_f_contig, a.size != 0 and 0 in a.strides)
    ptr = int(g.device_pointer) if g is not None else 0
    return key, (0, 0, a.size, a.dtype.itemsize, ptr, *a.shape, *a.strides)


def current_context_handle() -> int:
    """The calling thread's current CUDA context as an int (0: none), from the driver: about a
    microsecond, where numba's `current_context()` costs several."""
    if not _DRV:
        _load()
    err, ctx = _DRV["cu"].cuCtxGetCurrent()
    return int(ctx) if err == _DRV["ok"] else 0


def _load() -> None:
    import numpy as np
    from cuda.bindings import driver as cu
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.cudadrv.driver import Stream
    _DRV.update(cu=cu, ok=cu.CUresult.CUDA_SUCCESS, Stream=Stream, DeviceNDArray=DeviceNDArray,
                # float, bool and numpy's scalars type as themselves; int is checked above
                scalars=frozenset((float, bool, np.int8, np.uint8, np.int16, np.uint16, np.int32,
                                   np.uint32, np.int64, np.uint64, np.float16, np.float32,
                                   np.float64, np.bool_)))


class _Entry:
    """One kernel in one context for one kind of arguments: its function handle and a parameter
    buffer with the pointer array the driver reads (cuLaunchKernel copies the values at the
    call, so the buffer is refilled at the next launch; the lock keeps threads apart)."""

    __slots__ = ("fn", "fmt", "buf", "ptrs", "ptrs_addr", "lock")

    def __init__(self, fn, fmt: str, offsets: list[int]):
        self.fn, self.fmt = fn, fmt
        self.buf = ctypes.create_string_buffer(max(8, struct.calcsize(fmt)))
        base = ctypes.addressof(self.buf)
        self.ptrs = (ctypes.c_void_p * max(1, len(offsets)))(*[base + o for o in offsets])
        self.ptrs_addr = ctypes.addressof(self.ptrs)
        self.lock = threading.Lock()


def _entry_for(dispatcher, args):
    """The entry for a kernel numba has just launched with `args`, or None to leave it to numba."""
    from cuda.bindings import driver as cu
    if dispatcher.targetoptions.get("extensions") or dispatcher._launch_config_sensitive:
        return None
    if dispatcher.specialized:
        kernel = next(iter(dispatcher.overloads.values()))
    else:
        argtypes = tuple(dispatcher.typeof_pyval(a) for a in args)
        kernel = dispatcher.overloads.get(argtypes)
    if (kernel is None or kernel.cooperative or kernel.debug
            or getattr(kernel, "launch_config_sensitive", False)):
        return None
    lay = layout(kernel.argument_types)
    if lay is None:
        return None
    fmt, offsets, _ = lay
    handle = kernel._codelibrary.get_cufunc().handle
    if isinstance(handle, cu.CUkernel):  # cuda.core's kernel: this context's function
        err, handle = cu.cuKernelGetFunction(handle)
        if err != cu.CUresult.CUDA_SUCCESS:
            return None
    return _Entry(handle, fmt, offsets)


def _dim3(d):
    """A launch dimension as (x, y, z), or None where numba should judge it."""
    if type(d) is int:
        return (d, 1, 1) if d > 0 else None
    if type(d) is tuple and 1 <= len(d) <= 3:
        for v in d:
            if type(v) is not int or v <= 0:
                return None
        return d + (1,) * (3 - len(d))
    return None


class DirectLaunch:
    """What `kernel[grid, block, stream, shmem]` returns once `apply()` has run."""

    __slots__ = ("dispatcher", "config")

    def __init__(self, dispatcher, config):
        self.dispatcher, self.config = dispatcher, config

    def _numba(self):
        return _STATE["getitem"](self.dispatcher, self.config)

    def __getattr__(self, name):  # anything else a launch configuration offers
        return getattr(self._numba(), name)

    def __call__(self, *args):
        if not ENABLED:
            return self._numba()(*args)
        cu = _DRV["cu"]
        cfg = self.config
        stream = cfg[2] if len(cfg) > 2 else 0
        shmem = cfg[3] if len(cfg) > 3 else 0
        grid, block = _dim3(cfg[0]), _dim3(cfg[1])
        if not stream:
            h_stream = 0
        elif type(stream) is _DRV["Stream"]:
            h_stream = int(stream.handle)
        else:
            h_stream = None
        key, vals = key_and_values(args)
        ctx = current_context_handle()
        if (key is None or grid is None or block is None or h_stream is None or not ctx
                or type(shmem) is not int or shmem < 0):
            COUNTS["numba"] += 1
            return self._numba()(*args)
        full = (id(self.dispatcher), ctx, key)
        entry = _STATE["entries"].get(full, _MISSING)
        if entry is _MISSING:  # first launch of this kind: numba compiles, checks, launches
            COUNTS["numba"] += 1
            self._numba()(*args)
            # the dispatcher stays alive with its entry, so its id is not reused
            _STATE["entries"][full] = _entry_for(self.dispatcher, args)
            _STATE["keep"][id(self.dispatcher)] = self.dispatcher
            return None
        if entry is None:
            COUNTS["numba"] += 1
            return self._numba()(*args)
        with entry.lock:
            try:
                struct.pack_into(entry.fmt, entry.buf, 0, *vals)
            except struct.error:  # a value out of its parameter's range: numba's error
                COUNTS["numba"] += 1
                return self._numba()(*args)
            (err,) = cu.cuLaunchKernel(entry.fn, *grid, *block, shmem, h_stream,
                                       entry.ptrs_addr, 0)
        if err != _DRV["ok"]:
            from numba.cuda.cudadrv.driver import CudaAPIError
            raise CudaAPIError(err, f"cuLaunchKernel of {self.dispatcher.py_func.__name__} "
                                    f"(grid {grid}, block {block}, {shmem} B shared)")
        COUNTS["direct"] += 1
        return None


def apply() -> None:
    """Route numba kernel launches through DirectLaunch (idempotent)."""
    if "getitem" in _STATE:
        return
    from numba.cuda.dispatcher import CUDADispatcher
    original = CUDADispatcher.__getitem__

    def getitem(self, config):
        if type(config) is not tuple or not 2 <= len(config) <= 4:
            return original(self, config)  # numba's own message
        return DirectLaunch(self, config)

    getitem.__wrapped__ = original
    _load()
    _STATE.update(getitem=original, entries={}, keep={})
    CUDADispatcher.__getitem__ = getitem


def remove() -> None:
    """Undo `apply` (tests)."""
    if "getitem" in _STATE:
        from numba.cuda.dispatcher import CUDADispatcher
        CUDADispatcher.__getitem__ = _STATE["getitem"]
    _STATE.clear()
