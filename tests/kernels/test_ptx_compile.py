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


# The 64-bit divisions (static, in PTX) the D1 decode step's kernels held on 2026-12-02, after
# the ones in their loops were removed: gate/up's two split its first item and its stride by k
# (once a warp; the fused MoE kernel holds the same two); the head's rounds kernel counts its
# units once. The head (Q6_K, 255 MB) dots 8-bit x since 2026-12-03 (`matvec.x8_pays`).
# More means a new one: look where it runs before raising a budget.
DIV64_BUDGET = {
    "moe_gate_up_lanes_x8_Q4_K": 2, "moe_down_lanes_Q4_K": 0, "moe_down_lanes_Q6_K": 0,
    "matvec_lanes_x8_Q4_K_f32": 0, "matvec_lanes_normed_x8_Q4_K": 0,
    "matvec_lanes_mixed_normed_x8_Q4_K_Q6_K": 0, "matvec_lanes_rounds_x8_Q6_K_f32": 1,
    "router_normed_F32": 2, "rope_kv_f16": 0, "moe_fused_lanes_x8_Q4_K_Q6_K": 2,
    "rope_kv_int8": 0,
}


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
    problems = over_budget(div64_table(proc.stdout), DIV64_BUDGET)
    assert not problems, "\n".join(problems) + "\n" + tail


def div64_table(stdout: str) -> dict[str, int]:
    """kernel -> 64-bit divisions, from compile_check's table (compiled kernels' rows only)."""
    div64 = {}
    for line in stdout.splitlines():
        f = line.split()
        if len(f) >= 8 and f[2] == "ok" and f[3].isdigit():  # a kernel's row, not the header
            div64[f[1]] = int(f[5])
    return div64


def over_budget(div64: dict[str, int], budgets: dict[str, int]) -> list[str]:
    """What breaks a budget: a kernel over it, or missing from the table."""
    out = []
    for name, budget in budgets.items():
        if name not in div64:
            out.append(f"{name} was not in the table")
        elif div64[name] > budget:
            out.append(
                f"{name}: {div64[name]} 64-bit divisions in its PTX, at most {budget} expected. "
                "A `range` with a runtime step divides for its trip count, and so does `//` or "
                "`%` of runtime integers: in a decode loop that is ~30 instructions an iteration "
                "(D1 gained 4% when they left, README). Use a while loop or carry the quotient.")
    return out


def test_div64_budget_reads_the_table():
    table = ("family       kernel                             ok   ptx lines  local div64  "
             "numba s  nvvm s\n"
             "moe          moe_gate_up_lanes_x8_Q4_K          ok        2035      -     3     "
             "3.25    0.30 \n"
             "rope_kv      rope_kv_f16                        ok         927    yes     0     "
             "0.57    0.13 \n"
             "matvec       matvec_broken                      FAIL         0      -     0     "
             "0.10    0.00 TypingError: no\n")
    div64 = div64_table(table)
    assert div64 == {"moe_gate_up_lanes_x8_Q4_K": 3, "rope_kv_f16": 0}
    assert over_budget(div64, {"rope_kv_f16": 0, "moe_gate_up_lanes_x8_Q4_K": 3}) == []
    problems = over_budget(div64, {"moe_gate_up_lanes_x8_Q4_K": 2, "matvec_broken": 0})
    assert len(problems) == 2 and "3 64-bit divisions" in problems[0]
    assert "not in the table" in problems[1]
