"""Probe (not part of the engine): the SASS of registered kernels without a GPU, for kernels whose
speed is bound by their instruction count (the lane matvecs of IQ3_S, IQ4_XS and Q6_K at large
shapes). Each kernel is compiled as the compile check does (`compile_check.canonical_ptx`'s
`compile_ptx` for sm_90), assembled by ptxas into a cubin and disassembled by nvdisasm; per loop
(a backward branch) it prints the instructions of the loop's body, by opcode, and how many of them
copy a uniform register into a register (constants ptxas hands out once a use), so a change to a
decoder can be read as instructions a step before a GPU times it.

    python bench/probes/sass_loops.py -k matvec_lanes_x8_IQ3_S_f32 [--nvdisasm PATH] [--top 12]

nvdisasm comes with a CUDA toolkit or the `nvidia-cuda-nvdisasm` wheel (its bin/ folder); ptxas
as `cuda_kernels/ptxas.py` finds it. Run with the CUDA simulator off.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

from strata.cuda_kernels import compile_check, ptxas

_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_TARGET = re.compile(r"(\.L_x_\d+)")


def sass(ptx: str, exe_nvdisasm: str) -> str:
    """nvdisasm's listing of the cubin ptxas makes of ptx (`ptxas.cubin`)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(ptxas.cubin(ptx))
        return subprocess.run([exe_nvdisasm, "-c", "-g", path], capture_output=True, text=True,
                              check=True, timeout=600).stdout


# A register written from a uniform register alone: how ptxas hands a constant it keeps in a
# uniform register to an operand that takes only registers (a `prmt`'s data words), once a use.
_UR_COPY = re.compile(r"^(IMAD\.U32 R\d+, RZ, RZ, UR\d+|MOV R\d+, UR\d+)\s*$")


def loops(listing: str) -> tuple[list[tuple[str, list[tuple[str, str]]]], list[str]]:
    """((label, (opcode, operands) of each instruction of the body) per backward branch of the
    listing, smallest first; every instruction's opcode)."""
    insns, labels = [], {}
    for line in listing.splitlines():
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = len(insns)
            continue
        m = _INSN.search(line)
        if m:
            insns.append((m.group(3), m.group(4)))
    found = []
    for i, (op, rest) in enumerate(insns):
        if op.startswith("BRA"):
            t = _TARGET.search(rest)
            if t and t.group(1) in labels and labels[t.group(1)] <= i:
                found.append((t.group(1), insns[labels[t.group(1)]:i + 1]))
    return sorted(found, key=lambda f: len(f[1])), [o for o, _ in insns]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", required=True, help="substring of the registered kernels' names")
    ap.add_argument("--nvdisasm", default=shutil.which("nvdisasm"))
    ap.add_argument("--top", type=int, default=12, help="opcodes listed per loop")
    a = ap.parse_args()
    if ptxas.find() is None or not a.nvdisasm:
        print("needs ptxas (a CUDA toolkit) and nvdisasm (--nvdisasm PATH)", file=sys.stderr)
        return 2
    checks = compile_check._checks(None, a.k)
    if not checks:
        print(f"no registered kernel matches {a.k!r}", file=sys.stderr)
        return 2
    for c in checks:
        body, every = loops(sass(compile_check.canonical_ptx(c), a.nvdisasm))
        print(f"\n{c.name}: {len(every)} instructions")
        for label, ops in body:
            count = collections.Counter(op.split(".")[0] for op, _ in ops)
            copies = sum(1 for op, rest in ops if _UR_COPY.match(f"{op}{rest}".strip()))
            print(f"  loop {label}: {len(ops)} instructions ({copies} copies from uniform "
                  "registers): " + ", ".join(f"{op} {n}" for op, n in count.most_common(a.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
