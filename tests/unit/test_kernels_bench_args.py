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


def test_a_reported_row_is_printed_and_kept_at_once(capsys):
    """`Ctx.report` prints a row as the table does and hands control to on_report (which main
    points at the JSON writer), so a run cut short still has every row it measured."""
    ctx = kernels.Ctx.__new__(kernels.Ctx)  # no stream: only the reporting
    ctx.reported, seen = [], []
    ctx.on_report = lambda: seen.append(list(ctx.reported))
    r = kernels.Result("matvec", "matvec Q4_K", "4096x4096", 10.0, 2_000_000, 400.0, 0.7,
                       {"us reading the same bytes": 8.0})
    assert ctx.report(r) is r
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:4] == ["matvec", "matvec", "Q4_K", "4096x4096"]
    assert "200" in out and "50%" in out and "MISS" in out  # 200 GB/s of 400, against 70%
    assert "us reading the same bytes: 8.0" in out
    assert seen == [[r]]
    kernels.print_table([r])
    assert kernels.row_line(r) in capsys.readouterr().out


def test_no_ab_is_refused_with_a_bad_format_too(capsys):
    """--no-ab is an option main knows: a bad format beside it is still the error named."""
    assert kernels.main(["--only", "moe", "--no-ab", "--formats", "Q9_Z"]) == 2
    assert "unknown formats ['Q9_Z']" in capsys.readouterr().err
