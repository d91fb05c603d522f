"""`n` choices in one OpenAI request: each its own sequence, indexed in the response, seeds moved
on per choice, the prompt counted once, streams interleaved by index, and submission all or
nothing."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

import pytest

from helpers.serve_fakes import FakeModel, ScriptedEngine
from strata.serve.choices import MAX_CHOICES, Choices, choice_prepared
from strata.serve.errors import ApiError
from strata.serve.generation import Prepared
from strata.serve.job import Job, Sampling
from strata.serve.metrics import Metrics
from strata.serve.model import SEED_MODULUS
from strata.serve.worker import Worker
from test_serve_app import Harness, chat, sse_events

ANSWER = "Hi there!"  # the scripted engine's answer to a plain prompt


@pytest.fixture
def h():
    with Harness() as harness:
        yield harness


def test_chat_choices_are_indexed_and_the_prompt_counted_once(h):
    one = h.client.post("/v1/chat/completions", json=chat()).json()
    r = h.client.post("/v1/chat/completions", json=chat(n=3, logprobs=True))
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] == ANSWER and c["finish_reason"] == "stop"
               and len(c["logprobs"]["content"]) == len(ANSWER) for c in body["choices"])
    n_prompt = one["usage"]["prompt_tokens"]
    assert body["usage"]["prompt_tokens"] == n_prompt
    assert body["usage"]["completion_tokens"] == 3 * one["usage"]["completion_tokens"]
    assert body["usage"]["total_tokens"] == n_prompt + body["usage"]["completion_tokens"]
    # three sequences ran: three prefills of the same prompt, decoded side by side (2 slots)
    assert h.engine.prefills[-3:] == [h.engine.prefills[0]] * 3
    assert max(len(b) for b in h.engine.decode_batches) == 2


def test_chat_stream_interleaves_choices_by_index(h):
    r = h.client.post("/v1/chat/completions", json=chat(
        n=2, stream=True, stream_options={"include_usage": True}, logprobs=True))
    events = [d for _, d in sse_events(r.text)]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(d) for d in events[:-1]]
    assert [c["choices"][0]["delta"] for c in chunks[:2]] == [
        {"role": "assistant", "content": ""}] * 2
    assert [c["choices"][0]["index"] for c in chunks[:2]] == [0, 1]
    text, finishes, entries = defaultdict(str), {}, defaultdict(list)
    for c in chunks[2:-1]:
        (choice,) = c["choices"]
        text[choice["index"]] += choice["delta"].get("content", "")
        if choice["logprobs"] is not None:
            entries[choice["index"]] += [e["token"] for e in choice["logprobs"]["content"]]
        if choice["finish_reason"]:
            assert choice["index"] not in finishes  # once per choice
            finishes[choice["index"]] = choice["finish_reason"]
    assert dict(text) == {0: ANSWER, 1: ANSWER} and finishes == {0: "stop", 1: "stop"}
    assert {i: "".join(t) for i, t in entries.items()} == {0: ANSWER, 1: ANSWER}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2 * 10


def test_completion_choices_whole_streamed_and_echoed(h):
    body = {"model": "fake", "prompt": "abc", "n": 2, "echo": True}
    r = h.client.post("/v1/completions", json=body).json()
    assert [(c["index"], c["text"]) for c in r["choices"]] == [(0, "abc" + ANSWER),
                                                                (1, "abc" + ANSWER)]
    assert r["usage"]["prompt_tokens"] == 3
    r = h.client.post("/v1/completions", json={**body, "stream": True, "max_tokens": 2})
    chunks = [json.loads(d) for _, d in sse_events(r.text)[:-1]]
    text = defaultdict(str)
    for c in chunks:
        text[c["choices"][0]["index"]] += c["choices"][0]["text"]
    assert dict(text) == {0: "abcHi", 1: "abcHi"}
    assert sorted(c["choices"][0]["index"] for c in chunks
                  if c["choices"][0]["finish_reason"] == "length") == [0, 1]


def test_each_choice_draws_with_its_own_seed(h, monkeypatch):
    seeds = []
    real = FakeModel.sampler
    monkeypatch.setattr(h.model, "sampler",
                        lambda sampling: seeds.append(sampling.seed) or real(h.model, sampling))
    assert h.client.post("/v1/chat/completions",
                         json=chat(n=3, seed=41, temperature=0.8)).status_code == 200
    assert sorted(seeds) == [41, 42, 43]
    seeds.clear()
    assert h.client.post("/v1/completions", json={"model": "fake", "prompt": "x", "n": 2,
                                                  "temperature": 0.8}).status_code == 200
    assert seeds == [None, None]  # each draws a fresh seed


def test_choice_seeds_wrap_and_unseeded_stay_unseeded():
    base = Prepared(prompt=(1,), sampling=Sampling(max_tokens=4, seed=SEED_MODULUS - 1),
                    requested_max_tokens=None)
    assert choice_prepared(base, 0) is base
    assert choice_prepared(base, 2).sampling.seed == 1
    assert choice_prepared(base, 2).prompt == base.prompt
    plain = Prepared(prompt=(1,), sampling=Sampling(max_tokens=4), requested_max_tokens=None)
    assert choice_prepared(plain, 5).sampling.seed is None


def _waiting_worker(max_queue: int, n_waiting: int) -> tuple[Worker, Metrics]:
    """A worker not started (nothing leaves its queue) with `n_waiting` jobs queued."""
    metrics = Metrics()
    worker = Worker(ScriptedEngine(lambda p: "x"), FakeModel(), metrics, max_queue=max_queue)
    for _ in range(n_waiting):
        worker.submit(Job((1,), Sampling(max_tokens=2), lambda e: None))
    return worker, metrics


def _prepared() -> Prepared:
    return Prepared(prompt=(1, 2), sampling=Sampling(max_tokens=4), requested_max_tokens=None)


def test_submission_is_all_or_nothing():
    async def go():
        worker, metrics = _waiting_worker(max_queue=4, n_waiting=2)
        with pytest.raises(ApiError) as e:
            Choices(worker, _prepared(), 3)  # room for 2 of the 3: none is queued
        assert e.value.status == 503 and e.value.headers == {"retry-after": "1"}
        assert worker.queue_depth == 2
        assert not metrics.cancelled and not metrics.finished
        assert len(Choices(worker, _prepared(), 2)) == 2  # the 2 that fit are queued
        assert worker.queue_depth == 4

    asyncio.run(go())


def test_more_choices_than_the_queue_holds_are_a_400_naming_n():
    async def go():
        worker, metrics = _waiting_worker(max_queue=1, n_waiting=0)  # idle, and it never fits
        with pytest.raises(ApiError) as e:
            Choices(worker, _prepared(), 2)
        assert e.value.status == 400 and e.value.param == "n"
        assert "holds 1 request (--max-queue)" in e.value.message
        assert worker.queue_depth == 0 and not metrics.cancelled and not metrics.finished

    asyncio.run(go())


def test_choice_counts_out_of_range_are_400s(h):
    for body, param in [(chat(n=MAX_CHOICES + 1), "n"), (chat(n=0), "n"),
                        ({"model": "fake", "prompt": "x", "best_of": 2}, "best_of"),
                        ({"model": "fake", "prompt": "x", "n": 3, "best_of": 2}, "best_of")]:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        r = h.client.post(path, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    ok = h.client.post("/v1/completions", json={"model": "fake", "prompt": "x", "n": 2,
                                                "best_of": 2})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 2
    with pytest.raises(ValueError, match="n must be"):
        Choices(_waiting_worker(1, 0)[0], None, MAX_CHOICES + 1)
