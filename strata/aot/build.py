"""Compile every registered CUDA kernel specialization ahead of time into a kernel bundle.

    python -m strata.aot.build OUT.zip [--jobs N] [--family F] [-k PATTERN] [--reuse OLD.zip]
                                       [--arch sm_90,compute_90]

No GPU is needed: each kernel is typed and lowered to LLVM IR once (for the lowest architecture,
so the IR uses nothing a newer one lacks), NVVM turns that IR into PTX per architecture, and
ptxas turns each PTX into a cubin (the nvidia-cuda-nvcc wheel's, which the `dev` extra installs,
else a toolkit's: `cuda_kernels.ptxas`). Without a ptxas, cuda.core's Linker (nvJitLink) does,
and says so: nvJitLink compiles PTX as relocatable code, which on an H100 made the decode step's
normed kernels 14-17% slower than the driver's JIT of the same PTX (D1 400-404 tok/s against
424-427 on 2026-12-06, `bench/results/2026-12-06_bundle_on_gpu_h100.json`). The
specializations are the ones the kernel modules register for the compile check
(`cuda_kernels.launch.PTX_CHECKS`), the engine's kernel modules included (`registry`).
`--arch` narrows the images to some of the default architectures (a build for one's own GPU
writes a sixth of them). Exits non-zero if any kernel fails; prints a line per failure and a
summary.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from strata.aot.bundle import (
    CUBIN_ARCHS,
    PTX_ARCH,
    cubin_tag,
    options_key,
    ptx_tag,
    write_bundle,
)
from strata.aot.identity import kernel_key, signature_key

_ENTRY = re.compile(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\(")


# Kernel modules the engine imports beyond the compile check's list (they register under family
# "engine"); one that is not in this checkout is skipped.
ENGINE_MODULES = ("strata.engine.cuda.kernels", "strata.engine.cuda.mixed",
                  "strata.engine.multi.tiers", "strata.cuda_kernels.batch_attention",
                  "strata.cuda_kernels.compile_bundle")


def registry(family: str | None = None, pattern: str | None = None) -> list:
    """Every registered kernel specialization (`launch.PtxCheck`) the bundle is built from: the
    compile check's modules and the engine's, filtered by family and name substring."""
    import importlib.util

    from strata.cuda_kernels.compile_check import MODULES

    for m in MODULES + ENGINE_MODULES:
        if m in MODULES or importlib.util.find_spec(m) is not None:
            importlib.import_module(m)
    from strata.cuda_kernels.launch import PTX_CHECKS
    return [c for c in PTX_CHECKS
            if (family is None or c.family == family) and (pattern is None or pattern in c.name)]


def _checks(family: str | None, pattern: str | None):
    return registry(family, pattern)


def parse_archs(text: str | None) -> tuple[tuple[tuple[int, int], ...], tuple[int, int] | None]:
    """(cubin archs, PTX arch or None) of an `--arch` list such as "sm_90,compute_90"; None or
    "all": the defaults (CUBIN_ARCHS and PTX_ARCH). Only the default architectures are accepted:
    the loader's choice of image and the kernels' tuning assume them."""
    if text is None or text.strip() in ("", "all"):
        return CUBIN_ARCHS, PTX_ARCH
    known = {cubin_tag(cc): cc for cc in CUBIN_ARCHS}
    cubins, ptx = [], None
    for tag in (t.strip() for t in text.split(",") if t.strip()):
        if tag in known:
            cubins.append(known[tag])
        elif tag == ptx_tag(PTX_ARCH):
            ptx = PTX_ARCH
        else:
            raise ValueError(f"--arch {tag!r}: expected some of "
                             f"{', '.join(list(known) + [ptx_tag(PTX_ARCH)])} or all")
    if not cubins and ptx is None:
        raise ValueError("--arch: no architecture given")
    return tuple(sorted(set(cubins))), ptx


def compile_one(py_func, sig, options: dict | None = None, *,
                archs: tuple = (CUBIN_ARCHS, PTX_ARCH)) -> tuple[dict, dict[str, bytes]]:
    """(entry fields, {tag: image}) of one kernel specialization: cubins for `archs`' cubin
    architectures (default CUBIN_ARCHS) and the PTX of its PTX architecture (default PTX_ARCH;
    None: no PTX). `options`: the registry's compile options (e.g. launch bounds), the same
    the kernel's dispatcher compiles with."""
    from numba.cuda.compiler import _compile_pyfunc_with_fixup

    options = dict(options or {})
    cubin_archs, ptx_arch = archs
    every = tuple(cubin_archs) + ((ptx_arch,) if ptx_arch else ())
    lowest = min(every)
    lib, _ = _compile_pyfunc_with_fixup(py_func, sig, device=False, cc=lowest, abi="numba",
                                        **options)
    if lib._linking_files or lib.needs_cudadevrt:
        raise RuntimeError("links external code (files or cudadevrt), which the bundle cannot "
                           "carry")
    images: dict[str, bytes] = {}
    symbol = None
    for cc in sorted(set(every)):
        (ptx,) = lib.get_asm_strs(cc=cc)
        found = _ENTRY.findall(ptx)
        if len(found) != 1:
            raise RuntimeError(f"expected one .entry in the PTX, found {len(found)}")
        symbol = found[0]
        if cc in cubin_archs:
            images[cubin_tag(cc)] = _assemble(ptx, cubin_tag(cc))
        if cc == ptx_arch:
            images[ptx_tag(cc)] = ptx.encode() + b"\0"  # the driver reads it as a C string
    argtypes = tuple(sig.args) if hasattr(sig, "args") else tuple(sig)
    fields = {"kernel": kernel_key(py_func), "signature": signature_key(argtypes), "name": "",
              "symbol": symbol, "cooperative": bool(lib.use_cooperative),
              "options": options_key(options)}
    return fields, images


def _ptxas() -> str | None:
    """The nvidia-cuda-nvcc wheel's ptxas first (the version of the wheels' NVVM, which wrote
    the PTX), else a toolkit's."""
    from strata.cuda_kernels import ptxas
    return ptxas.wheel_ptxas() or ptxas.find()


def assembler() -> str:
    """What turns the bundle's PTX into cubins: "ptxas <its release>" (whole-program, as the
    driver's JIT), else "nvJitLink" (relocatable code: slower kernels; see the module doc)."""
    from strata.cuda_kernels import ptxas
    exe = _ptxas()
    return f"ptxas {ptxas.version(exe) or exe}" if exe else "nvJitLink"


def _assemble(ptx: str, arch: str) -> bytes:
    from strata.cuda_kernels import ptxas
    exe = _ptxas()
    if exe is not None:
        return ptxas.cubin(ptx, arch=arch, exe=exe)
    from cuda.core import Linker, LinkerOptions, ObjectCode
    return bytes(Linker(ObjectCode.from_ptx(ptx.encode()),
                        options=LinkerOptions(arch=arch)).link("cubin").code)


def _compile_range(args: tuple[str | None, str | None, list[int], tuple]) -> list[tuple]:
    family, pattern, indices, archs = args
    checks = _checks(family, pattern)
    out = []
    for i in indices:
        c = checks[i]
        t0 = time.perf_counter()
        try:
            fn, sig = c.build()
            fields, images = compile_one(fn, sig, getattr(c, "options", None), archs=archs)
            fields["name"] = f"{c.family}/{c.name}"
            out.append((i, fields, images, time.perf_counter() - t0, ""))
        except Exception as e:  # noqa: BLE001 - reported per kernel; any failure fails the build
            msg = str(e).splitlines()[0] if str(e) else ""
            out.append((i, None, None, time.perf_counter() - t0,
                        f"{c.family}/{c.name}: {type(e).__name__}: {msg}"[:300]))
    return out


def toolchain(how: str) -> dict:
    """Versions the bundle was built with, `how` its assembler (recorded in its index, printed
    by selfcheck)."""
    from importlib.metadata import PackageNotFoundError, version
    out = {"python": sys.version.split()[0], "assembler": how}
    for dist in ("numba", "numba-cuda", "cuda-core", "cuda-bindings", "nvidia-nvvm"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def _reused(checks: list, old_path: str | None, archs: list[str], how: str) -> dict[int, tuple]:
    """Rows for the specializations an earlier bundle already holds under the same keys (same
    source text, same captured values, same signature), read from it instead of compiled."""
    if not old_path:
        return {}
    from strata.aot.bundle import KernelBundle
    from strata.aot.identity import UnstableKeyError

    old = KernelBundle(old_path)
    if sorted(old.archs) != sorted(archs) or old.toolchain.get("assembler") != how:
        return {}  # other images, or cubins another assembler made
    rows = {}
    for i, c in enumerate(checks):
        fn, sig = c.build()
        try:
            e = old.lookup(kernel_key(fn), signature_key(tuple(sig)))
        except UnstableKeyError:
            e = None
        if e is not None:
            if e.options != options_key(getattr(c, "options", None)):
                continue  # compiled with other options: compile again
            fields = {"kernel": e.kernel, "signature": e.signature, "name": f"{c.family}/{c.name}",
                      "symbol": e.symbol, "cooperative": e.cooperative, "options": e.options}
            images = {tag: old._zip.read(member) for tag, member in e.images.items()}
            rows[i] = (i, fields, images, 0.0, "")
    return rows


def _archs(archs: tuple = (CUBIN_ARCHS, PTX_ARCH)) -> list[str]:
    cubins, ptx = archs
    return [cubin_tag(cc) for cc in cubins] + ([ptx_tag(ptx)] if ptx else [])


def build(out_path: str, *, family: str | None = None, pattern: str | None = None,
          jobs: int = 1, reuse: str | None = None, arch: str | None = None, log=print) -> int:
    """Compile the matching specializations into `out_path` (taking those `reuse`, an earlier
    bundle, already holds) for the architectures of `arch` (`parse_archs`; default all);
    returns the number of failures."""
    archs = parse_archs(arch)
    tags = _archs(archs)
    checks = _checks(family, pattern)
    if not checks:
        log("aot build: no kernel matches")
        return 1
    t0 = time.perf_counter()
    how = assembler()
    if how == "nvJitLink":
        log("aot build: no ptxas (pip install \"cuda-toolkit[nvcc]\", or a CUDA toolkit on "
            "PATH): cubins from nvJitLink, relocatable code, slower kernels")
    reused = _reused(checks, reuse, tags, how)
    todo = [i for i in range(len(checks)) if i not in reused]
    jobs = max(1, min(jobs, len(todo) or 1))
    parts = [(family, pattern, todo[k::jobs], archs) for k in range(jobs)]
    if jobs == 1:
        rows = _compile_range(parts[0])
    else:
        with ProcessPoolExecutor(jobs) as ex:
            rows = [r for part in ex.map(_compile_range, parts) for r in part]
    rows = sorted(rows + list(reused.values()), key=lambda r: r[0])
    failures = [r[4] for r in rows if r[1] is None]
    for f in failures:
        log(f"FAIL {f}")
    seen: dict[tuple[str, str], str] = {}
    entries = []
    for _, fields, images, _, _ in rows:
        if fields is None:
            continue
        k = (fields["kernel"], fields["signature"])
        if k in seen:  # two registry names for one specialization: one copy serves both
            continue
        seen[k] = fields["name"]
        entries.append((fields, images))
    if not failures:
        write_bundle(out_path, entries, toolchain=toolchain(how), archs=tags)
    size_mib = os.path.getsize(out_path) / 2**20 if not failures else 0.0
    log(f"aot build: {len(rows)} specializations ({len(entries)} distinct, {len(reused)} "
        f"reused), {len(failures)} failed, {' '.join(tags)}, {size_mib:.1f} MiB, "
        f"{time.perf_counter() - t0:.0f} s, {jobs} jobs, {how}")
    return len(failures)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--family")
    p.add_argument("-k", dest="pattern")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--reuse", metavar="OLD.zip",
                   help="take the kernels an earlier bundle holds under the same keys")
    p.add_argument("--arch", metavar="TAGS",
                   help="comma-separated images to build, e.g. sm_90,compute_90 (default: all: "
                        + ", ".join(_archs()) + ")")
    a = p.parse_args(argv)
    try:
        parse_archs(a.arch)
    except ValueError as e:
        print(f"aot build: {e}", file=sys.stderr)
        return 2
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        print("aot build: unset NUMBA_ENABLE_CUDASIM (the simulator cannot compile)",
              file=sys.stderr)
        return 2
    return 1 if build(a.out, family=a.family, pattern=a.pattern, jobs=a.jobs,
                      reuse=a.reuse, arch=a.arch) else 0


if __name__ == "__main__":
    sys.exit(main())
