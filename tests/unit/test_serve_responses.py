"""The OpenAI Responses API (`POST /v1/responses`) in process over the scripted engine: the
response object and its output items (text, function calls), the streamed events in order with
their sequence numbers (replayed into the same output the whole response has), a conversation
with a tool's output, structured output, budgets, and the fields refused with a 400 naming them.
The official SDK against a real server: tests/e2e/test_serve_sdk.py."""

from __future__ import annotations

import json

import pytest

from test_serve_app import Harness, sse_events

ASK = "weather?"
TOOLS = [{"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
    "additionalProperties": False}}]


@pytest.fixture
def h():
    with Harness() as harness:
        yield harness


def body(**kw):
    out = {"model": "fake", "input": "hello"}
    out.update(kw)
    return out


def _post(h, **kw):
    r = h.client.post("/v1/responses", json=body(**kw))
    assert r.status_code == 200, r.text
    return r.json()


def test_a_text_answer(h):
    r = _post(h, instructions="be brief", max_output_tokens=50, temperature=0)
    assert r["object"] == "response" and r["id"].startswith("resp_")
    assert r["status"] == "completed" and r["incomplete_details"] is None
    (msg,) = r["output"]
    assert msg["type"] == "message" and msg["role"] == "assistant"
    assert msg["status"] == "completed" and msg["id"].startswith("msg_")
    assert msg["content"] == [{"type": "output_text", "text": "Hi there!", "annotations": [],
                               "logprobs": []}]
    u = r["usage"]
    assert u["output_tokens"] == 10  # 9 characters and the end-of-turn token
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
    assert r["instructions"] == "be brief" and r["max_output_tokens"] == 50
    assert "<system>be brief<user>hello" in h.model.rendered[-1]


def test_a_budget_cut_is_incomplete(h):
    r = _post(h, max_output_tokens=3)
    assert r["status"] == "incomplete"
    assert r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r["output"][0]["content"][0]["text"] == "Hi "


def test_function_calls_and_their_outputs(h):
    r = _post(h, input=[{"role": "user", "content": [{"type": "input_text", "text": ASK}]}],
              tools=TOOLS)
    text, call = r["output"]
    assert text["content"][0]["text"] == "Checking."
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert call["call_id"].startswith("call_") and call["id"].startswith("fc_")
    assert json.loads(call["arguments"]) == {"city": "Paris"} and call["status"] == "completed"
    assert r["tools"][0]["strict"] is True  # the API's default, its schema held
    follow = [{"role": "user", "content": ASK}, text, call,
              {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}]
    r = _post(h, input=follow, tools=TOOLS)
    assert r["output"][0]["content"][0]["text"] == "Hi there!"
    rendered = h.model.rendered[-1]
    assert "<assistant>Checking.<tool_call>get_weather</tool_call><tool>sunny" in rendered


def test_the_stream_replays_into_the_whole_response(h):
    whole = _post(h, input=ASK, tools=TOOLS)
    r = h.client.post("/v1/responses", json=body(input=ASK, tools=TOOLS, stream=True))
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [(name, json.loads(data)) for name, data in sse_events(r.text)]
    assert all(name == e["type"] for name, e in events)
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    kinds = [name for name, _ in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done")
    # replay the events as a client does: items added, text and arguments appended
    output: list[dict] = []
    for name, e in events:
        if name == "response.output_item.added":
            assert e["output_index"] == len(output)
            output.append(e["item"])
        elif name == "response.content_part.added":
            output[e["output_index"]]["content"].append(e["part"])
        elif name == "response.output_text.delta":
            output[e["output_index"]]["content"][e["content_index"]]["text"] += e["delta"]
        elif name == "response.function_call_arguments.delta":
            output[e["output_index"]]["arguments"] += e["delta"]
        elif name == "response.output_item.done":
            assert e["item"]["status"] == "completed"
            output[e["output_index"]] = e["item"]
    final = events[-1][1]["response"]
    strip = lambda items: [{k: v for k, v in i.items() if k not in ("id", "call_id")}  # noqa
                           for i in items]
    assert strip(output) == strip(final["output"]) == strip(whole["output"])
    assert final["usage"] == whole["usage"] and final["status"] == "completed"
    created = events[0][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == []


def test_a_streamed_budget_cut_ends_incomplete(h):
    r = h.client.post("/v1/responses", json=body(max_output_tokens=2, stream=True))
    name, last = sse_events(r.text)[-1]
    assert name == "response.incomplete"
    assert json.loads(last)["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_the_item_a_budget_cut_is_incomplete_stored_and_streamed(h):
    r = _post(h, max_output_tokens=3)
    assert [i["status"] for i in r["output"]] == ["incomplete"]  # as OpenAI marks it
    stored = h.client.get(f"/v1/responses/{r['id']}").json()
    assert [i["status"] for i in stored["output"]] == ["incomplete"]
    events = [(e, json.loads(d)) for e, d in sse_events(h.client.post(
        "/v1/responses", json=body(max_output_tokens=2, stream=True)).text)]
    (done,) = [d["item"] for e, d in events if e == "response.output_item.done"]
    assert done["type"] == "message" and done["status"] == "incomplete"
    final = events[-1][1]["response"]
    assert [i["status"] for i in final["output"]] == ["incomplete"]
    assert [i["status"] for i in h.client.get(f"/v1/responses/{final['id']}").json()[
        "output"]] == ["incomplete"]
    whole = _post(h, max_output_tokens=50)  # an answer that ended itself stays completed
    assert [i["status"] for i in whole["output"]] == ["completed"]


def test_a_json_schema_format_holds_the_answer(h):
    h.engine.script = lambda prompt: '{"a": [1], "z": 2} and prose'
    fmt = {"type": "json_schema", "name": "t", "strict": True, "schema": {
        "type": "object", "properties": {"a": {"type": "array", "items": {"type": "number"}}},
        "required": ["a"], "additionalProperties": False}}
    r = _post(h, text={"format": fmt}, max_output_tokens=40)
    assert json.loads(r["output"][0]["content"][0]["text"]) == {"a": [1]}
    assert r["text"] == {"format": fmt}
    r = _post(h, text={"format": {"type": "json_object"}})
    assert json.loads(r["output"][0]["content"][0]["text"]) == {"a": [1], "z": 2}


def test_a_schema_outside_the_subset_is_strict_only_when_asked(h):
    loose = [{**TOOLS[0], "parameters": {"type": "object", "properties": {
        "d": {"type": "string", "format": "date"}}}}]
    r = _post(h, input=ASK, tools=loose)
    assert r["tools"][0]["strict"] is False  # said, not silently dropped
    r = h.client.post("/v1/responses", json=body(tools=[{**loose[0], "strict": True}]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].parameters"


@pytest.mark.parametrize("extra, param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"input": []}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"include": ["file_search_call.results"]}, "include[0]"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"temperature": 3}, "temperature"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "other"}, "model"),
])
def test_what_it_cannot_do_is_a_400_naming_the_field(h, extra, param):
    r = h.client.post("/v1/responses", json=body(**extra))
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"]


def test_logprobs_whole_and_streamed_are_the_chat_routes(h):
    """`include: ["message.output_text.logprobs"]` with `top_logprobs`: the output_text part
    carries the chat route's entries for the same answer, and the stream's deltas each carry
    their own tokens' (together the part's); without them, none."""
    kw = dict(include=["message.output_text.logprobs"], top_logprobs=3)
    r = _post(h, **kw)
    part = r["output"][0]["content"][0]
    chat = h.client.post("/v1/chat/completions", json={
        "model": "fake", "messages": [{"role": "user", "content": "hello"}],
        "logprobs": True, "top_logprobs": 3}).json()["choices"][0]
    assert part["logprobs"] == chat["logprobs"]["content"] and len(part["logprobs"]) == 9
    assert "".join(e["token"] for e in part["logprobs"]) == part["text"] == "Hi there!"
    assert all(len(e["top_logprobs"]) == 3 for e in part["logprobs"]) and r["top_logprobs"] == 3
    r = h.client.post("/v1/responses", json=body(stream=True, **kw))
    events = [json.loads(d) for _, d in sse_events(r.text)]
    streamed = []
    for e in events:
        if e["type"] == "response.output_text.delta":
            assert "".join(x["token"] for x in e["logprobs"]) == e["delta"]
            streamed += e["logprobs"]
    assert streamed == part["logprobs"]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["logprobs"] == part["logprobs"]
    assert _post(h, top_logprobs=2)["output"][0]["content"][0]["logprobs"][0]["top_logprobs"]
    assert _post(h)["output"][0]["content"][0]["logprobs"] == []  # not asked for


def test_the_openapi_document_lists_the_route(h):
    doc = h.client.get("/openapi.json").json()
    assert "/v1/responses" in doc["paths"]


def test_usage_has_the_fields_the_sdk_types_require(h):
    """The SDK's `ResponseUsage` requires `input_tokens_details.cache_write_tokens` (and
    `output_tokens_details.reasoning_tokens`): a client that validates the object (typed SDKs
    in other languages) fails without them. Whole and streamed."""
    types = pytest.importorskip("openai.types.responses")
    r = _post(h)
    assert r["usage"]["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}
    types.Response.model_validate(r)  # the whole object as the SDK's types have it
    s = h.client.post("/v1/responses", json=body(stream=True, input=ASK, tools=TOOLS))
    last = json.loads(sse_events(s.text)[-1][1])
    types.ResponseCompletedEvent.model_validate(last)


def test_the_settings_it_does_not_act_on_are_repeated_as_sent(h):
    """OpenAI's response repeats `reasoning`, `truncation` and `user` as the request sent them
    (Codex sends `reasoning: {effort, summary}`); absent, the API's defaults."""
    r = _post(h, reasoning={"effort": "high", "summary": "auto"}, truncation="auto", user="u1")
    assert r["reasoning"] == {"effort": "high", "summary": "auto"}
    assert r["truncation"] == "auto" and r["user"] == "u1"
    r = _post(h)
    assert r["reasoning"] == {"effort": None, "summary": None}
    assert r["truncation"] == "disabled" and r["user"] is None


def test_the_effort_switches_the_templates_thinking(h):
    """`reasoning.effort` as the chat route's `reasoning_effort`: "none" and "minimal" turn the
    template's `enable_thinking` off (Codex's lowest efforts), the others on; absent, the
    template decides; an effort the API has not is a 400 naming it."""
    _post(h, reasoning={"effort": "minimal", "summary": "auto"})
    assert h.model.rendered[-1].endswith("<enable_thinking=false>")
    _post(h, reasoning={"effort": "medium"})
    assert h.model.rendered[-1].endswith("<enable_thinking=true>")
    _post(h)
    assert "enable_thinking" not in h.model.rendered[-1]
    r = h.client.post("/v1/responses", json={"model": "fake", "input": "hi",
                                             "reasoning": {"effort": "maximal"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning.effort", r.text


def test_a_prompt_template_is_refused_not_ignored(h):
    """`prompt` names a template stored on OpenAI's side (its instructions and messages);
    answering without them would be a different request, so it is a 400 naming the field."""
    r = h.client.post("/v1/responses", json=body(prompt={"id": "pmpt_1", "version": "2"}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert "prompt" in r.json()["error"]["message"]


def test_a_prompt_past_the_context_names_input_not_messages():
    """The chat route's conversation is `messages`; this API's is `input`: a prompt the context
    cannot hold names the field this API has."""
    with Harness(max_context=32) as small:
        for stream in (False, True):
            r = small.client.post("/v1/responses", json=body(input="word " * 64, stream=stream))
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == "input" and "context" in err["message"]
            assert not err["message"].startswith("messages")


def test_codex_default_web_search_tool_is_refused_with_the_way_out(h):
    """Codex sends `{"type": "web_search", "external_web_access": false}` unless its config
    turns search off; the 400 names the tool and says how (built-in tools stay refused)."""
    r = h.client.post("/v1/responses", json=body(tools=[
        *TOOLS, {"type": "web_search", "external_web_access": False}]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[1].type"
    assert 'web_search = "disabled"' in r.json()["error"]["message"]
