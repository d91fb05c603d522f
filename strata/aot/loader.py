"""The numba side of loading bundled kernels: a cache object numba's dispatcher asks before it
compiles, and the rebuild of numba's `_Kernel` around a bundled image (see `runtime`)."""

from __future__ import annotations

from cuda.core import ObjectCode
from numba.cuda import types
from numba.cuda.codegen import CUDACodeLibrary
from numba.cuda.core import sigutils
from numba.cuda.core.caching import NullCache
from numba.cuda.dispatcher import _Kernel

from strata.aot.bundle import Entry, KernelBundle, options_key
from strata.aot.identity import UnstableKeyError, kernel_key, signature_key
from strata.aot.runtime import KernelNotBundledError, stats


def current_cc() -> tuple[int, int]:
    """The compute capability of the current context's GPU."""
    from numba.cuda.cudadrv import devices
    return tuple(devices.get_context().device.compute_capability)


def numba_cc_key(cc: tuple[int, int]) -> tuple:
    """The key numba's code library files a GPU's cubin under (`CUDACodeLibrary._ensure_cc`)."""
    return (cc[0], cc[1], "a" if tuple(cc) >= (9, 0) else "")


class BundleCache(NullCache):
    """numba's cache interface answered from the kernel bundle; never written to."""

    def __init__(self, bundle: KernelBundle, py_func, *, jit_fallback: bool, device_cc=None,
                 targetoptions: dict | None = None):
        self._bundle = bundle
        self._py_func = py_func
        self._options = options_key(targetoptions)
        self._key: str | None = None
        self._jit_fallback = jit_fallback
        self._device_cc = device_cc or current_cc

    def load_overload(self, sig, target_context):
        argtypes, _ = sigutils.normalize_signature(sig)
        sig_text = signature_key(argtypes)
        try:
            if self._key is None:
                self._key = kernel_key(self._py_func)
            entry = self._bundle.lookup(self._key, sig_text)
        except UnstableKeyError:
            entry = None
        if entry is not None and entry.options != self._options:
            entry = None  # built with other launch bounds / math flags than this dispatcher's
        if entry is None:
            name = f"{self._py_func.__module__}.{self._py_func.__qualname__}({sig_text})"
            stats().missed.append(name)
            if self._jit_fallback:
                return None  # numba compiles it, as without a bundle
            raise KernelNotBundledError(
                f"kernel {name} is not in this build's kernel bundle ({self._bundle.path.name}); "
                f"rebuild the binary, or use a developer install (pip install -e .), which "
                f"compiles kernels on first use")
        return rebuild_kernel(self._bundle, entry, argtypes, self._device_cc())


def rebuild_kernel(bundle: KernelBundle, entry: Entry, argtypes: tuple, cc: tuple[int, int]):
    """numba's `_Kernel` for `entry`, its code library holding the image for compute capability
    `cc`; the driver loads it on first launch, as it loads numba's own cubins."""
    tag, data = bundle.image(entry, cc)
    make = ObjectCode.from_ptx if tag.startswith("compute") else ObjectCode.from_cubin
    try:
        code = make(data, name=entry.symbol)
    except TypeError:  # cuda.core before 0.3 takes no name
        code = make(data)
    lib = CUDACodeLibrary._rebuild(
        codegen=None, name=entry.name, entry_name=entry.symbol, llvm_strs=[],
        ptx_cache={}, cubin_cache={numba_cc_key(cc): code},
        linkerinfo_cache={}, max_registers=None, nvvm_options={}, needs_cudadevrt=False,
        nrt=False, use_cooperative=entry.cooperative, lto=False)
    counts = stats().loaded
    counts[tag] = counts.get(tag, 0) + 1
    return _Kernel._rebuild(
        cooperative=entry.cooperative, name=entry.symbol, signature=types.void(*argtypes),
        codelibrary=lib, debug=False, lineinfo=False, call_helper=None, extensions=[])
