"""Loading CUDA kernels from the bundle instead of compiling them.

numba-cuda's dispatcher asks its cache for a kernel before it compiles one
(`CUDADispatcher.compile` -> `self._cache.load_overload(sig, ctx)`; a developer install has a
`NullCache` there). `attach()` gives every kernel dispatcher a `BundleCache` on its first compile:
a kernel found in the bundle (by `identity.kernel_key` and `identity.signature_key`) is rebuilt as
numba's own `_Kernel` around the cubin for this GPU, so launches, CUDA graphs and argument
handling stay numba's; nothing is typed, lowered or linked. A kernel not in the bundle is compiled
as before when a compiler is present (a developer install pointed at a bundle), and refused with
its name in the frozen app, which carries no compiler.

The bundle is found at `$STRATA_KERNEL_BUNDLE`, else beside this module in a frozen build;
without either, `attach()` does nothing and numba-cuda behaves as it always does.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from strata.aot.bundle import BundleError, KernelBundle

ENV_BUNDLE = "STRATA_KERNEL_BUNDLE"
BUNDLE_NAME = "strata_kernels.zip"


def frozen() -> bool:
    return bool(getattr(sys, "frozen", False))


def bundle_path(environ=os.environ) -> Path | None:
    """Where the kernel bundle is: $STRATA_KERNEL_BUNDLE, else the frozen app's copy; None when
    there is none (a developer install)."""
    if environ.get(ENV_BUNDLE):
        return Path(environ[ENV_BUNDLE])
    if frozen():
        p = Path(getattr(sys, "_MEIPASS", "")) / "strata" / "aot" / BUNDLE_NAME
        return p if p.is_file() else None
    return None


class KernelNotBundledError(BundleError):
    """The frozen app was asked for a kernel specialization its bundle lacks."""


@dataclass(slots=True)
class LoadStats:
    """What the bundle served in this process: loads per image tag, and the misses."""

    loaded: dict[str, int] = field(default_factory=dict)
    missed: list[str] = field(default_factory=list)


_STATE: dict[str, object] = {}


def attached() -> KernelBundle | None:
    """The bundle kernels load from in this process, or None."""
    return _STATE.get("bundle")  # type: ignore[return-value]


def stats() -> LoadStats:
    return _STATE.setdefault("stats", LoadStats())  # type: ignore[return-value]


def attach(*, path: Path | None = None, jit_fallback: bool | None = None,
           device_cc=None) -> KernelBundle | None:
    """Load kernels from the bundle from now on (idempotent; a no-op without a bundle).
    `jit_fallback` (default: not frozen) lets a kernel missing from the bundle be compiled;
    `device_cc` overrides how the GPU's compute capability is read (tests)."""
    if "bundle" in _STATE:
        return attached()
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return None  # the simulator runs Python, not cubins
    path = path or bundle_path()
    if path is None:
        return None
    bundle = KernelBundle(path)
    from numba.cuda.core.caching import NullCache
    from numba.cuda.dispatcher import CUDADispatcher

    from strata.aot.loader import BundleCache

    fallback = (not frozen()) if jit_fallback is None else jit_fallback
    original = CUDADispatcher.compile

    def compile_from_bundle(self, sig):
        # a dispatcher keeps numba's NullCache until its first compile; a disk cache someone
        # enabled (cache=True) is left alone
        if type(self._cache) is NullCache and not self.targetoptions.get("device"):
            self._cache = BundleCache(bundle, self.py_func, jit_fallback=fallback,
                                      device_cc=device_cc, targetoptions=self.targetoptions)
        return original(self, sig)

    compile_from_bundle.__wrapped__ = original
    CUDADispatcher.compile = compile_from_bundle
    _STATE["bundle"] = bundle
    _STATE["original"] = original
    return bundle


def detach() -> None:
    """Undo `attach` (tests): new compiles go to numba again."""
    if "original" in _STATE:
        from numba.cuda.dispatcher import CUDADispatcher
        CUDADispatcher.compile = _STATE["original"]
    _STATE.clear()
