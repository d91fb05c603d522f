"""llama.cpp's `/infill` route (`strata.serve.infill`) for editors (llama.vscode, llama.vim):
the prompt around the cursor in the model's fill-in-the-middle tokens (the fake vocabulary's
FIM_MARKS here; Qwen's real tokens, the repository form and the cut to the context in
`test_fim.py`), llama.cpp's answer fields streamed or not, `n_indent` and `t_max_predict_ms`
ending the answer as llama.cpp's server does, and bad input named."""

from __future__ import annotations

import json
import time

import pytest

from helpers.serve_fakes import FIM_MARKS
from test_serve_app import Harness, sse_events
from test_serve_logprobs import HIT, MISS
from strata.serve.infill import LineLimits

PRE, SUF, MID = FIM_MARKS


@pytest.fixture
def h():
    with Harness() as harness:
        harness.engine.script = lambda p: "x + 1"
        yield harness


def _infill(h, **body):
    r = h.client.post("/infill", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_answer_between_prefix_and_suffix(h):
    r = _infill(h, input_prefix="def f(x):\n    return ", input_suffix="\n\nprint(f(1))",
                input_extra=[{"filename": "a.py", "text": "A = 1\n"}], prompt="",
                n_predict=16, cache_prompt=True, samplers=["top_k", "top_p", "infill"],
                t_max_prompt_ms=500, response_fields=["content"])
    assert h.engine.prefills[-1] == (f"#a.py\nA = 1\n{PRE}def f(x):\n    return {SUF}"
                                     f"\n\nprint(f(1)){MID}")
    assert r["content"] == "x + 1" and r["stop"] is True and r["stop_type"] == "eos"
    assert r["tokens_predicted"] == 6 and r["tokens_evaluated"] == len(h.engine.prefills[-1])
    assert r["truncated"] is False and r["timings"]["predicted_n"] == 6
    assert set(r["timings"]) >= {"prompt_n", "prompt_ms", "predicted_ms", "predicted_per_second"}
    # the text the answer continues, after the middle tag; a length stop is "limit"
    r = _infill(h, input_prefix="a", input_suffix="b", prompt="y = ", n_predict=2)
    assert h.engine.prefills[-1] == f"{PRE}a{SUF}b{MID}y = "
    assert r["content"] == "x " and r["stop_type"] == "limit"


def test_streamed_as_llama_cpp_streams(h):
    r = h.client.post("/infill", json={"input_prefix": "a", "input_suffix": "b", "stream": True})
    events = [json.loads(d) for _, d in sse_events(r.text)]
    assert "".join(e["content"] for e in events) == "x + 1"
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert events[-1]["tokens_predicted"] == 6 and events[-1]["stop_type"] == "eos"


def test_n_indent_ends_the_answer_at_a_line_indented_less(h):
    h.engine.script = lambda p: "x = 1\n    y = 2\n\nz = 3\n    w = 4\n"
    for stream in (False, True):
        r = h.client.post("/infill", json={"input_prefix": "if a:\n    ", "input_suffix": "",
                                           "n_indent": 4, "stream": stream})
        if stream:
            events = [json.loads(d) for _, d in sse_events(r.text)]
            content, last = "".join(e["content"] for e in events), events[-1]
        else:
            content = last = r.json()
            content = last["content"]
        assert content == "x = 1\n    y = 2\n" and last["stop_type"] == "limit", (stream, content)
    r = _infill(h, input_prefix="a", input_suffix="", n_indent=0)
    assert r["content"] == "x = 1\n    y = 2\n\nz = 3\n    w = 4\n"


def test_the_time_limit_ends_an_answer_that_holds_a_newline():
    limits = LineLimits(0, 1)
    time.sleep(0.005)
    assert limits.feed("abc") == ("abc", False)  # late, but no newline yet
    assert limits.feed("d\ne") == ("d\ne", True)
    assert LineLimits(0, 0).feed("a\nb") == ("a\nb", False)  # 0: no limit
    held = LineLimits(2, 0)
    assert held.feed("a\n") == ("a", False) and held.feed("  b") == ("\n  b", False)
    assert held.feed("\n") == ("", False) and held.rest() == "\n"


def test_a_prompt_longer_than_the_context_is_cut():
    with Harness(max_context=64) as h:
        h.engine.script = lambda p: "ok"
        r = _infill(h, input_prefix="p" * 100, input_suffix="s", n_predict=8)
        assert r["truncated"] is True and r["content"] == "ok"
        assert len(h.engine.prefills[-1]) <= 64 - 8


def _check_probs(entries: list, text: str, n_top: int) -> None:
    """One entry a token of `text` (the fake vocabulary: a character a token, its id the code
    point), each against the one-hot logits' closed form (`test_serve_logprobs`)."""
    assert [e["id"] for e in entries] == [ord(c) for c in text]
    for e in entries:
        assert set(e) == {"id", "token", "bytes", "logprob", "top_logprobs"}
        assert e["token"] == chr(e["id"]) and e["bytes"] == list(e["token"].encode())
        assert e["logprob"] == pytest.approx(HIT, abs=1e-6)
        top = e["top_logprobs"]
        assert len(top) == n_top and top[0]["id"] == e["id"]
        assert [t["logprob"] for t in top] == pytest.approx([HIT] + [MISS] * (n_top - 1),
                                                            abs=1e-6)


def test_n_probs_gives_llama_cpp_completion_probabilities(h):
    r = _infill(h, input_prefix="a", input_suffix="b", n_probs=3, temperature=0)
    assert r["content"] == "x + 1"
    _check_probs(r["completion_probabilities"], "x + 1", 3)
    assert "completion_probabilities" not in _infill(h, input_prefix="a", input_suffix="b")
    # streamed: each event those of its own text, the last event whatever is left (none here)
    r = h.client.post("/infill", json={"input_prefix": "a", "input_suffix": "b", "n_probs": 2,
                                       "stream": True})
    events = [json.loads(d) for _, d in sse_events(r.text)]
    for e in events[:-1]:
        _check_probs(e["completion_probabilities"], e["content"], 2)
    assert events[-1]["stop"] is True and events[-1]["completion_probabilities"] == []
    # a line n_indent leaves out keeps the entries of its tokens that came before the end
    # (the worker may generate one more, counted in tokens_predicted, before it stops)
    h.engine.script = lambda p: "x = 1\ny = 2\n"
    r = _infill(h, input_prefix="a", input_suffix="b", n_probs=1, n_indent=4)
    assert r["content"] == "x = 1"
    entries = r["completion_probabilities"]
    assert "".join(e["token"] for e in entries).startswith("x = 1\ny")
    assert len(entries) <= r["tokens_predicted"]


@pytest.mark.parametrize("body, param", [
    ({"samplers": ["top_k", "magic"]}, "samplers[1]"),
    ({"n_probs": 21}, "n_probs"),
    ({"n_probs": -1}, "n_probs"),
    ({"n_probs": 2, "post_sampling_probs": True}, "post_sampling_probs"),
    ({"input_extra": [{"filename": "a.py"}]}, "input_extra[0].text"),
    ({"input_extra": "a.py"}, "input_extra"),
    ({"n_predict": "many"}, "n_predict"),
    ({"repeat_penalty": 0}, "repeat_penalty"),
])
def test_bad_input_is_named(h, body, param):
    r = h.client.post("/infill", json={"input_prefix": "a", "input_suffix": "b", **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_model_without_the_tokens_says_so(h):
    h.model.fim = False
    r = h.client.post("/infill", json={"input_prefix": "a", "input_suffix": "b"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_suffix"
