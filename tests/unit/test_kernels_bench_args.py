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
