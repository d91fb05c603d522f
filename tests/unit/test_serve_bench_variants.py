"""The serving benches' kernel variants without a device: serve_matvec's kernel list (one and
two row tiles a warp of the tensor-core matvec), serve_batch's `--profile-variants` (the step's
launchers wrapped for the profile only, the real ones back after, a warm step with the
positions held) and their refusals."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest


def test_serve_matvec_times_both_tensor_core_variants_where_the_format_has_them():
    from strata.bench.serve_matvec import kernels_for

    assert kernels_for(1, True) == ["lane"]
    assert kernels_for(8, True) == ["lane_batch", "tc", "tc_r2"]
    assert kernels_for(8, False) == ["lane_batch"]
    assert kernels_for(4, True, ("tc_r2",)) == ["tc_r2"]


@pytest.mark.parametrize("kernels", ["tc,tc_r3", ","])
def test_serve_matvec_refuses_unknown_kernels(kernels, capsys):
    from strata.bench.serve_matvec import main

    with pytest.raises(SystemExit):   # refused before any device work
        main(["--kernels", kernels])
    assert "expected names from lane, lane_batch, tc, tc_r2" in capsys.readouterr().err


def test_profile_variants_parse_and_refusals(capsys):
    from strata.bench.serve_batch import main, parse_variants

    assert parse_variants("moe_tc, tc_r2,tc_r2+moe_tc") == [("moe_tc",), ("tc_r2",),
                                                           ("moe_tc", "tc_r2")]
    assert parse_variants("") == []
    with pytest.raises(ValueError, match="unknown variant 'moe'"):
        parse_variants("tc_r2,moe")
    for args, why in ((["--profile-rows", "8", "--profile-variants", "tc_r4"],
                       "unknown variant 'tc_r4'"),
                      (["--profile-variants", "moe_tc"], "needs --profile-rows")):
        with pytest.raises(SystemExit):   # refused before any model is opened
            main(["-m", "no-such.gguf", "--clients", "1,8"] + args)
        assert why in capsys.readouterr().err


def test_step_variant_wraps_the_launchers_and_gives_them_back():
    from strata.bench.serve_batch import step_variant

    calls = []
    mod = SimpleNamespace(batch_moe_decode=lambda *a, **k: calls.append(("moe", a, k)),
                          matvec_tc=lambda *a, **k: calls.append(("tc", a, k)))
    real = dict(vars(mod))
    with step_variant(mod, ("moe_tc", "tc_r2")):
        mod.batch_moe_decode("x", layer=3)
        mod.matvec_tc("w", 12, "x", "y", stream=0)
    assert calls == [("moe", ("x",), {"layer": 3, "tensor_cores": True}),
                     ("tc", ("w", 12, "x", "y"), {"stream": 0, "rows_per_warp": 2})]
    assert vars(mod) == real
    with pytest.raises(RuntimeError), step_variant(mod, ("moe_tc",)):
        raise RuntimeError("a failed profile")
    assert vars(mod) == real


def test_profile_rows_with_a_variant_warms_the_step_with_positions_held(monkeypatch):
    """The variant's kernels run once plainly (advance_seq_len left out) before the profile
    captures its graphs; the profile sees the wrapped launchers; the step module is as it was
    after."""
    import strata.engine.cuda.batch_step as bs
    import strata.engine.cuda.profile as profile_mod
    from strata.bench.serve_batch import profile_rows

    launched = []
    monkeypatch.setattr(bs, "batch_moe_decode", lambda *a, **k: launched.append(("moe", k)))
    monkeypatch.setattr(bs, "advance_seq_len", lambda *a, **k: launched.append(("advance", k)))
    before = {n: getattr(bs, n) for n in ("batch_moe_decode", "advance_seq_len", "matvec_tc")}

    class Stream:
        def synchronize(self):
            launched.append(("sync", {}))

    class Tokens:   # the step's token buffer: a slice of it takes the host copy
        def __getitem__(self, rows):
            return self

        def copy_to_device(self, tok, stream=None):
            assert tok.dtype == np.int32

    class Step:
        def record(self, stream, n):
            bs.batch_moe_decode("normed", layer=0)
            bs.advance_seq_len("seq_len")

    engine = SimpleNamespace(m=SimpleNamespace(acts={"step_tokens": Tokens()},
                                               stream=Stream()),
                             shape=SimpleNamespace(n_vocab=50), step=Step(),
                             prefill=lambda slot, tokens: None, release=lambda slot: None)

    def fake_profile(step, *, module, launchers, record, frozen):
        assert module is bs and "batch_moe_decode" in launchers and frozen == ("advance_seq_len",)
        launched.append(("profile", {}))
        record("stream")
        return {"step": {"ms": 1.0, "nodes": 2}}

    monkeypatch.setattr(profile_mod, "profile_step", fake_profile)
    out = profile_rows(engine, [2], 4, variant=("moe_tc",))
    assert out == {"2": {"step": {"ms": 1.0, "nodes": 2}}}
    assert launched == [("moe", {"layer": 0, "tensor_cores": True}), ("sync", {}), ("sync", {}),
                        ("profile", {}), ("moe", {"layer": 0, "tensor_cores": True}),
                        ("advance", {})]
    assert {n: getattr(bs, n) for n in before} == before
