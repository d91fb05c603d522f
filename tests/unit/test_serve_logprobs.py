"""logprobs and logit_bias through the serve layer: the worker's per-token entries (which tokens
get one, which text they travel with), the OpenAI shapes of both routes streamed and whole, and
every malformed field a 400 naming it.

The scripted engine's logits are one-hot (1.0 at the scripted token, 0 elsewhere, 257 tokens), so
each entry's value is known in closed form: log(e / (e + 256)) for the token, log(1 / (e + 256))
for every other."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from helpers.serve_fakes import FakeModel, ScriptedEngine, encode
from strata.serve.job import Job, Sampling, TextEvent
from strata.serve.metrics import Metrics
from strata.serve.worker import Worker
from test_serve_app import Harness, chat, sse_events
from test_serve_worker import Sink
from test_serve_worker_picks import PickingEngine, run

HIT = 1.0 - math.log(math.e + 256)  # the scripted token's log-probability
MISS = -math.log(math.e + 256)  # any other token's


def _run_one(script: str, sampling: Sampling, prompt: str = "q") -> Sink:
    engine = ScriptedEngine(lambda p: script)
    worker = Worker(engine, FakeModel(), Metrics())
    sink = Sink()
    worker.submit(Job(encode(prompt), sampling, sink))
    worker.start()
    try:
        sink.finish  # noqa: B018 - waits for the job
    finally:
        worker.stop()
    return sink


def _entries(sink: Sink) -> list:
    return [e for ev in sink.events if isinstance(ev, TextEvent) for e in ev.logprobs]


# -- the worker ----------------------------------------------------------------------------

def test_each_generated_token_gets_its_entry_and_the_stop_token_none():
    sink = _run_one("abc", Sampling(max_tokens=50, temperature=0.0, logprobs=2))
    assert sink.text == "abc" and sink.finish.reason == "stop"
    entries = _entries(sink)
    assert [e.token for e in entries] == encode("abc")  # no entry for the end token
    for e in entries:
        assert e.logprob == pytest.approx(HIT, abs=1e-6)
        other = 0 if e.token != 0 else 1  # the tie among the rest: the lowest id
        assert [t for t, _ in e.top] == [e.token, other]
        assert [v for _, v in e.top] == pytest.approx([HIT, MISS], abs=1e-6)
    # one character a token, no stop string held back: each event carries its own tokens
    for ev in sink.events:
        if isinstance(ev, TextEvent):
            assert [e.token for e in ev.logprobs] == encode(ev.text)


def test_a_stop_strings_tokens_lose_their_entries_with_their_text():
    sink = _run_one("one two three", Sampling(max_tokens=50, stop=(" two",), logprobs=0))
    assert sink.text == "one"
    entries = _entries(sink)
    assert [e.token for e in entries] == encode("one") and all(e.top == () for e in entries)


def test_a_budget_cut_keeps_every_entry():
    sink = _run_one("abcdef", Sampling(max_tokens=3, logprobs=1))
    assert sink.finish.reason == "length" and sink.text == "abc"
    assert [e.token for e in _entries(sink)] == encode("abc")


def test_without_logprobs_no_entry_is_computed():
    sink = _run_one("abc", Sampling(max_tokens=50))
    assert _entries(sink) == [] and sink.text == "abc"


def test_a_sequence_asking_for_logprobs_is_sampled_on_the_host():
    """The device picks return no logits: a request with logprobs is the host's, beside one
    the device picks in the same step."""
    engine = PickingEngine(lambda p: "xyz", n_slots=2)
    sinks = run(engine, [("a", Sampling(max_tokens=50, temperature=0.0)),
                         ("b", Sampling(max_tokens=50, temperature=0.0, logprobs=3))])
    assert [s.text for s in sinks] == ["xyz", "xyz"]
    assert [e.token for e in _entries(sinks[1])] == encode("xyz")
    mixed = [g for g in engine.given if len(g) == 2]
    assert mixed and all(g[1] is None and g[0] is not None for g in mixed)


def test_job_sampling_checks_logprobs_and_bias_ranges():
    with pytest.raises(ValueError, match="logprobs"):
        Sampling(max_tokens=4, logprobs=21)
    with pytest.raises(ValueError, match="logit_bias"):
        Sampling(max_tokens=4, logit_bias=((3, 100.5),))


# -- the OpenAI routes ---------------------------------------------------------------------

@pytest.fixture
def h():
    with Harness() as harness:
        yield harness


def _check_chat_entry(entry: dict, n_top: int) -> None:
    assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
    assert entry["bytes"] == list(entry["token"].encode("utf-8"))
    assert entry["logprob"] == pytest.approx(HIT, abs=1e-6)
    top = entry["top_logprobs"]
    assert len(top) == n_top and top[0]["token"] == entry["token"]
    assert [t["logprob"] for t in top] == pytest.approx([HIT] + [MISS] * (n_top - 1), abs=1e-6)
    assert all(set(t) == {"token", "logprob", "bytes"} for t in top)


def test_chat_logprobs_whole_and_streamed_agree(h):
    r = h.client.post("/v1/chat/completions", json=chat(logprobs=True, top_logprobs=3))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == choice["message"]["content"] == "Hi there!"
    for e in content:
        _check_chat_entry(e, 3)
    assert choice["logprobs"]["refusal"] is None

    r = h.client.post("/v1/chat/completions", json=chat(logprobs=True, top_logprobs=3,
                                                        stream=True))
    chunks = [json.loads(d) for _, d in sse_events(r.text)[:-1]]
    assert chunks[0]["choices"][0]["logprobs"] is None  # the role chunk
    streamed = []
    for c in chunks[1:]:
        lp = c["choices"][0]["logprobs"]
        piece = c["choices"][0]["delta"].get("content", "")
        if lp is not None:  # each chunk: the entries of the text it carries
            assert "".join(e["token"] for e in lp["content"]) == piece
            streamed += lp["content"]
    assert streamed == content


def test_chat_logprobs_without_alternatives_and_off_by_default(h):
    r = h.client.post("/v1/chat/completions", json=chat(logprobs=True))
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == len("Hi there!") and all(e["top_logprobs"] == [] for e in content)
    r = h.client.post("/v1/chat/completions", json=chat(stream=True))
    chunks = [json.loads(d) for _, d in sse_events(r.text)[:-1]]
    assert all(c["choices"][0]["logprobs"] is None for c in chunks)
    assert h.client.post("/v1/chat/completions", json=chat()).json()["choices"][0][
        "logprobs"] is None


def test_completion_logprobs_lists_and_offsets_whole_and_streamed(h):
    body = {"model": "fake", "prompt": "hello", "max_tokens": 50, "logprobs": 2}
    r = h.client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == choice["text"] == "Hi there!"
    assert lp["token_logprobs"] == pytest.approx([HIT] * 9, abs=1e-6)
    assert lp["text_offset"] == list(range(9))  # one character a token
    for token, top in zip(lp["tokens"], lp["top_logprobs"]):
        assert list(top)[0] == token and len(top) == 2
        assert list(top.values()) == pytest.approx([HIT, MISS], abs=1e-6)

    r = h.client.post("/v1/completions", json={**body, "stream": True})
    chunks = [json.loads(d) for _, d in sse_events(r.text)[:-1]]
    tokens, offsets = [], []
    for c in chunks:
        part = c["choices"][0]["logprobs"]
        assert "".join(part["tokens"]) == c["choices"][0]["text"]
        tokens += part["tokens"]
        offsets += part["text_offset"]
    assert tokens == lp["tokens"] and offsets == lp["text_offset"]  # counted across chunks


def test_logit_bias_reaches_the_sampler_as_sorted_pairs(h, monkeypatch):
    made = []
    real = FakeModel.sampler

    def recording(sampling):
        made.append(sampling)
        return real(h.model, sampling)

    monkeypatch.setattr(h.model, "sampler", recording)
    r = h.client.post("/v1/chat/completions", json=chat(logit_bias={"10": 2.5, "5": -100}))
    assert r.status_code == 200, r.text
    r = h.client.post("/v1/completions", json={"model": "fake", "prompt": "x",
                                               "logit_bias": {"7": 1}})
    assert r.status_code == 200, r.text
    assert [m.logit_bias for m in made] == [((5, -100.0), (10, 2.5)), ((7, 1.0),)]


def test_the_served_sampler_applies_the_bias():
    from strata.serve.model import ServedModel
    sample = ServedModel.sampler(object.__new__(ServedModel), Sampling(
        max_tokens=4, temperature=0.0, logit_bias=((2, 5.0),)))
    assert sample.params.logit_bias == ((2, 5.0),)
    assert sample(np.array([1.0, 3.0, -1.0], np.float32)) == 2  # -1 + 5 passes 3


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", chat(top_logprobs=2), "top_logprobs"),
    ("/v1/chat/completions", chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("/v1/chat/completions", chat(logprobs="yes"), "logprobs"),
    ("/v1/chat/completions", chat(logit_bias={"abc": 1}), "logit_bias.abc"),
    ("/v1/chat/completions", chat(logit_bias={"-3": 1}), "logit_bias.-3"),
    ("/v1/chat/completions", chat(logit_bias={"257": 1}), "logit_bias.257"),
    ("/v1/chat/completions", chat(logit_bias={"5": 101}), "logit_bias.5"),
    ("/v1/chat/completions", chat(logit_bias={"5": "up"}), "logit_bias.5"),
    ("/v1/chat/completions", chat(logit_bias={"5": None}), "logit_bias.5"),
    ("/v1/chat/completions", chat(logit_bias={"5": 1, "05": 2}), "logit_bias.05"),
    ("/v1/chat/completions", chat(logit_bias={str(i): 1 for i in range(1025)}), "logit_bias"),
    ("/v1/chat/completions", chat(logit_bias=[1, 2]), "logit_bias"),
    ("/v1/completions", {"model": "fake", "prompt": "x", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"model": "fake", "prompt": "x", "logprobs": 1, "echo": True},
     "logprobs"),
    ("/v1/completions", {"model": "fake", "prompt": "x", "logit_bias": {"x": 1}},
     "logit_bias.x"),
])
def test_malformed_logprobs_and_bias_are_400s_naming_the_field(h, path, body, param):
    r = h.client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["message"]


def test_the_schema_lists_the_new_fields(h):
    paths = h.client.get("/openapi.json").json()["paths"]
    chat_props = paths["/v1/chat/completions"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]
    assert {"logprobs", "top_logprobs", "logit_bias"} <= set(chat_props)
    completion = paths["/v1/completions"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]
    assert completion["logprobs"]["maximum"] == 20 and "logit_bias" in completion
