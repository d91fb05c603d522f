"""The HTTP layer in process (Starlette's test client) over a scripted engine: shapes of
responses and streams in both dialects, tool calls, clamping, and every error path."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
from starlette.testclient import TestClient

from helpers.serve_fakes import FakeModel, ScriptedEngine, encode, render
from strata.serve.app import Server
from strata.serve.metrics import Metrics
from strata.serve.state import ServerState
from strata.serve.worker import Worker

KEY = "sekrit"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


CALL2 = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
TWO_CALLS_TAIL = " Then I will summarise what the two tools said, at some length." * 4


def script(prompt: str) -> str:
    if "RAISE" in prompt:
        return "unused"
    if "twice" in prompt and "<tool>" not in prompt:
        return "Checking." + CALL + "\n" + CALL2 + TWO_CALLS_TAIL
    if "weather" in prompt and "<tool>" not in prompt:
        return "Checking." + CALL
    if "STOPME" in prompt:
        return "one two three"
    return "Hi there!"


class Harness:
    def __init__(self, *, max_context=4096, api_key=KEY, max_body_bytes=64 << 10,
                 engine_class=None, cors_origins=(), model=None, n_slots=2, max_queue=256):
        self.model = model or FakeModel(max_context=max_context)
        self.engine = (engine_class or ScriptedEngine)(script, n_slots=n_slots,
                                                       max_context=max_context)
        self.metrics = Metrics()
        self.worker = Worker(self.engine, self.model, self.metrics, max_queue=max_queue)
        self.state = state = ServerState(model=self.model, worker=self.worker,
                                         metrics=self.metrics)
        self.app = Server(state, api_key=api_key, max_body_bytes=max_body_bytes,
                          cors_origins=cors_origins).app()

    def __enter__(self):
        self.worker.start()
        self.client = TestClient(self.app, headers={"authorization": f"Bearer {KEY}"})
        return self

    def __exit__(self, *exc):
        self.worker.stop()


@pytest.fixture
def h():
    with Harness() as harness:
        yield harness


def chat(**kw):
    body = {"model": "fake", "messages": [{"role": "user", "content": "hello"}]}
    body.update(kw)
    return body


def sse_events(text: str) -> list[tuple[str | None, str]]:
    out = []
    for block in text.strip().split("\n\n"):
        event, data = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        out.append((event, data))
    return out


# -- OpenAI ------------------------------------------------------------------------------

def test_models_lists_name_and_aliases(h):
    r = h.client.get("/v1/models")
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["fake", "fake-alias"]
    assert {m["max_model_len"] for m in r.json()["data"]} == {4096}  # the context it runs
    for name in ("fake", "fake-alias"):  # each by its id, as the SDK's models.retrieve reads it
        assert h.client.get(f"/v1/models/{name}").json() == next(
            m for m in r.json()["data"] if m["id"] == name)
    other = h.client.get("/v1/models/org/other")
    assert other.status_code == 404 and "'fake'" in other.json()["error"]["message"]


def test_models_in_the_anthropic_shape_where_an_anthropic_client_asks(h):
    """The Anthropic SDK sends `anthropic-version`: its Models API shape, and its error shape."""
    head = {"anthropic-version": "2023-06-01"}
    r = h.client.get("/v1/models", headers=head).json()
    assert [m["id"] for m in r["data"]] == ["fake", "fake-alias"]
    assert r["has_more"] is False and (r["first_id"], r["last_id"]) == ("fake", "fake-alias")
    one = h.client.get("/v1/models/fake-alias", headers=head).json()
    assert one == r["data"][1] and one["type"] == "model" and one["max_input_tokens"] == 4096
    assert one["created_at"].endswith("Z") and one["display_name"] == "fake-alias"
    other = h.client.get("/v1/models/other", headers=head)
    assert other.status_code == 404 and other.json()["type"] == "error"
    assert other.json()["error"]["type"] == "not_found_error"
    # paged as the Models API pages: limit, after_id, before_id
    page = lambda q: h.client.get(f"/v1/models?{q}", headers=head)  # noqa: E731
    first = page("limit=1").json()
    assert [m["id"] for m in first["data"]] == ["fake"] and first["has_more"] is True
    after = page("limit=1&after_id=fake").json()
    assert [m["id"] for m in after["data"]] == ["fake-alias"] and after["has_more"] is False
    before = page("before_id=fake-alias").json()
    assert [m["id"] for m in before["data"]] == ["fake"] and before["has_more"] is False
    empty = page("after_id=fake-alias").json()
    assert empty["data"] == [] and empty["first_id"] is None
    for q, param in (("limit=0", "limit"), ("limit=x", "limit"), ("limit=1001", "limit"),
                     ("after_id=nope", "after_id"), ("after_id=fake&before_id=fake", "before_id")):
        r = page(q)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert param in r.json()["error"]["message"], (q, r.text)


def test_the_openai_routes_without_v1(h):
    """`/chat/completions`, `/completions` and `/models`, as llama.cpp's server also serves
    them: the same answers as under /v1 (a client given the base URL without /v1)."""
    a = h.client.post("/chat/completions", json=chat()).json()
    b = h.client.post("/v1/chat/completions", json=chat()).json()
    assert a["choices"] == b["choices"] and a["object"] == "chat.completion"
    r = h.client.post("/completions", json={"model": "fake", "prompt": "abc"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "Hi there!"
    assert h.client.get("/models").json() == h.client.get("/v1/models").json()
    assert TestClient(h.app).get("/models").status_code == 401  # behind the key as well


def test_chat_completion_shape_and_usage(h):
    r = h.client.post("/v1/chat/completions", json=chat(max_tokens=100))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hi there!", "refusal": None}
    assert choice["finish_reason"] == "stop"
    n_prompt = len(render([{"role": "user", "content": "hello"}], None))
    assert body["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 10,
                             "total_tokens": n_prompt + 10,
                             "prompt_tokens_details": {"cached_tokens": 0},
                             "completion_tokens_details": {"reasoning_tokens": 0}}
    assert r.headers["x-strata-max-tokens"] == "100"
    assert "x-strata-max-tokens-clamped-from" not in r.headers


def test_chat_stream_chunks_usage_and_done(h):
    r = h.client.post("/v1/chat/completions",
                      json=chat(stream=True, stream_options={"include_usage": True}))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [d for _, d in sse_events(r.text)]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(d) for d in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Hi there!"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-2]["usage"] is None
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10


def test_stop_sequence(h):
    r = h.client.post("/v1/chat/completions",
                      json=chat(messages=[{"role": "user", "content": "STOPME"}], stop=[" two"]))
    assert r.json()["choices"][0]["message"]["content"] == "one"
    assert r.json()["choices"][0]["finish_reason"] == "stop"


class _Recording:
    """A sampler that takes the arg-max and records what the worker gives it."""

    def __init__(self, sampling):
        self.sampling, self.accepted = sampling, []

    def accept(self, tokens):
        self.accepted.extend(int(t) for t in tokens)

    def __call__(self, logits):
        return int(np.argmax(logits))


def test_penalties_reach_the_sampler_with_the_prompt_in_its_window(h, monkeypatch):
    """presence_penalty / frequency_penalty (OpenAI's, -2..2) and llama.cpp's repeat_penalty,
    repeat_last_n and min_p in both OpenAI routes become the job's sampling; the worker hands
    the sampler the prompt first (the penalties' window holds it, as the engine's token history
    does)."""
    made = []
    monkeypatch.setattr(h.model, "sampler", lambda sampling: made.append(_Recording(sampling))
                        or made[-1])
    r = h.client.post("/v1/chat/completions",
                      json=chat(presence_penalty=0.5, frequency_penalty=-1.25))
    assert r.status_code == 200, r.text
    r = h.client.post("/v1/completions", json={"model": "fake", "prompt": "hello",
                                               "frequency_penalty": 2, "repeat_penalty": 1.1,
                                               "repeat_last_n": 256, "min_p": 0.05})
    assert r.status_code == 200, r.text
    r = h.client.post("/v1/messages", json={"model": "fake", "max_tokens": 5, "messages": [
        {"role": "user", "content": "hello"}]})
    assert r.status_code == 200, r.text
    got = [(m.sampling.presence_penalty, m.sampling.frequency_penalty) for m in made]
    assert got == [(0.5, -1.25), (0.0, 2.0), (0.0, 0.0)]
    assert [(m.sampling.repeat_penalty, m.sampling.repeat_last_n, m.sampling.min_p)
            for m in made] == [(1.0, 64, 0.0), (1.1, 256, 0.05), (1.0, 64, 0.0)]
    prompt = render([{"role": "user", "content": "hello"}], None)
    assert made[0].accepted[:len(prompt)] == encode(prompt)


def test_the_served_sampler_takes_the_requests_penalties_and_window():
    from strata.serve.job import PENALTY_LAST_N, Sampling
    from strata.serve.model import ServedModel
    sampling = Sampling(max_tokens=4, temperature=0.0, presence_penalty=0.5,
                        frequency_penalty=0.25)
    p = ServedModel.sampler(object.__new__(ServedModel), sampling).params
    assert (p.presence_penalty, p.frequency_penalty, p.repeat_penalty) == (0.5, 0.25, 1.0)
    assert p.repeat_last_n == PENALTY_LAST_N == 64 and p.penalised and p.min_p == 0.0
    p = ServedModel.sampler(object.__new__(ServedModel), Sampling(
        max_tokens=4, repeat_penalty=1.3, repeat_last_n=8, min_p=0.1)).params
    assert (p.repeat_penalty, p.repeat_last_n, p.min_p) == (1.3, 8, 0.1)
    with pytest.raises(ValueError, match="frequency_penalty"):
        Sampling(max_tokens=4, frequency_penalty=2.5)


def test_max_tokens_is_clamped_to_the_room_left():
    with Harness(max_context=60) as h:
        r = h.client.post("/v1/chat/completions", json=chat(max_tokens=1000))
        assert r.status_code == 200
        room = 60 - len(render([{"role": "user", "content": "hello"}], None))
        assert r.headers["x-strata-max-tokens"] == str(room)
        assert r.headers["x-strata-max-tokens-clamped-from"] == "1000"
        r = h.client.post("/v1/chat/completions",
                          json=chat(messages=[{"role": "user", "content": "x" * 100}]))
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "messages"
        assert "maximum context length is 60 tokens" in r.json()["error"]["message"]


def test_tool_call_parsed_into_tool_calls(h):
    tools = [{"type": "function", "function": {"name": "get_weather",
                                               "parameters": {"type": "object"}}}]
    body = chat(messages=[{"role": "user", "content": "weather?"}], tools=tools)
    msg = h.client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert msg["finish_reason"] == "tool_calls"
    assert msg["message"]["content"] == "Checking."
    (call,) = msg["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert "<tools>get_weather</tools>" in h.model.rendered[-1]

    chunks = [json.loads(d) for _, d in sse_events(
        h.client.post("/v1/chat/completions", json={**body, "stream": True}).text)[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    (tc,) = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert tc["index"] == 0 and tc["function"]["name"] == "get_weather"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


TWO_TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
             for n in ("get_weather", "get_time")]


class SlowTailEngine(ScriptedEngine):
    """Decode steps past the first call take 2 ms, as a GPU's would take a few: the reader
    sees the call complete long before the answer could run to its end."""

    def decode(self, slots, tokens):
        first_call = len(encode("Checking." + CALL))
        if any(self._pos[s] >= first_call for s in slots):
            time.sleep(0.002)
        return super().decode(slots, tokens)


def test_one_tool_call_where_parallel_calls_are_off():
    """`parallel_tool_calls: false` (OpenAI's chat and Responses routes) and Anthropic's
    `disable_parallel_tool_use`: the answer holds the first call only, and the job ends there
    (as a stop: not counted as cancelled), not after everything the model would write."""
    with Harness(engine_class=SlowTailEngine) as h:
        _one_tool_call(h)


def _one_tool_call(h):
    full = len(encode("Checking." + CALL + "\n" + CALL2 + TWO_CALLS_TAIL)) + 1  # + <eot>
    body = chat(messages=[{"role": "user", "content": "twice"}], tools=TWO_TOOLS)
    both = h.client.post("/v1/chat/completions", json=body).json()
    assert [c["function"]["name"] for c in both["choices"][0]["message"]["tool_calls"]] == [
        "get_weather", "get_time"]
    assert both["usage"]["completion_tokens"] == full
    cancelled = dict(h.metrics.cancelled)

    one = h.client.post("/v1/chat/completions", json={**body, "parallel_tool_calls": False}).json()
    choice = one["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Checking."
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    # the worker drops the job at the step after the reader saw the call: a few tokens past it
    # (the reader runs beside the worker), far from the whole answer
    assert len(encode("Checking." + CALL)) <= one["usage"]["completion_tokens"] < full // 2

    chunks = [json.loads(d) for _, d in sse_events(h.client.post(
        "/v1/chat/completions", json={**body, "parallel_tool_calls": False,
                                      "stream": True}).text)[:-1]]
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert [tc["function"]["name"] for tc in calls] == ["get_weather"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "Checking." and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"

    tools = [{"name": n, "input_schema": {"type": "object"}} for n in ("get_weather", "get_time")]
    m = h.client.post("/v1/messages", json=msgs(
        messages=[{"role": "user", "content": "twice"}], tools=tools,
        tool_choice={"type": "auto", "disable_parallel_tool_use": True})).json()
    assert [b["type"] for b in m["content"]] == ["text", "tool_use"]
    assert m["content"][1]["name"] == "get_weather" and m["stop_reason"] == "tool_use"
    m = h.client.post("/v1/messages", json=msgs(
        messages=[{"role": "user", "content": "twice"}], tools=tools,
        tool_choice={"type": "auto"})).json()
    assert [b["type"] for b in m["content"]] == ["text", "tool_use", "tool_use", "text"]

    r = h.client.post("/v1/responses", json={
        "model": "fake", "input": "twice", "parallel_tool_calls": False,
        "tools": [{"type": "function", "name": n, "parameters": {"type": "object"}}
                  for n in ("get_weather", "get_time")]}).json()
    assert [o["type"] for o in r["output"]] == ["message", "function_call"]
    assert r["output"][1]["name"] == "get_weather" and r["parallel_tool_calls"] is False
    assert dict(h.metrics.cancelled) == cancelled  # ended as stops, not cancels
    r = h.client.post("/v1/chat/completions", json={**body, "parallel_tool_calls": "no"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "parallel_tool_calls"


def test_openai_fields_clients_send(h):
    """Fields of OpenAI's API (and vLLM's names) that clients send: `reasoning_effort` switches
    the template's thinking unless `chat_template_kwargs` does; `prediction` is checked and
    ignored; what this server has not (the deprecated `functions`, web search, audio out) is a
    400 naming it, not dropped; `repetition_penalty` and `top_k` -1 as vLLM takes them; a
    model named `name:latest` (Ollama's clients) is the served one."""
    h.client.post("/v1/chat/completions", json=chat(reasoning_effort="minimal"))
    assert h.model.rendered[-1].endswith("<enable_thinking=false>")
    h.client.post("/v1/chat/completions", json=chat(reasoning_effort="high"))
    assert h.model.rendered[-1].endswith("<enable_thinking=true>")
    h.client.post("/v1/chat/completions", json=chat(
        reasoning_effort="high", chat_template_kwargs={"enable_thinking": False}))
    assert h.model.rendered[-1].endswith("<enable_thinking=false>")
    ok = h.client.post("/v1/chat/completions", json=chat(
        prediction={"type": "content", "content": "Hi"}, top_k=-1, repetition_penalty=1.1,
        model="fake:latest"))
    assert ok.status_code == 200, ok.text
    assert ok.json()["choices"][0]["message"]["content"] == "Hi there!"
    for extra, param in (
            ({"reasoning_effort": "extreme"}, "reasoning_effort"),
            ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
            ({"function_call": "auto"}, "function_call"),
            ({"web_search_options": {}}, "web_search_options"),
            ({"modalities": ["text", "audio"]}, "modalities"),
            ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
            ({"prediction": {"type": "text"}}, "prediction.type"),
            ({"repetition_penalty": 1.1, "repeat_penalty": 1.2}, "repetition_penalty"),
            ({"repetition_penalty": 0}, "repetition_penalty"),
            ({"top_k": -2}, "top_k")):
        r = h.client.post("/v1/chat/completions", json=chat(**extra))
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)
    assert h.client.post("/v1/chat/completions", json=chat(modalities=["text"])).status_code == 200


def test_tool_result_round_trip_and_forced_choice(h):
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    history = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = h.client.post("/v1/chat/completions", json=chat(messages=history, tools=tools))
    assert r.status_code == 200, r.text
    assert "<tool>sunny" in h.model.rendered[-1]
    assert "<tool_call>get_weather</tool_call>" in h.model.rendered[-1]
    h.client.post("/v1/chat/completions",
                  json=chat(tools=tools, tool_choice={"type": "function",
                                                      "function": {"name": "get_weather"}}))
    assert h.engine.prefills[-1].endswith('<tool_call>\n{"name": "get_weather", "arguments": ')


def test_text_completion_and_echo(h):
    r = h.client.post("/v1/completions", json={"model": "fake", "prompt": "abc", "echo": True})
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "abcHi there!"
    assert body["usage"]["prompt_tokens"] == 3
    r = h.client.post("/v1/completions", json={"model": "fake", "prompt": [97, 98], "stream": True,
                                               "max_tokens": 2})
    chunks = [json.loads(d) for _, d in sse_events(r.text)[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hi"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_batch_of_prompts_is_a_choice_each(h):
    """`prompt` as an array of prompts (strings or id arrays), as OpenAI's and vLLM's
    completions take it: prompt i's choice j at index i * n + j, each answering its own prompt,
    streamed or not, echo giving each its own prompt; usage counts each prompt once; a bad
    prompt in the batch is a 400 naming its index."""
    h.engine.script = lambda p: f"<{p}>"
    body = {"model": "fake", "prompt": ["ab", [99, 100], "e"], "max_tokens": 10}
    r = h.client.post("/v1/completions", json=body).json()
    assert [c["text"] for c in r["choices"]] == ["<ab>", "<cd>", "<e>"]
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert r["usage"]["prompt_tokens"] == 5  # the answers and their end tokens:
    assert r["usage"]["completion_tokens"] == (4 + 1) + (4 + 1) + (3 + 1)
    r = h.client.post("/v1/completions", json={**body, "n": 2, "echo": True}).json()
    assert [c["text"] for c in r["choices"]] == ["ab<ab>", "ab<ab>", "cd<cd>", "cd<cd>",
                                                  "e<e>", "e<e>"]
    assert r["usage"]["prompt_tokens"] == 5
    r = h.client.post("/v1/completions", json={**body, "stream": True})
    texts: dict[int, str] = {}
    for _, d in sse_events(r.text)[:-1]:
        for c in json.loads(d)["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    assert texts == {0: "<ab>", 1: "<cd>", 2: "<e>"}
    for prompt, param in ((["ok", ""], "prompt[1]"), (["ok", [1, "x"]], "prompt[1][1]"),
                          (["ok", [999]], "prompt[1]"), (["x"] * 65, "prompt")):
        r = h.client.post("/v1/completions", json={**body, "prompt": prompt})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (prompt, r.text)


def test_a_completion_with_a_suffix_fills_in_the_middle(h):
    """`suffix` on /v1/completions: the prompt and suffix around the model's fill-in-the-middle
    tokens (the fake vocabulary's FIM_MARKS), usage counting that prompt; on a model without
    the tokens a non-empty suffix is a 400 naming it and an empty one a plain completion; a
    prompt of token ids, or echo, with a suffix is a 400."""
    from helpers.serve_fakes import FIM_MARKS
    pre, suf, mid = FIM_MARKS
    h.engine.script = lambda p: "x + 1"
    body = {"model": "fake", "prompt": "return ", "suffix": "\n", "max_tokens": 20}
    r = h.client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "x + 1"
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    assert h.engine.prefills[-1] == f"{pre}return {suf}\n{mid}"
    assert r.json()["usage"]["prompt_tokens"] == len("return \n") + 3
    r = h.client.post("/v1/completions", json={**body, "prompt": ["return "], "stream": True})
    chunks = [json.loads(d) for _, d in sse_events(r.text)[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "x + 1"
    for extra, param in (({"prompt": [1, 2]}, "prompt"), ({"echo": True}, "echo")):
        r = h.client.post("/v1/completions", json={**body, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)
    h.model.fim = False
    r = h.client.post("/v1/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    r = h.client.post("/v1/completions", json={**body, "suffix": ""})
    assert r.status_code == 200 and h.engine.prefills[-1] == "return "


# -- Anthropic ---------------------------------------------------------------------------

def msgs(**kw):
    body = {"model": "fake", "max_tokens": 256, "messages": [{"role": "user", "content": "hello"}]}
    body.update(kw)
    return body


def test_message_shape_with_system_blocks(h):
    r = h.client.post("/v1/messages", json=msgs(system=[{"type": "text", "text": "be brief"}]))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["type"] == "message" and body["id"].startswith("msg_")
    assert body["content"] == [{"type": "text", "text": "Hi there!"}]
    assert body["stop_reason"] == "end_turn" and body["stop_sequence"] is None
    assert body["usage"]["output_tokens"] == 10
    assert h.model.rendered[-1].startswith("<system>be brief<user>hello")


def test_message_stream_event_sequence(h):
    r = h.client.post("/v1/messages", json=msgs(stream=True))
    events = sse_events(r.text)
    names = [e for e, _ in events]
    assert names[:4] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    data = [json.loads(d) for _, d in events]
    assert all(d["type"] == e for (e, _), d in zip(events, data))
    text = "".join(d["delta"]["text"] for d in data if d["type"] == "content_block_delta")
    assert text == "Hi there!"
    assert data[-2]["delta"]["stop_reason"] == "end_turn"
    assert data[-2]["usage"]["output_tokens"] == 10


def test_message_tool_use_and_tool_result(h):
    tools = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    r = h.client.post("/v1/messages", json=msgs(
        messages=[{"role": "user", "content": "weather?"}], tools=tools))
    body = r.json()
    assert body["stop_reason"] == "tool_use"
    text, use = body["content"]
    assert text == {"type": "text", "text": "Checking."}
    assert use["type"] == "tool_use" and use["id"].startswith("toolu_")
    assert use["input"] == {"city": "Paris"}
    follow = [{"role": "user", "content": "weather?"},
              {"role": "assistant", "content": body["content"]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                            "content": [{"type": "text", "text": "sunny"}]}]}]
    r = h.client.post("/v1/messages", json=msgs(messages=follow, tools=tools))
    assert r.status_code == 200, r.text
    assert "<tool>sunny" in h.model.rendered[-1]

    events = sse_events(h.client.post("/v1/messages", json=msgs(
        messages=[{"role": "user", "content": "weather?"}], tools=tools, stream=True)).text)
    data = [json.loads(d) for _, d in events]
    starts = [d["content_block"] for d in data if d["type"] == "content_block_start"]
    assert [s["type"] for s in starts] == ["text", "tool_use"]
    (js,) = [d["delta"]["partial_json"] for d in data
             if d["type"] == "content_block_delta" and d["delta"]["type"] == "input_json_delta"]
    assert json.loads(js) == {"city": "Paris"}


@pytest.mark.parametrize("content, path", [
    ([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}],
     "messages[0].content[0]"),
    ([{"type": "tool_result", "tool_use_id": "t1", "content": [
        {"type": "text", "text": "see"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A"}}]}],
     "messages[0].content[0].content[1]"),
])
def test_image_blocks_are_refused_by_path(h, content, path):
    r = h.client.post("/v1/messages", json=msgs(messages=[{"role": "user", "content": content}]))
    assert r.status_code == 400
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert path in err["error"]["message"] and "image" in err["error"]["message"]


def test_openai_image_part_refused_by_path(h):
    r = h.client.post("/v1/chat/completions", json=chat(messages=[{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]}]))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages[0].content[1]"


# -- errors ------------------------------------------------------------------------------

@pytest.mark.parametrize("body, status, param", [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (json.dumps(chat(max_tokens="ten")).encode(), 400, "max_tokens"),
    (json.dumps(chat(temperature=9)).encode(), 400, "temperature"),
    (json.dumps(chat(messages=[{"role": "wizard", "content": "x"}])).encode(), 400,
     "messages[0].role"),
    (json.dumps(chat(messages=[])).encode(), 400, "messages"),
    (json.dumps(chat(model="gpt-9")).encode(), 404, "model"),
    (json.dumps(chat(n=17)).encode(), 400, "n"),
    (json.dumps(chat(presence_penalty=2.5)).encode(), 400, "presence_penalty"),
    (json.dumps(chat(frequency_penalty="high")).encode(), 400, "frequency_penalty"),
    (json.dumps(chat(repeat_penalty=0)).encode(), 400, "repeat_penalty"),
    (json.dumps(chat(repeat_last_n=-1)).encode(), 400, "repeat_last_n"),
    (json.dumps(chat(min_p=1.5)).encode(), 400, "min_p"),
])
def test_openai_errors_name_the_field(h, body, status, param):
    r = h.client.post("/v1/chat/completions", content=body,
                      headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert err["param"] == param and err["message"]
    assert err["type"] == "invalid_request_error"  # OpenAI's, for an unknown model too
    assert err["code"] == ("model_not_found" if status == 404 else None)


def test_anthropic_errors_use_its_shape(h):
    r = h.client.post("/v1/messages", json={"model": "fake", "messages": []})
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "max_tokens: this field is required"}}


def test_auth_required_by_header_or_bearer(h):
    bare = TestClient(h.app)
    assert bare.get("/v1/models").status_code == 401
    err = bare.get("/v1/models").json()["error"]  # OpenAI's words for it
    assert (err["type"], err["code"]) == ("invalid_request_error", "invalid_api_key")
    assert bare.post("/v1/messages", json=msgs()).json()["error"]["type"] == "authentication_error"
    assert bare.get("/v1/models", headers={"x-api-key": "nope"}).status_code == 401
    assert bare.get("/v1/models", headers={"x-api-key": KEY}).status_code == 200
    assert bare.get("/health").status_code == 200  # liveness stays open
    # both headers (Claude Code with both of its key variables set): either may hold the key
    both = {"x-api-key": "for-anthropic", "authorization": f"Bearer {KEY}"}
    assert bare.get("/v1/models", headers=both).status_code == 200
    both = {"x-api-key": KEY, "authorization": "Bearer for-someone-else"}
    assert bare.get("/v1/models", headers=both).status_code == 200
    both = {"x-api-key": "nope", "authorization": "Bearer nope"}
    assert bare.get("/v1/models", headers=both).status_code == 401


def test_anthropic_system_turns_thinking_default_and_redacted_thinking(h):
    """As Anthropic's API takes them: a `system` message among the messages (Claude Code's
    reminders) is a system turn where it stands; a request without `thinking` runs with it
    off (the template's `enable_thinking`), `adaptive` leaves it to the template; a
    `redacted_thinking` block (Anthropic's own encrypted reasoning) is dropped."""
    turns = [{"role": "user", "content": "hello"},
             {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
             {"role": "assistant", "content": [
                 {"type": "redacted_thinking", "data": "c2VjcmV0"},
                 {"type": "text", "text": "Hi."}]},
             {"role": "system", "content": "reminder"},
             {"role": "user", "content": "and now?"}]
    r = h.client.post("/v1/messages", json=msgs(messages=turns))
    assert r.status_code == 200, r.text
    assert h.model.rendered[-1] == ("<user>hello<system>be brief<assistant>Hi.<system>reminder"
                                    "<user>and now?<assistant><enable_thinking=false>")
    assert h.client.post("/v1/messages/count_tokens", json=msgs(messages=turns)).status_code == 200
    h.client.post("/v1/messages", json=msgs(thinking={"type": "enabled", "budget_tokens": 1024}))
    assert h.model.rendered[-1].endswith("<enable_thinking=true>")
    h.client.post("/v1/messages", json=msgs(thinking={"type": "adaptive"}))
    assert h.model.rendered[-1].endswith("<assistant>")
    bad = [{"role": "user", "content": "x"}, {"role": "system", "content": ""}]
    r = h.client.post("/v1/messages", json=msgs(messages=bad))
    assert r.status_code == 400 and "messages[1].content" in r.json()["error"]["message"]
    bad = [{"role": "user", "content": "x"},
           {"role": "assistant", "content": [{"type": "redacted_thinking"}]}]
    r = h.client.post("/v1/messages", json=msgs(messages=bad))
    assert r.status_code == 400 and "data" in r.json()["error"]["message"]


def test_oversize_body_is_a_413(h):
    big = chat(messages=[{"role": "user", "content": "x" * (70 << 10)}])
    r = h.client.post("/v1/chat/completions", json=big)
    assert r.status_code == 413
    assert "limit" in r.json()["error"]["message"]


def test_unknown_route_and_method_are_json(h):
    r = h.client.get("/v1/nothing")
    assert r.status_code == 404 and "no route" in r.json()["error"]["message"]
    r = h.client.get("/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"


def test_embedding_routes_say_why_in_each_dialect(h):
    """An embeddings call (a RAG client pointed at this server) is a 400 saying there is no
    embedding model here, in the dialect's shape, and runs nothing."""
    r = h.client.post("/v1/embeddings", json={"model": "fake", "input": "hi"})
    assert r.status_code == 400 and "embeddings are not available" in r.json()["error"]["message"]
    for path in ("/api/embed", "/api/embeddings"):
        r = h.client.post(path, json={"model": "fake", "input": "hi"})
        assert r.status_code == 400 and list(r.json()) == ["error"], path
        assert "'fake' is a generative model" in r.json()["error"]
    assert h.engine.prefills == []


def test_internal_failure_is_a_logged_500_and_the_server_lives(h, caplog):
    def boom(messages, tools, extra=None):
        raise RuntimeError("template exploded")
    h.model.render_chat = boom
    r = h.client.post("/v1/messages", json=msgs())
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "api_error"
    assert "template exploded" in caplog.text
    assert h.client.get("/health").json()["status"] == "ok"


def test_metrics_and_monitor(h):
    h.client.post("/v1/chat/completions", json=chat())
    text = h.client.get("/metrics").text
    assert 'strata_requests_total{route="/v1/chat/completions",status="200"} 1' in text
    assert "strata_completion_tokens_total 10" in text
    assert "# TYPE strata_decode_tokens_per_second gauge" in text
    mon = h.client.get("/monitor.json").json()
    assert mon["model"] == "fake" and mon["metrics"]["slots"] == 2
    page = h.client.get("/", headers={"accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
    assert page.headers["content-type"].startswith("text/html")
    # a program's probe (no text/html asked for) gets Ollama's answer at its root
    probe = h.client.get("/")
    assert probe.status_code == 200 and probe.text == "Ollama is running"
    assert h.client.head("/").status_code == 200
    schema = h.client.get("/openapi.json").json()
    assert "/v1/messages" in schema["paths"]


class KeepingEngine(ScriptedEngine):
    """A scripted engine that keeps a finished request's tokens and reports, at the next
    prefill, how many leading tokens of its prompt they cover (all but its last, at most)."""

    keeps_prefix = True

    def __init__(self, script, **kw):
        super().__init__(script, **kw)
        self.kept: list[int] = []
        self.n_reused = 0

    def prefill(self, slot, tokens, reuse=True):
        n = 0
        while reuse and n < min(len(self.kept), len(tokens) - 1) and self.kept[n] == tokens[n]:
            n += 1
        self.n_reused = n
        return super().prefill(slot, tokens)

    def release(self, slot, tokens=None):
        self.kept = list(tokens or [])
        super().release(slot)


def test_a_next_turn_reports_its_cached_prompt_tokens_in_both_dialects():
    """OpenAI's usage.prompt_tokens_details.cached_tokens and Anthropic's
    cache_read_input_tokens (input_tokens then counts the computed rest) carry the tokens the
    engine reused; a first turn reports 0."""
    with Harness(engine_class=KeepingEngine) as h:
        first = h.client.post("/v1/chat/completions", json=chat()).json()
        assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        turns = [{"role": "user", "content": "hello"},
                 {"role": "assistant", "content": "Hi there!"},
                 {"role": "user", "content": "and now?"}]
        n_kept = len(h.engine.kept)  # the first turn's prompt and answer
        second = h.client.post("/v1/chat/completions", json=chat(messages=turns)).json()
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert 0 < cached <= n_kept and cached == h.engine.n_reused
        # (thinking left to the template, so the prompt is the chat route's)
        third = h.client.post("/v1/messages", json=msgs(messages=turns,
                                                        thinking={"type": "adaptive"})).json()
        n_prompt = second["usage"]["prompt_tokens"]
        assert third["usage"]["cache_read_input_tokens"] == h.engine.n_reused == n_prompt - 1
        assert third["usage"]["input_tokens"] == 1
        stream = h.client.post("/v1/messages", json=msgs(messages=turns, stream=True,
                                                         thinking={"type": "adaptive"}))
        events = sse_events(stream.text)
        # message_start is sent once the prompt has run: its usage splits the prompt already
        assert [e for e, _ in events[:2]] == ["message_start", "ping"]
        start = json.loads(events[0][1])["message"]["usage"]
        assert (start["input_tokens"], start["cache_read_input_tokens"]) == (1, n_prompt - 1)
        delta = [json.loads(d) for e, d in events if e == "message_delta"][0]
        assert delta["usage"]["cache_read_input_tokens"] == n_prompt - 1
        assert delta["usage"]["input_tokens"] + delta["usage"]["cache_read_input_tokens"] == \
            n_prompt


def _preflight(client, origin):
    return client.options("/v1/chat/completions", headers={
        "origin": origin, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})


@pytest.mark.parametrize("extra, origin, allowed", [
    ((), "http://localhost:3000", True),
    ((), "http://127.0.0.1:5173", True),
    ((), "http://[::1]", True),
    ((), "https://evil.example", False),
    ((), "http://localhost.evil.example", False),
    (("https://app.example:8443",), "https://app.example:8443", True),
    (("https://app.example:8443",), "https://app.example", False),
    (("*",), "https://anything.example", True),
])
def test_browser_origins_are_this_machines_and_those_named(extra, origin, allowed):
    """A page on this machine (any port) may call the server from a browser, others only where
    `--cors-origin` names them: the preflight (answered before auth) and the real request's
    header say so; a refused origin gets no allow header (the browser then blocks the read)."""
    with Harness(cors_origins=extra) as h:
        pre = _preflight(h.client, origin)
        got = h.client.get("/v1/models", headers={"origin": origin})
        assert got.status_code == 200
        if allowed:
            assert pre.status_code == 200
            assert pre.headers["access-control-allow-origin"] in (origin, "*")
            assert "POST" in pre.headers["access-control-allow-methods"]
            assert got.headers["access-control-allow-origin"] in (origin, "*")
        else:
            assert pre.status_code == 400
            assert "access-control-allow-origin" not in got.headers


def test_cors_origins_are_checked():
    from strata.serve.config import ServeConfig, ServeConfigError

    assert ServeConfig(model="m", cors_origins=("https://a.example:1", "*")).cors_origins
    for bad in ("a.example", "https://a.example/path", "ftp://a.example"):
        with pytest.raises(ServeConfigError, match="cors_origins"):
            ServeConfig(model="m", cors_origins=(bad,))


class SlowPromptEngine(ScriptedEngine):
    """A prompt that takes 0.3 s to run, as a long one does on a GPU."""

    def prefill(self, slot, tokens):
        time.sleep(0.3)
        return super().prefill(slot, tokens)


def test_a_silent_stream_sends_keep_alive_comments(monkeypatch):
    """While a stream has nothing to send (its prompt queued or running), it sends an SSE
    comment every KEEP_ALIVE_S, which SSE readers skip, so a client's idle watchdog does not
    give up on it; the events are those of a stream without them."""
    from strata.serve import sse as sse_mod
    with Harness(engine_class=SlowPromptEngine) as h:
        quick = h.client.post("/v1/messages", json=msgs(stream=True)).text
        assert sse_mod.KEEP_ALIVE.decode() not in quick  # the default: every 10 s
        monkeypatch.setattr(sse_mod, "KEEP_ALIVE_S", 0.05)
        slow = h.client.post("/v1/messages", json=msgs(stream=True)).text
        assert slow.startswith(sse_mod.KEEP_ALIVE.decode())
        assert slow.count(": keep-alive") >= 3
        events = [(e, d) for e, d in sse_events(slow) if (e, d) != (None, None)]
        strip = [(e, d) for e, d in sse_events(quick)]

        def same(a, b):  # ids and timings aside
            return [e for e, _ in a] == [e for e, _ in b]
        assert same(events, strip)
        chat_stream = h.client.post("/v1/chat/completions", json=chat(stream=True)).text
        # (the role chunk goes out at once, then the wait)
        assert ": keep-alive" in chat_stream and chat_stream.rstrip().endswith("data: [DONE]")


def test_the_sdks_read_through_keep_alive_comments(monkeypatch):
    """The official openai and anthropic clients (over the in-process app) skip the comments:
    their streams give the answer's text as without them."""
    anthropic = pytest.importorskip("anthropic")
    openai = pytest.importorskip("openai")
    from strata.serve import sse as sse_mod
    monkeypatch.setattr(sse_mod, "KEEP_ALIVE_S", 0.05)
    with Harness(engine_class=SlowPromptEngine) as h:
        a = anthropic.Anthropic(base_url="http://testserver", api_key=KEY, http_client=h.client)
        with a.messages.stream(model="fake", max_tokens=64,
                               messages=[{"role": "user", "content": "hello"}]) as s:
            assert "".join(s.text_stream) == "Hi there!"
        o = openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=h.client)
        stream = o.chat.completions.create(model="fake", stream=True,
                                           messages=[{"role": "user", "content": "hello"}])
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == \
            "Hi there!"


@pytest.mark.parametrize("route, body", [
    ("/v1/chat/completions", {"model": "fake", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "<note>be kind</note>"}, {"type": "text", "text": "hello"}]}]}),
    ("/v1/messages", {"model": "fake", "max_tokens": 20, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "<note>be kind</note>"}, {"type": "text", "text": "hello"}]}]}),
    ("/v1/responses", {"model": "fake", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "<note>be kind</note>"},
        {"type": "input_text", "text": "hello"}]}]}),
])
def test_text_parts_of_a_message_reach_the_template_a_line_apart(h, route, body):
    """Claude Code sends a reminder block before the user's words: back to back they ran
    together ("</note>hello"); every route joins a message's parts with a newline, as vLLM."""
    r = h.client.post(route, json=body)
    assert r.status_code == 200, r.text
    assert "<user><note>be kind</note>\nhello" in h.model.rendered[-1]


def test_anthropic_tool_result_blocks_are_joined_a_line_apart(h):
    r = h.client.post("/v1/messages", json=msgs(messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "sunny"}, {"type": "text", "text": "20 C"}]}]}]))
    assert r.status_code == 200, r.text
    assert "<tool>sunny\n20 C" in h.model.rendered[-1]


def test_every_response_names_its_request(h):
    """x-request-id (the OpenAI SDK's `_request_id`) and request-id (the Anthropic SDK's), one
    id, fresh per request; a client's own plain x-request-id comes back, any other is
    replaced; errors and streams carry it too."""
    a = h.client.post("/v1/chat/completions", json=chat(max_tokens=3))
    b = h.client.post("/v1/messages", json=msgs())
    for r in (a, b):
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        assert rid == r.headers["request-id"] and re.fullmatch(r"req_[0-9a-f]{24}", rid)
    assert a.headers["x-request-id"] != b.headers["x-request-id"]
    own = h.client.post("/v1/chat/completions", json=chat(max_tokens=3),
                        headers={"x-request-id": "trace-42.a_b"})
    assert own.headers["x-request-id"] == own.headers["request-id"] == "trace-42.a_b"
    odd = h.client.get("/v1/models", headers={"x-request-id": "a b\\u00e9"})
    assert re.fullmatch(r"req_[0-9a-f]{24}", odd.headers["x-request-id"])
    bad = h.client.post("/v1/chat/completions", json={"model": "fake"})
    assert bad.status_code == 400 and bad.headers["request-id"].startswith("req_")
    with h.client.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as s:
        assert s.headers["x-request-id"].startswith("req_")
        assert "[DONE]" in "".join(s.iter_text())
    cors = h.client.options("/v1/chat/completions", headers={
        "origin": "http://localhost:3000", "access-control-request-method": "POST"})
    assert cors.status_code == 200 and cors.headers["x-request-id"].startswith("req_")
