"""Strict tools (`"strict": true` on an OpenAI function): the calls the model makes are held to
the tool's parameters' schema, in free text (a call it opens must be whole and valid), in a
forced call (the prompt opened it), and a schema keyword the calls could not be held to is a 400
naming the tool. The constraint is `strata.engine.json_trigger`, tested alone in
test_json_trigger; here over the scripted engine (one-hot logits: the constrained arg-max takes
the scripted byte wherever the schema allows it, else the lowest allowed)."""

from __future__ import annotations

import json

import pytest

from test_serve_app import Harness, chat, sse_events

ASK = [{"role": "user", "content": "weather?"}]


def _tools(strict: bool, cities=("Rome", "Oslo")) -> list[dict]:
    return [{"type": "function", "function": {
        "name": "get_weather", "strict": strict,
        "parameters": {"type": "object", "properties": {"city": {"enum": list(cities)}},
                       "required": ["city"], "additionalProperties": False}}}]


@pytest.fixture
def h():
    with Harness() as harness:
        yield harness


def _call(body: dict, h) -> tuple[str, dict]:
    r = h.client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    return choice["message"]["content"], json.loads(call["function"]["arguments"])


def test_a_strict_tools_call_is_held_to_its_schema(h):
    """The script calls get_weather for Paris: free, the call goes through as written; strict,
    the city is bent into the schema's enum (the prose before the call is untouched)."""
    assert _call(chat(messages=ASK, tools=_tools(False)), h) == ("Checking.", {"city": "Paris"})
    text, args = _call(chat(messages=ASK, tools=_tools(True)), h)
    assert text == "Checking." and args["city"] in ("Rome", "Oslo")
    body = chat(messages=ASK, tools=_tools(True, cities=("Paris", "Rome")), stream=True)
    chunks = [json.loads(d) for _, d in sse_events(h.client.post(
        "/v1/chat/completions", json=body).text)[:-1]]
    (tc,) = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks
             if "tool_calls" in c["choices"][0]["delta"]]
    assert json.loads(tc["function"]["arguments"]) == {"city": "Paris"}  # allowed: unchanged


def test_a_forced_strict_call_starts_inside_the_arguments(h):
    h.engine.script = lambda prompt: '{"city": "Oslo", "x": 1}}\n</tool_call>'
    forced = {"type": "function", "function": {"name": "get_weather"}}
    text, args = _call(chat(messages=ASK, tools=_tools(True), tool_choice=forced), h)
    assert args == {"city": "Oslo"} and text in ("", None)  # the extra key was refused
    h.engine.script = lambda prompt: '{"name": "get_weather", "arguments": {"city": "Rome"}}'
    _, args = _call(chat(messages=ASK, tools=_tools(True), tool_choice="required"), h)
    assert args == {"city": "Rome"}  # and closed by the suffix the constraint wrote


def test_a_strict_schema_it_cannot_hold_is_a_400_naming_the_tool(h):
    tools = [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"d": {"type": "string", "format": "date"}}}}}]
    r = h.client.post("/v1/chat/completions", json=chat(messages=ASK, tools=tools))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tools[0].function.parameters"
    assert "format not supported" in r.json()["error"]["message"]
    # the same schema without strict is only the template's business
    tools[0]["function"]["strict"] = False
    assert h.client.post("/v1/chat/completions",
                         json=chat(messages=ASK, tools=tools)).status_code == 200


def test_prose_without_a_call_is_untouched(h):
    h.engine.script = lambda prompt: 'Plain words, even {"city": "Paris"} and </tool_call>.'
    r = h.client.post("/v1/chat/completions", json=chat(tools=_tools(True)))
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == 'Plain words, even {"city": "Paris"} and </tool_call>.'
    assert choice["finish_reason"] == "stop"
