"""`strata bench --backend cpu` runs end to end on a small file and reports consistent numbers
(its speeds are measured by running it, not here)."""

from __future__ import annotations

import json

from helpers.engine_models import model_path
from strata.cli.main import main
from strata.engine.cpu import CpuExperts
from strata.gguf import open_model


def test_bench_writes_a_table_and_json(tmp_models, tmp_path, capsys):
    path = str(model_path(tmp_models, "Q4_K_M"))
    out = tmp_path / "bench.json"
    code = main(["bench", "--backend", "cpu", "-m", path, "--n-prompt", "3", "--n-decode", "2",
                 "--n-pool", "2", "--membw-mib", "16", "--json-out", str(out)])
    assert code == 0
    table = capsys.readouterr().out
    assert "memory bandwidth" in table and "engine-test" in table
    res = json.loads(out.read_text())
    assert res["backend"] == "cpu" and res["copy_gb_per_s"] > 0 and res["device"]["cpu_count"]
    (r,) = res["results"]
    model = open_model(path)
    s = model.shape
    pool = CpuExperts(model)
    # one token reads its k distinct experts in every layer
    per_token = sum(s.n_expert_used * pool.layers[il].expert_bytes for il in range(s.n_layer))
    assert r["expert_bytes_per_token"] == per_token
    assert r["n_layer_scaled_to"] == s.n_layer  # a real file is not scaled
    assert r["decode_tokens_per_s"] > 0 and r["prefill_tokens_per_s"] > 0
    assert abs(r["decode_tokens_per_s_scaled"] - r["decode_tokens_per_s"]) < 1e-9
    sizes = [le.expert_bytes for le in pool.layers]  # layers differ (Q6_K down in some)
    k2 = 2 * s.n_expert_used
    assert k2 * min(sizes) <= r["pool"]["bytes"] <= k2 * max(sizes)
    assert set(r["decode_ms_per_token_by_part"]) >= {"dense", "attention", "experts", "head"}


def test_bench_refuses_bad_counts(capsys):
    assert main(["bench", "--n-decode", "0"]) == 2  # a bad flag
    assert "--n-decode must be at least 1, got 0" in capsys.readouterr().err
