"""What ptxas makes of a kernel's PTX, without a GPU: its registers a thread (which decide how
many blocks an SM holds), spills to local memory and stack frame, read from `ptxas -v`.

Optional: it needs a CUDA toolkit's ptxas (`find`). NVVM writes the newest PTX ISA version it
knows, which an older ptxas refuses ("Unsupported .version 9.5; current version is '9.0'"):
the version line is then lowered to the one ptxas names and the PTX assembled again (the
kernels use nothing an sm_90 ptxas of that version lacks; if they did, ptxas says so).
`python -m strata.cuda_kernels.compile_check --ptxas` prints these per kernel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Callable

_VERSION = re.compile(r"^\.version\s+\d+\.\d+", re.M)
_REFUSED = re.compile(r"Unsupported \.version [\d.]+; current version is '(\d+\.\d+)'")
_REGS = re.compile(r"Used (\d+) registers")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def wheel_ptxas() -> str | None:
    """ptxas of an installed nvidia-cuda-nvcc wheel (`pip install "cuda-toolkit[nvcc]"`; the
    `dev` extra has it): nvidia/cu13/bin (CUDA 13) or nvidia/cuda_nvcc/bin (CUDA 12)."""
    name = "ptxas.exe" if os.name == "nt" else "ptxas"
    for root in sys.path:
        for sub in (("nvidia", "cu13", "bin"), ("nvidia", "cuda_nvcc", "bin")):
            path = os.path.join(root or ".", *sub, name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return None


def find() -> str | None:
    """The ptxas on PATH, else the one under CUDA_HOME / CUDA_PATH, else an nvidia-cuda-nvcc
    wheel's, else None."""
    exe = shutil.which("ptxas")
    if exe:
        return exe
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        path = os.path.join(root, "bin", "ptxas") if root else ""
        if path and os.access(path, os.X_OK):
            return path
    return wheel_ptxas()


def version(exe: str | None = None) -> str | None:
    """`ptxas --version`'s release line (e.g. "Cuda compilation tools, release 13.5, V13.5.37"),
    or None without a ptxas."""
    exe = exe or find()
    if exe is None:
        return None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
    lines = [ln for ln in out.splitlines() if "release" in ln]
    return lines[-1].strip() if lines else out.strip()[-80:]


def parse(stderr: str) -> dict[str, int]:
    """{registers, stack_bytes, spill_bytes} of `ptxas -v` output for one kernel (spill bytes:
    stores and loads). ValueError where it has no register line."""
    regs = _REGS.search(stderr)
    if regs is None:
        raise ValueError(f"no register count in ptxas output: {stderr.strip()[:200]!r}")
    frame = _FRAME.search(stderr)
    stack, stores, loads = (int(g) for g in frame.groups()) if frame else (0, 0, 0)
    return {"registers": int(regs.group(1)), "stack_bytes": stack, "spill_bytes": stores + loads}


def _run(exe: str, ptx: str, arch: str, out: str = os.devnull) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        return subprocess.run([exe, f"-arch={arch}", "-v", "-o", out, path],
                              capture_output=True, text=True, timeout=600)


def _assemble(ptx: str, arch: str, exe: str | None,
              run: Callable[[str, str, str], subprocess.CompletedProcess]) -> str:
    """ptxas's -v output for ptx, its version lowered where ptxas asks (see the module doc);
    RuntimeError with ptxas's message where it fails."""
    exe = exe or find()
    if exe is None:
        raise RuntimeError("no ptxas: put a CUDA toolkit's bin on PATH or set CUDA_HOME")
    r = run(exe, ptx, arch)
    older = _REFUSED.search(r.stderr)
    if r.returncode != 0 and older:
        r = run(exe, _VERSION.sub(f".version {older.group(1)}", ptx, count=1), arch)
    if r.returncode != 0:
        raise RuntimeError(f"ptxas failed: {r.stderr.strip()[:300]}")
    return r.stderr


def info(ptx: str, *, arch: str = "sm_90", exe: str | None = None,
         run: Callable[[str, str, str], subprocess.CompletedProcess] = _run) -> dict[str, int]:
    """`parse` of ptxas -v on one kernel's PTX (its version lowered where ptxas asks: see the
    module doc). RuntimeError with ptxas's message where it fails; `run` is a stand-in for
    tests."""
    return parse(_assemble(ptx, arch, exe, run))


def cubin(ptx: str, *, arch: str = "sm_90", exe: str | None = None) -> bytes:
    """The cubin ptxas makes of ptx (as `info` assembles it): a whole-program compile, as the
    driver's JIT makes of numba's PTX (the kernel bundle's cubins, `strata.aot.build`)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "kernel.cubin")
        _assemble(ptx, arch, exe, lambda e, p, a: _run(e, p, a, out))
        with open(out, "rb") as f:
            return f.read()
