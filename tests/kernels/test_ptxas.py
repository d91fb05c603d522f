"""`ptxas`: registers, spills and stack of a kernel's PTX by the toolkit's ptxas, read without a
GPU; the version fallback with a stand-in ptxas, and a real one where installed."""

from __future__ import annotations

import subprocess

import pytest

from strata.cuda_kernels import ptxas

OUT = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
    32 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 127 registers, used 1 barriers, 4944 bytes smem, 1424 bytes cmem[0]
"""
PTX = """.version 9.5
.target sm_90
.address_size 64

.visible .entry k(.param .u64 p)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [p];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, 7;
    st.global.u32 [%rd2], %r1;
    ret;
}
"""


def test_parse_reads_registers_spills_and_stack():
    assert ptxas.parse(OUT) == {"registers": 127, "stack_bytes": 32, "spill_bytes": 20}
    assert ptxas.parse("ptxas info    : Used 48 registers, used 0 barriers") == {
        "registers": 48, "stack_bytes": 0, "spill_bytes": 0}
    with pytest.raises(ValueError, match="no register count"):
        ptxas.parse("ptxas info    : 0 bytes gmem")


def test_an_older_ptxas_gets_the_version_it_names():
    seen = []

    def run(exe, ptx, arch):
        seen.append(ptx.splitlines()[0])
        if ptx.startswith(".version 9.5"):
            return subprocess.CompletedProcess([], 255, "", "ptxas k.ptx, line 1; fatal   : "
                                               "Unsupported .version 9.5; current version is "
                                               "'9.0'\nptxas fatal   : Ptx assembly aborted")
        return subprocess.CompletedProcess([], 0, "", OUT)

    assert ptxas.info(PTX, exe="ptxas", run=run)["registers"] == 127
    assert seen == [".version 9.5", ".version 9.0"]


def test_a_rejected_kernel_raises_with_ptxas_message():
    def run(exe, ptx, arch):
        return subprocess.CompletedProcess([], 255, "", "ptxas fatal   : Unresolved extern "
                                           "function 'vprintf'")

    with pytest.raises(RuntimeError, match="Unresolved extern function"):
        ptxas.info(PTX, exe="ptxas", run=run)


def test_no_ptxas_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ptxas, "find", lambda: None)
    with pytest.raises(RuntimeError, match="no ptxas"):
        ptxas.info(PTX)


def test_compile_check_asks_for_ptxas_where_there_is_none(monkeypatch, capsys):
    from strata.cuda_kernels import compile_check
    monkeypatch.setattr(ptxas, "find", lambda: None)
    assert compile_check.main(["--ptxas", "-k", "rope_kv_f16"]) == 2
    assert "--ptxas needs a CUDA toolkit's ptxas" in capsys.readouterr().err


@pytest.mark.skipif(ptxas.find() is None, reason="no CUDA toolkit ptxas on this machine")
def test_the_installed_ptxas_on_a_small_kernel():
    got = ptxas.info(PTX)
    assert 1 <= got["registers"] <= 16 and got["spill_bytes"] == 0 and got["stack_bytes"] == 0


@pytest.mark.skipif(ptxas.find() is None, reason="no CUDA toolkit ptxas on this machine")
def test_the_installed_ptxas_makes_a_cubin():
    assert ptxas.cubin(PTX)[:4] == b"\x7fELF"  # what a disassembler reads (`sass_loops.py`)


def test_a_cubin_without_ptxas_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ptxas, "find", lambda: None)
    with pytest.raises(RuntimeError, match="no ptxas"):
        ptxas.cubin(PTX)
