"""`python -m strata.bench.choices` on the CPU backend and the small engine-test model: a
request's choices find their prompt in the first choice's K/V (every other choice copies all of
it), every choice's greedy answer is the same both ways, and the JSON records the run."""

from __future__ import annotations

import json

import pytest

from helpers.engine_models import model_path
from strata.bench import choices


def test_choices_share_their_prompt_through_the_worker(tmp_models, tmp_path, capsys):
    path = model_path(tmp_models, "Q4_K_M")
    out = tmp_path / "choices.json"
    assert choices.main(["-m", str(path), "--backend", "cpu", "--choices", "3",
                         "--prompt-tokens", "12", "--answer-tokens", "4",
                         "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    row = res["row"]
    assert res["whole"]["cached_tokens"] == [0, 0, 0]
    assert row["cached_tokens_shared"] == [0, 12, 12]
    assert row["choices_agree_whole"] and row["choices_agree_shared"]
    assert row["shared_answers_equal_whole"]
    assert all(len(a) == 4 for a in res["shared"]["answers"])
    assert res["bench"] == "choices" and res["backend"] == "cpu" and res["command"]
    assert "agree" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--choices", "1"], "--choices must be in 2..16"),
    (["--prompt-tokens", "1"], "--prompt-tokens >= 2"),
    (["--backend", "cpu", "--gpu-mem", "8GiB"], "applies to --backend cuda only"),
])
def test_the_bench_refuses_bad_options(argv, message, capsys):
    with pytest.raises(SystemExit):
        choices.main(["-m", "x.gguf"] + argv)
    assert message in capsys.readouterr().err
