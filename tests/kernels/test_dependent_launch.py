"""Programmatic dependent launch (`cuda_kernels/dependent_launch.py`) without a GPU: the kernel
names read back from numba's mangled names, every listed kernel waiting unconditionally, and
the calls being no-ops in the simulator. The PTX side (a listed kernel compiled for sm_90 holds
`griddepcontrol.wait`; a listed name that no kernel has fails) is `compile_check`'s, and the
graph edges are tested on the GPU (tests/gpu/test_engine_gpu.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
from numba import cuda

from strata.cuda_kernels import dependent_launch as dl

KERNEL_DIR = Path(dl.__file__).parent


def test_kernel_name_reads_the_python_name():
    closure = ("_ZN8__main__4make12_3clocals_3e14lane_kernel_q4B2v1B92cw51cXTLSUwv1sDUaKthqaNgoKmjg"
               "OR3W3CwAkMXLaJtQYkOIgxJU0gCqOkEJoHkbttqdVhoqlspQGNFHSgJ5BnXagIAE5ArrayIfLi1E1A7mu"
               "table7alignedE")
    assert dl.kernel_name(closure) == "lane_kernel_q4"
    plain = ("_ZN6strata12cuda_kernels9norm_rope15rms_norm_kernelB2v1B104cw51cXTLSUwv1sDUaKthqa"
             "NgoKmjgEhasCBDCg1bcEADwxst6m1ByRAiDEllSAKoKQcmgeQT22p1WPiqWylALVUHSgJ5xrWaAA_3d_3dE5Ar"
             "rayIfLi1E1C7mutable7alignedExf")
    assert dl.kernel_name(plain) == "rms_norm_kernel"
    assert dl.kernel_name("rms_norm_kernel") == ""  # not mangled
    assert dl.kernel_name("_ZN6strata99short") == ""  # a length past the end
    assert dl.kernel_name("") == ""


def _kernel_defs() -> dict[str, list[ast.FunctionDef]]:
    out: dict[str, list[ast.FunctionDef]] = {}
    for path in sorted(KERNEL_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in dl.DEPENDENT_KERNELS:
                out.setdefault(node.name, []).append(node)
    return out


def _is_call(stmt, name: str) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == name)


def test_every_listed_kernel_waits_then_releases_unconditionally():
    """Each listed kernel calls grid_wait() once, as a statement of its own body (no branch can
    skip it), with grid_release() right after it (releasing before the wait would let the
    whole chain launch at once) and no return before it."""
    defs = _kernel_defs()
    assert set(defs) == set(dl.DEPENDENT_KERNELS), set(dl.DEPENDENT_KERNELS) - set(defs)
    for name, nodes in defs.items():
        for fn in nodes:
            body = [s for s in fn.body
                    if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            waits = [i for i, s in enumerate(body) if _is_call(s, "grid_wait")]
            assert len(waits) == 1, f"{name}: grid_wait() must be one statement of the body"
            i = waits[0]
            assert i + 1 < len(body) and _is_call(body[i + 1], "grid_release"), name
            calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Name) and n.func.id in ("grid_wait", "grid_release")]
            assert len(calls) == 2, f"{name}: one wait and one release"
            for s in body[:i]:
                assert not any(isinstance(n, ast.Return) for n in ast.walk(s)), name


def test_calls_are_no_ops_in_the_simulator():
    @cuda.jit
    def k(x, y):
        dl.grid_wait()
        dl.grid_release()
        i = cuda.grid(1)
        if i < x.size:
            y[i] = x[i] * 2

    x = np.arange(40, dtype=np.float32)
    y = np.zeros_like(x)
    k[2, 32](x, y)
    np.testing.assert_array_equal(y, 2 * x)
    assert dl.enabled() is False  # no graphs in the simulator

