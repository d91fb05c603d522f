"""The CUDA engine's own kernels (strata.engine.cuda.kernels, .mixed) compile to PTX for sm_90,
in a child process with the simulator off (the test process runs the simulator, which emits
none), the mixed-format MoE kernels for every one of the 21 expert formats."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
from numba import cuda
from strata.cuda_kernels.launch import PTX_CHECKS
import strata.engine.cuda.kernels  # registers the engine family
import strata.engine.cuda.mixed
done = 0
for c in PTX_CHECKS:
    if c.family == "engine":
        fn, sig = c.build()
        ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0))
        assert ".target sm_90" in ptx, c.name
        print(c.name, len(ptx))
        done += 1
print("compiled", done)
"""


def test_engine_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "compiled 47" in proc.stdout  # 5 + gate/up and down for 21 formats
    for name in ("rms_norm_f16", "fill_positions", "mask_ids", "gather_rows", "swiglu_part",
                 "proj_mixed_IQ3_S", "down_mixed_IQ4_NL", "proj_mixed_Q4_0"):
        assert name in proc.stdout
