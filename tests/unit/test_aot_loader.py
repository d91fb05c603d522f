"""Kernels served from a bundle through numba-cuda's dispatcher, without a GPU: the argmax kernel
is compiled ahead of time (sm_80..sm_120 cubins + PTX), then its dispatcher, asked to compile,
gets numba's own `_Kernel` around the bundled cubin instead; a kernel missing from the bundle is
refused with its name in a frozen app and left to the JIT in a developer install. The CUDA
simulator cannot do this, so the checks run in one child process with it off."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from numba import types
    from strata.aot import runtime
    from strata.aot.build import compile_one, registry
    from strata.aot.bundle import write_bundle, KernelBundle
    from strata.cuda_kernels import sampling

    out = Path(sys.argv[1])
    check = registry("sampling", "argmax")[0]
    fn, sig = check.build()
    fields, images = compile_one(fn, sig)
    fields["name"] = "sampling/argmax"
    assert sorted(images) == ["compute_90", "sm_120", "sm_80", "sm_86", "sm_89", "sm_90"], images
    assert all(images[t][:4] == b"\\x7fELF" for t in images if t.startswith("sm_"))
    assert b".entry " + fields["symbol"].encode() in images["compute_90"]
    write_bundle(out, [(fields, images)], toolchain={}, archs=sorted(images))

    bundle = runtime.attach(path=out, jit_fallback=False, device_cc=lambda: (8, 7))
    assert runtime.attached() is bundle and len(bundle) == 1
    kern = sampling.argmax_kernel.compile(tuple(sig))
    assert type(kern).__name__ == "_Kernel" and kern.entry_name == fields["symbol"]
    code = kern._codelibrary._cubin_cache[(8, 7, "")]
    assert bytes(code.code) == images["sm_86"]           # 8.7 runs the sm_86 cubin
    assert runtime.stats().loaded == {"sm_86": 1}
    assert sampling.argmax_kernel.compile(tuple(sig)) is kern   # served once, then numba's

    wrong = (types.float64[::1],) + tuple(sig)[1:]
    try:
        sampling.argmax_kernel.compile(wrong)
    except runtime.KernelNotBundledError as e:
        assert "argmax_kernel(array(float64, 1d, C)" in str(e), e
    else:
        raise AssertionError("a kernel missing from the bundle was not refused")

    from strata.aot.loader import BundleCache
    lenient = BundleCache(bundle, sampling.argmax_kernel.py_func, jit_fallback=True,
                          device_cc=lambda: (9, 0))
    assert lenient.load_overload(wrong, None) is None    # left to numba's compiler
    bounded = BundleCache(bundle, sampling.argmax_kernel.py_func, jit_fallback=True,
                          device_cc=lambda: (9, 0), targetoptions={"launch_bounds": (128, 4)})
    assert bounded.load_overload(tuple(sig), None) is None  # built without those bounds
    hopper = BundleCache(bundle, sampling.argmax_kernel.py_func, jit_fallback=False,
                         device_cc=lambda: (9, 0))
    k90 = hopper.load_overload(tuple(sig), None)
    assert bytes(k90._codelibrary._cubin_cache[(9, 0, "a")].code) == images["sm_90"]
    blackwell = BundleCache(bundle, sampling.argmax_kernel.py_func, jit_fallback=False,
                            device_cc=lambda: (10, 0))
    k100 = blackwell.load_overload(tuple(sig), None)    # no cubin: the driver JITs the PTX
    assert bytes(k100._codelibrary._cubin_cache[(10, 0, "a")].code) == images["compute_90"]

    import os
    os.environ["STRATA_KERNEL_BUNDLE"] = str(out)
    from strata.aot.selfcheck import check_bundle, registered_keys
    partial = check_bundle(require_complete=False)
    assert partial.ok and "1 kernels" in partial.detail, partial
    full = check_bundle(require_complete=True)
    n = len(registered_keys())
    assert not full.ok and f"1/{n} registered" in full.detail, full

    runtime.detach()
    from numba.cuda.dispatcher import CUDADispatcher
    assert CUDADispatcher.compile.__name__ == "compile"   # numba's own again
    print("OK")
""")


def test_bundled_kernel_is_served_through_numbas_dispatcher(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "STRATA_KERNEL_BUNDLE")}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "k.zip")], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), \
        proc.stdout[-3000:] + proc.stderr[-5000:]


def test_attach_is_a_no_op_without_a_bundle():
    from strata.aot import runtime
    assert runtime.bundle_path(environ={}) is None  # not frozen, no $STRATA_KERNEL_BUNDLE
    assert runtime.attach() is None and runtime.attached() is None
