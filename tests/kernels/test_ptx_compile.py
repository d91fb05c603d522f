"""Every registered kernel specialization compiles to PTX for sm_90 (no GPU needed).

The test process runs the CUDA simulator, which cannot emit PTX, so the check runs in one child
process with the simulator off: `python -m strata.cuda_kernels.compile_check`. Every
specialization goes through numba's typing and lowering and through NVVM at -opt=3, as the
engine compiles it; the numba-cuda patches that make this cheaper change no IR or PTX
(tests/kernels/test_lowering.py, test_inline_copy.py, test_inline_cache_ssa.py). NVVM is about a
tenth of the check's CPU time (the table's nvvm column), so the check keeps -opt=3: -O0 would
save little and would skip the optimizer and the code it hands NVVM's backend, which is where an
NVVM failure of the engine's own compile would show.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # minutes of NVVM: scheduled first (tests/conftest.py)


def test_every_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    # One compiler per core, at a lower priority: while pytest-xdist's other workers run the
    # rest of the suite they keep their cores, and once they are done the compile takes every
    # core (with one job it ran alone on one core for the last third of a 2-core CI run).
    jobs = str(max(1, os.cpu_count() or 1))
    lower = (lambda: os.nice(10)) if hasattr(os, "nice") else None
    proc = subprocess.run([sys.executable, "-m", "strata.cuda_kernels.compile_check", "--jobs", jobs],
                          env=env, capture_output=True, text=True, timeout=2400,
                          preexec_fn=lower)
    tail = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    assert " 0 failed" in proc.stdout, tail
    for family in ("dequant", "matvec", "moe", "norm_rope", "router", "elementwise", "sampling",
                   "prefill"):
        assert f"\n{family} " in proc.stdout, f"no {family} kernels were checked\n{tail}"
