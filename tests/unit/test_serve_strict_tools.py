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


def test_a_forced_call_is_held_to_a_call_without_strict_tools(h):
    """A forced call (a named tool, or "required") comes back as a call even where no tool is
    strict: the call document is held, its arguments to any JSON object. Without that, text
    that ran past the opened call was returned as its raw markup to a client promised a call."""
    h.engine.script = lambda prompt: '{"city": "Paris"} and then words the model went on to'
    forced = {"type": "function", "function": {"name": "get_weather"}}
    _, args = _call(chat(messages=ASK, tools=_tools(False), tool_choice=forced), h)
    assert args == {"city": "Paris"}
    h.engine.script = lambda prompt: ('{"name": "get_weather", "arguments": {"city": "Rome"}}'
                                      ' trailing')
    _, args = _call(chat(messages=ASK, tools=_tools(False), tool_choice="required"), h)
    assert args == {"city": "Rome"}
    # a call the model may or may not make stays free text where no tool is strict
    h.engine.script = lambda prompt: 'Plain words, {"city": "Paris"} and </tool_call>.'
    r = h.client.post("/v1/chat/completions", json=chat(tools=_tools(False))).json()
    assert r["choices"][0]["message"]["content"] == \
        'Plain words, {"city": "Paris"} and </tool_call>.'


def test_a_forced_call_after_a_think_block_the_template_opened(h):
    """A template that opens `<think>` in its generation prompt (a thinking-only model's): a
    forced call is the answer, so the prompt closes the block empty before it, as Qwen3's
    template does with thinking off, and no tag reaches the answer."""
    render = h.model.render_chat
    h.model.render_chat = lambda *a, **k: render(*a, **k) + "<think>\n"
    h.model.splits_thinking = True
    h.engine.script = lambda prompt: '{"city": "Oslo"}'
    forced = {"type": "function", "function": {"name": "get_weather"}}
    text, args = _call(chat(messages=ASK, tools=_tools(False), tool_choice=forced), h)
    assert args == {"city": "Oslo"} and text in ("", None)
    assert h.engine.prefills[-1].endswith(
        '<think>\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": ')
    h.engine.script = lambda prompt: "a</think>\n\nHi."  # not forced: the answer opens in it
    r = h.client.post("/v1/chat/completions", json=chat(messages=ASK, tools=_tools(False)))
    assert h.engine.prefills[-1].endswith("<assistant><think>\n")
    assert r.json()["choices"][0]["message"]["reasoning_content"] == "a"
