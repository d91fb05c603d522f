"""The dequant benchmark runs end to end on a tiny input and reports what it measured."""

from __future__ import annotations

import json

import pytest

from strata.quant import bench


def test_bench_prints_a_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["--mib", "0.05", "--repeat", "1", "--formats", "q8_0,f16,iq2_s",
                       "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [r["format"] for r in rows] == ["F16", "Q8_0", "IQ2_S"]
    for r in rows:
        assert r["format"] in printed
        assert r["input_bytes"] > 0.04 * 2**20 and r["n_values"] > 0
        assert r["dequantize_gb_s_in"] > 0 and r["one_thread_gvalues_s"] > 0


def test_bench_refuses_unknown_formats():
    with pytest.raises(SystemExit):
        bench.main(["--formats", "q9_9"])
