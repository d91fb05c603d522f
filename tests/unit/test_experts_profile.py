"""Routing profiles: counts recorded with the CPU engine equal the top-k the float64 reference
picks, the file round-trips into the planner's ranking, `strata profile` end to end, errors."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.engine_models import PROMPT, model_path
from helpers.reference import RefModel, _softmax, rms_norm
from strata.cli.main import main
from strata.engine.cpu import CpuEngine
from strata.experts import ProfileError, RoutingCounts, load_counts, profile_source
from strata.experts.profile import coverage_table, read_prompts, record
from strata.gguf import open_model
from strata.plan.knobs import load_profile


def _reference_counts(path, prompt) -> np.ndarray:
    """Each layer's top-k for every prompt token, from the float64 reference's own forward."""
    m = RefModel.load(path)
    from helpers import reference as ref
    tokens = np.asarray(prompt)
    pos = np.arange(tokens.size)
    h = m.t["token_embd"][tokens]
    n_expert = m.t["blk.0.ffn_gate_inp"].shape[0]
    counts = np.zeros((m.n_layer, n_expert), np.int64)
    for il in range(m.n_layer):
        b = f"blk.{il}."
        h = h + ref._attention(m, rms_norm(h, m.t[b + "attn_norm"], m.eps), il, pos)
        x = rms_norm(h, m.t[b + "ffn_norm"], m.eps)
        probs = _softmax(x @ m.t[b + "ffn_gate_inp"].T)
        for row in probs:
            counts[il, np.argsort(-row, kind="stable")[:m.n_expert_used]] += 1
        h = h + ref._moe(m, x, il)
    return counts


def test_recorded_counts_match_the_reference(tmp_models):
    path = model_path(tmp_models, "Q8_0")
    mf = open_model(path)
    s = mf.shape
    counts = RoutingCounts(s.n_layer, s.n_expert)
    engine = CpuEngine(mf, max_context=64, cb=counts.callback())
    n = record(engine, [PROMPT], counts).tokens
    assert n == len(PROMPT)
    np.testing.assert_array_equal(counts.counts, _reference_counts(path, PROMPT))
    assert counts.counts.sum() == s.n_layer * len(PROMPT) * s.n_expert_used


def test_decoded_tokens_are_counted(tmp_models):
    mf = open_model(model_path(tmp_models, "Q8_0"))
    s = mf.shape
    counts = RoutingCounts(s.n_layer, s.n_expert)
    done = record(CpuEngine(mf, max_context=64, cb=counts.callback()), [PROMPT, PROMPT[:3]],
                  counts, n_predict=2)
    n = done.tokens
    assert n == len(PROMPT) + 3 + 4 and done.cut_short == 0
    assert counts.counts.sum() == s.n_layer * n * s.n_expert_used


def test_profile_file_round_trip_ranks_the_plan(tmp_path, tmp_models):
    mf = open_model(model_path(tmp_models, "Q8_0"))
    s = mf.shape
    counts = RoutingCounts(s.n_layer, s.n_expert)
    counts.counts[:] = np.arange(s.n_expert)[::-1] + 10 * np.arange(s.n_layer)[:, None]
    path = counts.save(tmp_path / "p")
    assert path.name == "p.npy"
    np.testing.assert_array_equal(load_counts(path, s.n_layer, s.n_expert), counts.counts)
    prof = load_profile(mf.metadata, s.n_layer, s.n_expert, str(path))
    assert prof.source == "counts"
    assert (prof.rank[:, 0] == 0).all()  # the most counted expert ranks first
    assert "routing profile" in profile_source(mf.metadata, str(path))
    with pytest.raises(ProfileError, match=r"\[3, 4\]"):
        load_counts(path, 3, 4)


def test_profile_source_names_each_source(tmp_models):
    mf = open_model(model_path(tmp_models, "Q8_0"))  # the synthesizer always writes a ranking
    assert "skew metadata" in profile_source(mf.metadata, None)
    assert profile_source({}, None).startswith("uniform")
    assert profile_source(mf.metadata, "p.npy") == "routing profile p.npy"


def test_strata_profile_cli(tmp_path, tmp_models, capsys):
    model = model_path(tmp_models, "Q8_0")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello world\n\nthe quick brown fox\n", encoding="utf-8")
    out = tmp_path / "prof.npy"
    assert main(["profile", "-m", str(model), "--prompts", str(prompts), "-o", str(out),
                 "-n", "1", "--max-context", "64"]) == 0
    s = open_model(model).shape
    c = load_counts(out, s.n_layer, s.n_expert)
    assert c.sum() > 0 and c.sum() % (s.n_layer * s.n_expert_used) == 0
    assert "recorded 2 prompts" in capsys.readouterr().out
    assert main(["plan", "-m", str(model), "--gpu-mem", "8GiB", "--profile", str(out),
                 "--json"]) == 0


def test_bad_prompts_files(tmp_path, tmp_models, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ProfileError, match="no prompts"):
        read_prompts(empty)
    model = model_path(tmp_models, "Q8_0")
    assert main(["profile", "-m", str(model), "--prompts", str(tmp_path / "missing.txt")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_coverage_table():
    c = np.array([[8, 0, 0, 0], [1, 1, 1, 1]])
    cov = coverage_table(c)
    np.testing.assert_allclose(cov, [[1.0, 1.0], [0.25, 0.5]])
