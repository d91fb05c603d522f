"""`strata selfcheck`: what this build runs on, checked from inside it.

Each check returns a `Check` row; `run_checks` runs them in order. Proves, for a frozen build
(and reports, for a developer install): that `numba.cuda` is numba-cuda (not numba's old built-in
CUDA target), that cuda.core and cuda.bindings import, that the kernel bundle covers every
registered kernel specialization under the keys this process computes, that a CPU-engine numba
function runs (and whether it came from numba's disk cache), and, when a GPU is present, that a
bundled kernel launches and gives numpy's answer.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import numpy as np

from strata.aot import platform, runtime


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


def _dist_version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "no metadata"


def check_numba_cuda() -> Check:
    """numba-cuda, not numba's built-in target: only numba-cuda has numba.cuda.cext and the
    vendored numba.cuda.core."""
    import numba.cuda

    markers = [m for m in ("numba.cuda.cext", "numba.cuda.core.caching")
               if importlib.util.find_spec(m) is None]
    where = os.path.dirname(numba.cuda.__file__ or "?")
    if markers:
        return Check("numba-cuda", False, f"numba.cuda at {where} lacks {', '.join(markers)}: "
                                          f"this is numba's old built-in CUDA target")
    return Check("numba-cuda", True, f"numba-cuda {_dist_version('numba-cuda')} "
                                     f"(numba {_dist_version('numba')}) at {where}")


def check_cuda_python() -> Check:
    try:
        import cuda.bindings
        import cuda.core
        from cuda.core import ObjectCode  # noqa: F401 - the loader's entry point
    except ImportError as e:
        return Check("cuda.core", False, f"import failed: {e}")
    return Check("cuda.core", True, f"cuda.core {cuda.core.__version__}, cuda.bindings "
                                    f"{cuda.bindings.__version__}")


def check_driver() -> tuple[Check, bool]:
    name, err = platform.load_driver()
    if err is None:
        return Check("driver", True, f"{name} loads"), True
    return Check("driver", True, f"{name} not found (no GPU use here): {err[:120]}"), False


def registered_keys() -> dict[tuple[str, str], str]:
    """(kernel key, signature key) -> registry name of every registered specialization."""
    from strata.aot.build import registry
    from strata.aot.identity import kernel_key, signature_key

    out = {}
    for c in registry():
        fn, sig = c.build()
        out[(kernel_key(fn), signature_key(tuple(sig)))] = f"{c.family}/{c.name}"
    return out


def check_bundle(*, require_complete: bool) -> Check:
    path = runtime.bundle_path()
    if path is None:
        ok = not runtime.frozen()
        return Check("kernel bundle", ok, "none (a developer install compiles kernels on first "
                                          "use)" if ok else "missing from this frozen build")
    from strata.aot.bundle import BundleError, KernelBundle
    try:
        bundle = KernelBundle(path)
    except BundleError as e:
        return Check("kernel bundle", False, str(e))
    t0 = time.perf_counter()
    keys = registered_keys()
    missing = sorted(name for k, name in keys.items() if bundle.lookup(*k) is None)
    secs = time.perf_counter() - t0
    detail = (f"{len(bundle)} kernels, {' '.join(bundle.archs)}, built with "
              f"numba-cuda {bundle.toolchain.get('numba-cuda')}, cubins by "
              f"{bundle.toolchain.get('assembler', 'nvJitLink')}; {len(keys) - len(missing)}/"
              f"{len(keys)} registered specializations found ({secs:.1f} s)")
    if missing:
        detail += f"; missing e.g. {', '.join(missing[:3])}"
    return Check("kernel bundle", not (missing and require_complete), detail)


def check_cpu_numba() -> Check:
    """A CPU-engine numba function against numpy, and where its machine code came from.

    It calls `matmul.linear`, the entry the engine itself calls from Python, never one of the
    functions linear calls: compiling such a callee first as its own overload makes numba's disk
    cache hand later processes callers linked to the wrong code (seen as K-quant logits computed
    without their 8-bit activations after a run that started this way)."""
    from strata.engine.cpu import matmul
    from strata.engine.cpu.idot import x8_arrays
    from strata.engine.cpu.qdot import F32_T

    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 96)).astype(np.float32)  # [3, 96] f32 rows
    x = rng.standard_normal((1, 96)).astype(np.float32)  # [1, 96] f32
    out = np.zeros((1, 3), np.float32)                  # [1, 3] f32
    t0 = time.perf_counter()
    matmul.linear(w.view(np.uint8), F32_T, 1, x, x8_arrays(x), out, 1)
    secs = time.perf_counter() - t0
    got = float(out[0, 1])
    want = float(w[1].astype(np.float64) @ x[0].astype(np.float64))
    hits = sum(matmul.linear.stats.cache_hits.values())
    source = "loaded from numba's cache" if hits else "compiled"
    cache = os.environ.get("NUMBA_CACHE_DIR") or "numba's default"
    ok = abs(got - want) <= 1e-4 * max(1.0, abs(want)) and bool(np.isfinite(out).all())
    return Check("cpu numba", ok, f"matmul.linear row 1 = {got:.5f} (numpy {want:.5f}), {source} "
                                  f"in {secs:.2f} s; cache: {cache}")


def check_gpu_kernel() -> Check:
    """Launch the argmax kernel (bundled in a frozen build) and compare with numpy."""
    from numba import cuda

    from strata.cuda_kernels import sampling

    logits = np.random.default_rng(1).standard_normal(5000).astype(np.float32)  # [5000] f32
    d_logits = cuda.to_device(logits)
    d_tokens = cuda.to_device(np.zeros(4, np.int32))   # [4] i32 history
    d_count = cuda.to_device(np.zeros(1, np.int32))    # [1] i32
    d_state = cuda.to_device(np.zeros(2, np.uint64))   # [2] u64 best key, blocks done
    t0 = time.perf_counter()
    sampling.argmax(d_logits, d_tokens, d_count, d_state)  # several blocks: the atomics too
    cuda.synchronize()
    secs = time.perf_counter() - t0
    got = int(d_tokens.copy_to_host()[0])
    st = runtime.stats()
    cc = cuda.get_current_device().compute_capability
    loaded = ", ".join(f"{k}: {v}" for k, v in st.loaded.items()) or "none (JIT)"
    return Check("gpu kernel", got == int(np.argmax(logits)),
                 f"argmax on cc {cc[0]}.{cc[1]}: {got} (numpy {int(np.argmax(logits))}), "
                 f"{secs:.2f} s; from bundle: {loaded}")


def run_checks(*, require_complete: bool = True, gpu: str = "auto") -> list[Check]:
    """Every check in order; `gpu`: "auto" (when the driver loads), "yes" or "no"."""
    rows = [Check("build", True, f"strata {_strata_version()}, "
                                 f"{'frozen' if runtime.frozen() else 'not frozen'}, "
                                 f"python {sys.version.split()[0]}, {sys.platform}")]
    rows += [check_numba_cuda(), check_cuda_python()]
    drv, has_driver = check_driver()
    rows += [drv, check_bundle(require_complete=require_complete), check_cpu_numba()]
    if gpu == "yes" or (gpu == "auto" and has_driver):
        rows.append(_guarded("gpu kernel", check_gpu_kernel))
    return rows


def _guarded(name, fn) -> Check:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a failed check is a row, not a crash
        return Check(name, False, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")


def _strata_version() -> str:
    from strata import __version__
    return __version__
