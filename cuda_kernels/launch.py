"""What every launcher shares: argument checks with precise messages, grid arithmetic, and the
registry of kernels the PTX compile check builds.

Launchers never copy: on a GPU every array must already be a device array (a host array would make
numba copy it synchronously, which breaks CUDA-graph capture and costs a sync per launch). Under
the simulator numpy arrays are accepted, since the simulator copies anyway.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from numba import cuda

from strata.aot.runtime import attach as _attach_kernel_bundle
from strata.quant.planar import stored_bytes

from .direct_launch import apply as _direct_launches
from .direct_launch import current_context_handle
from .inline_cache import apply as _inline_once_per_compile
from .inline_copy import apply as _shared_memo_inlining
from .intrinsics import SIMULATED
from .lowering import apply as _linear_lowering
from .ssa_blocks import apply as _ssa_mentioning_blocks

MAX_SHARED_BYTES = 48 * 1024  # static + dynamic shared memory of a block without an opt-in

# A frozen build (or $STRATA_KERNEL_BUNDLE) serves every kernel from its ahead-of-time cubins; a
# developer install has no bundle and compiles on first use as before (strata/aot/runtime.py).
_attach_kernel_bundle()
if not SIMULATED:  # numba-cuda's lowering without its quadratic scan (lowering.py), its inliner
    _linear_lowering()  # copying a callee's scope once per copy (inline_copy.py) and translating
    _shared_memo_inlining()  # a callee once per compile (inline_cache.py), its SSA pass visiting
    _inline_once_per_compile()  # only the blocks that mention a variable (ssa_blocks.py): same PTX
    _ssa_mentioning_blocks()
    _direct_launches()  # a launch seen before goes straight to cuLaunchKernel (direct_launch.py)


def factory_cache(factory: Callable) -> Callable:
    """functools.cache for a kernel factory that keys on every argument with its defaults
    applied, so `f(a, b)`, `f(a, b, c=default)` and `f(a, b, default)` share one compiled kernel
    (plain functools.cache keys them apart and would compile the same kernel twice).
    `.__wrapped__` is the factory itself (the probes re-exec its source)."""
    sig = inspect.signature(factory)
    cached = functools.cache(factory)

    @functools.wraps(factory)
    def get(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return cached(*bound.args)
    get.__wrapped__ = factory
    return get


def check_array(name: str, a: Any, dtype, shape: tuple[int | None, ...] | None = None) -> None:
    """Refuse `a` unless it is a C-contiguous device array of `dtype` (a dtype or a tuple of them)
    whose shape matches `shape` (None entries match any size)."""
    if a is None:
        raise ValueError(f"{name}: missing array")
    if not SIMULATED and not cuda.is_cuda_array(a):
        raise ValueError(f"{name}: expected a device array, got {type(a).__name__} "
                         f"(copy it to the device once, outside the decode loop)")
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    if np.dtype(a.dtype) not in [np.dtype(d) for d in dtypes]:
        want = " or ".join(np.dtype(d).name for d in dtypes)
        raise ValueError(f"{name}: dtype {np.dtype(a.dtype).name}, expected {want}")
    if shape is not None:
        if len(a.shape) != len(shape) or any(w is not None and w != s
                                             for s, w in zip(a.shape, shape)):
            want = tuple("*" if w is None else w for w in shape)
            raise ValueError(f"{name}: shape {tuple(a.shape)}, expected {want}")
    if not _c_contiguous(a):
        raise ValueError(f"{name}: must be C-contiguous")


def check_token_batch(x: Any, y: Any, max_tokens: int, what: str) -> tuple[int, int, int]:
    """(n_tok, n_cols, n_rows) of a small-batch matvec's float32 x [n_tok, n_cols] and
    y [n_tok, n_rows], refused unless both are 2-D with the same 1..max_tokens tokens."""
    check_array("x", x, np.float32)
    check_array("y", y, np.float32)
    if len(x.shape) != 2 or len(y.shape) != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"x {tuple(x.shape)} and y {tuple(y.shape)} must be [n_tok, n_cols] "
                         f"and [n_tok, n_rows]")
    n_tok, n_cols = x.shape
    if not 1 <= n_tok <= max_tokens:
        raise ValueError(f"x: {n_tok} tokens, {what} takes 1..{max_tokens}")
    return n_tok, n_cols, y.shape[1]


def check_rows(w: Any, fmt_name: str, n_rows: int, n_cols: int, row_bytes: int,
               name: str = "w") -> None:
    """Refuse `w` unless it is a uint8 device array holding n_rows rows of row_bytes (a planar
    format's whole groups of them: `strata.quant.planar`)."""
    check_array(name, w, np.uint8)
    need = stored_bytes(fmt_name, n_rows * row_bytes)
    if w.size < need:
        raise ValueError(f"{name}: {w.size} bytes, {fmt_name} [{n_rows}, {n_cols}] needs {need}")


def _c_contiguous(a: Any) -> bool:
    flags = getattr(a, "flags", None)
    if flags is not None:
        return bool(flags["C_CONTIGUOUS"])
    return bool(a.is_c_contiguous())


def flat(a: Any) -> Any:
    """A 1-D view of a C-contiguous array (device or host), made once per array."""
    return a if len(a.shape) == 1 else cached_view(a, "flat", lambda a: a.reshape(a.size))


def as_u32(a: Any) -> Any:
    """`a` (f16 data) viewed as uint32 words, made once per array (`cached_view`)."""
    return cached_view(a, "u32", lambda a: a.view(np.uint32))


def cached_view(a: Any, what: str, make: Callable[[Any], Any]) -> Any:
    """make(a), a view of `a`, made once and kept on the array object. A numba slice, reshape or
    view costs 10-30 us of host time; the prompt path passes the same arrays to each of a
    chunk's layers (about 1,500 such views a prompt before). A device array's shape, strides and
    memory never change (a view is a new object), so neither does the view; an object without a
    __dict__ (a numpy array) gets a new one each time."""
    d = getattr(a, "__dict__", None)
    if d is None:
        return make(a)
    key = "_strata_view_" + what
    v = d.get(key)
    if v is None:
        v = d[key] = make(a)
    return v


_TABLES: dict[tuple[int, int], Any] = {}  # (context handle, ggml type) -> device table


def device_table(fmt) -> Any:
    """The format's lookup table in the current context's device memory (made on first use,
    i.e. at warm-up, never during graph capture); the numpy table under the simulator. One per
    context: a layer split runs a context per GPU, and a table on another GPU would be read over
    the link, or not at all where the GPUs have no peer access."""
    if SIMULATED:
        return fmt.table
    return context_table(fmt.ggml_type, lambda: fmt.table)


def context_table(key: int, host: Callable[[], np.ndarray]) -> Any:
    """The current context's device copy of `host()`, made on first use under `key`. The
    lookup reads the current context from the driver (`current_context_handle`): the dense
    GEMMs ask for their unused schedule's array at every launch."""
    handle = current_context_handle()
    t = _TABLES.get((handle, key)) if handle else None
    if t is None:  # no context yet (numba makes one) or a first use in this one
        handle = int(cuda.current_context().handle)
        t = _TABLES.get((handle, key))
        if t is None:
            t = _TABLES[(handle, key)] = cuda.to_device(host())
    return t


# SMs the simulator stands for (kernel tests see the grids of a 128-SM card: 256 lane blocks)
SIM_SMS = 128
_SMS: dict[int, int] = {}  # context handle -> its device's SMs


def device_sms() -> int:
    """Streaming multiprocessors of the current context's device (asked once a context: grids
    sized to the card are read at every launch); SIM_SMS under the simulator."""
    if SIMULATED:
        return SIM_SMS
    handle = current_context_handle()
    n = _SMS.get(handle) if handle else None
    if n is None:  # no context yet (numba makes one) or a first use in this one
        ctx = cuda.current_context()
        n = _SMS[int(ctx.handle)] = int(ctx.device.MULTIPROCESSOR_COUNT)
    return n


def n_blocks(n_items: int, per_block: int) -> int:
    return max(1, -(-int(n_items) // per_block))


@dataclass(frozen=True, slots=True)
class PtxCheck:
    """One kernel specialization for the compile check: `build()` returns (py_func, signature);
    `options` are the extra keyword arguments of `numba.cuda.compile_ptx` the kernel's dispatcher
    compiles with (e.g. {"launch_bounds": (128, 4)}); an ahead-of-time build must pass them too,
    or its code differs from the JIT's (registers, blocks per SM)."""

    family: str
    name: str
    build: Callable[[], tuple[Callable[..., Any], tuple]]
    options: dict = field(default_factory=dict)


PTX_CHECKS: list[PtxCheck] = []


def register_ptx(family: str, name: str, build: Callable[[], tuple[Callable[..., Any], tuple]],
                 *, options: dict | None = None):
    """Add a kernel specialization to the compile check (modules call this at import)."""
    PTX_CHECKS.append(PtxCheck(family, name, build, dict(options or {})))
