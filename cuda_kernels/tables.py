"""The kernels' constant tables on a device, carved from the plan's arena.

Each quant format's lookup table (IQ grids, non-linear codebooks; a 4-byte placeholder for formats
without one) and the int32 stand-in some launches pass for an unused argument are copied once at
load into the activations' `format_tables` region, and registered as the current context's tables
(`launch.device_table`), so the engine's one arena holds every byte it uses. Launches in a context
with no installed tables (kernel tests, microbenchmarks) still make their own on first use.
"""

from __future__ import annotations

import numpy as np

from .launch import _TABLES, SIMULATED, context_table
from .qformats import FORMATS

ALIGN = 256
DUMMY_KEY = "dummy_i32"


def _slots() -> list[tuple[object, np.ndarray]]:
    """(key, host array) of everything installed: each format's table, then the dummy."""
    out: list[tuple[object, np.ndarray]] = [(f.ggml_type, f.table) for f in FORMATS.values()]
    out.append((DUMMY_KEY, np.zeros(1, np.int32)))
    return out


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def tables_bytes() -> int:
    """Bytes the region must hold (each table at a 256-byte aligned offset)."""
    return sum(_aligned(a.nbytes) for _, a in _slots())


def install(region, stream=0) -> None:
    """Copy every table into `region` (a device uint8 array of the current context, at least
    tables_bytes() long) and make them this context's tables."""
    from numba import cuda

    need = tables_bytes()
    if region.dtype != np.uint8 or region.ndim != 1 or region.size < need:
        raise ValueError(f"format tables need a uint8 region of {need} bytes, got "
                         f"{region.dtype} {tuple(region.shape)}")
    # the simulator's kernels read the host tables directly: there the copies are made, not used
    ctx = None if SIMULATED else int(cuda.current_context().handle)
    off = 0
    for key, a in _slots():
        view = region[off:off + a.nbytes].view(a.dtype)
        view.copy_to_device(np.ascontiguousarray(a), stream=stream)
        if ctx is not None:
            _TABLES[(ctx, key)] = view
        off += _aligned(a.nbytes)


def uninstall(region) -> None:
    """Forget the tables install() put in `region` (before the arena holding it is freed), so a
    later launch outside an engine makes its own instead of reading freed memory."""
    if SIMULATED:
        return
    # addresses are unique across the contexts of one process (unified addressing), so this
    # needs no current context: a split's stages close under any GPU's
    start = int(region.device_ctypes_pointer.value or 0)
    end = start + int(region.nbytes)
    for key in list(_TABLES):
        if start <= int(_TABLES[key].device_ctypes_pointer.value or 0) < end:
            del _TABLES[key]


def dummy_i32():
    """A 1-element int32 device array standing in for an unused argument: the installed one of
    the current context, else one made on first use (outside an engine)."""
    from numba import cuda

    if SIMULATED:
        return cuda.to_device(np.zeros(1, np.int32))
    return context_table(DUMMY_KEY, lambda: np.zeros(1, np.int32))
