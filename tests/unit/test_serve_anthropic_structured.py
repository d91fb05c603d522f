"""Structured outputs on the Anthropic route (`POST /v1/messages`), over the scripted engine
(one-hot logits: the constrained arg-max takes the scripted byte wherever the schema allows
it): `output_config.format` (and its older name `output_format`) holds the answer's text to the
schema, a strict tool's input to its `input_schema`, and what cannot be held is a 400 naming
where it is. The constraints are tested alone in test_json_constraint and test_json_trigger."""

from __future__ import annotations

import json

import pytest

from strata.engine.json_constraint import feed, start
from strata.engine.json_schema import compile_schema
from test_serve_app import Harness, msgs, sse_events

SCHEMA = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "number"}},
                                           "b": {"type": "object"}},
          "required": ["a"], "additionalProperties": False}
FORMAT = {"format": {"type": "json_schema", "schema": SCHEMA}}
TOOLS = [{"name": "get_weather", "strict": True, "input_schema": {
    "type": "object", "properties": {"city": {"enum": ["Rome", "Oslo"]}},
    "required": ["city"], "additionalProperties": False}}]


@pytest.fixture
def h():
    with Harness() as harness:
        yield harness


def _text(r) -> str:
    assert r.status_code == 200, r.text
    (block,) = r.json()["content"]
    assert block["type"] == "text"
    return block["text"]


def test_the_answer_follows_the_output_format(h):
    h.engine.script = lambda prompt: '{"a": [1, -2.5e3], "b": {"c": null}} trailing'
    for body in (msgs(output_config=FORMAT), msgs(output_format=FORMAT["format"])):
        r = h.client.post("/v1/messages", json=body)
        assert json.loads(_text(r)) == {"a": [1, -2.5e3], "b": {"c": None}}
        assert r.json()["stop_reason"] == "end_turn"
    events = sse_events(h.client.post("/v1/messages",
                                      json=msgs(output_config=FORMAT, stream=True)).text)
    deltas = [json.loads(d)["delta"] for _, d in events
              if json.loads(d)["type"] == "content_block_delta"]
    assert json.loads("".join(d["text"] for d in deltas)) == {"a": [1, -2.5e3], "b": {"c": None}}
    # without the format the script's text goes out as it is
    assert _text(h.client.post("/v1/messages", json=msgs())).endswith("trailing")


def test_an_answer_that_breaks_the_schema_is_held_to_it(h):
    h.engine.script = lambda prompt: '{"a": ["x"], "z": 1}'  # a string item, an unknown key
    text = _text(h.client.post("/v1/messages", json=msgs(output_config=FORMAT, max_tokens=60)))
    assert text.startswith('{"a": [') and '"x"' not in text and '"z"' not in text
    assert feed(start(compile_schema(SCHEMA)), text.encode("utf-8")) is not None


def test_a_strict_tools_input_is_held_to_its_schema(h):
    """The script calls get_weather for Paris: strict, the city is bent into the enum; not
    strict, the call goes through as written."""
    ask = [{"role": "user", "content": "weather?"}]
    for strict, cities in ((True, ("Rome", "Oslo")), (False, ("Paris",))):
        tools = [dict(TOOLS[0], strict=strict)]
        body = h.client.post("/v1/messages", json=msgs(messages=ask, tools=tools)).json()
        assert body["stop_reason"] == "tool_use"
        use = body["content"][-1]
        assert use["type"] == "tool_use" and use["input"]["city"] in cities


@pytest.mark.parametrize("extra, where", [
    ({"output_config": {"format": {"type": "json_schema", "schema": {
        "type": "object", "properties": {"d": {"type": "string", "format": "date"}}}}}},
     "output_config.format.schema"),
    ({"output_config": {"format": {"type": "json_object"}}}, "output_config.format.type"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
    ({"output_config": FORMAT, "output_format": FORMAT["format"]}, "output_format"),
    ({"tools": [{"name": "f", "strict": True, "input_schema": {
        "type": "object", "properties": {"d": {"type": "string", "format": "date"}}}}]},
     "tools[0].input_schema"),
])
def test_what_cannot_be_held_is_a_400_naming_it(h, extra, where):
    r = h.client.post("/v1/messages", json=msgs(**extra))
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert err["error"]["message"].startswith(where)


def test_tools_left_out_by_choice_allow_the_format(h):
    h.engine.script = lambda prompt: '{"a": [2]}'
    r = h.client.post("/v1/messages", json=msgs(output_config=FORMAT, tools=TOOLS,
                                                tool_choice={"type": "none"}))
    assert json.loads(_text(r)) == {"a": [2]}
