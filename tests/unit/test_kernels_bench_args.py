"""`python -m strata.bench.kernels` refuses bad arguments before it touches a GPU: an unknown
group or weight format is named, with what is known, and the exit status is 2."""

from __future__ import annotations

from strata.bench import kernels


def test_unknown_format_is_named(capsys):
    assert kernels.main(["--only", "matvec", "--formats", "IQ4_XS,Q9_Z"]) == 2
    err = capsys.readouterr().err
    assert "unknown formats ['Q9_Z']" in err and "IQ4_XS" in err


def test_unknown_group_is_named(capsys):
    assert kernels.main(["--only", "matvecs"]) == 2
    assert "unknown groups ['matvecs']" in capsys.readouterr().err


def test_wanted_keeps_the_given_formats_in_order():
    ctx = kernels.Ctx.__new__(kernels.Ctx)  # no stream: only the format filter
    ctx.formats = None
    assert ctx.wanted(kernels.MATVEC_FORMATS) == list(kernels.MATVEC_FORMATS)
    ctx.formats = ("IQ3_S", "Q4_K")
    assert ctx.wanted(kernels.MATVEC_FORMATS) == ["Q4_K", "IQ3_S"]


def test_prefill_bench_table_holds_decode_attention_to_both_reads():
    """The prefill-side bench's table puts a decode attention row against the ceilings' read
    and against a read of the same bytes (its row's of_read), the matvec rows' yardstick."""
    from strata.bench import kernels_prefill
    ceil = {"copy_gbps": 2700.0, "read_gbps": 2800.0, "f16_tflops": None}
    row = {"name": "decode_attn_f16_auto_s512", "ms": 0.0305, "gbps": 2198.0,
           "timing": "graph", "read_ms": 0.0236, "of_read": 0.0236 / 0.0305}
    text = kernels_prefill._table(ceil, [row])
    line = text.splitlines()[-1]
    assert line.startswith("decode_attn_f16_auto_s512") and "78%  >=60% read (graph)" in line
    assert line.endswith("77% of a read of the same bytes")
