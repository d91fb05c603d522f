"""`response_format: {"type": "json_object"}` through the serve layer over the scripted engine
(one-hot logits, so the constrained arg-max takes the scripted token wherever the JSON allows
it): an answer that is an object comes out whole and ends at its close, one that is not is
bent into an object's prefix, the host samples such a sequence, and the refusals name the
field. The constraint itself is checked against Python's json in test_json_constraint."""

from __future__ import annotations

import json

import pytest

from strata.engine.json_constraint import feed, start
from strata.engine.json_schema import compile_schema, object_node
from strata.serve.job import Sampling
from test_serve_app import Harness, chat, sse_events
from test_serve_worker_picks import PickingEngine, run

OBJECT = '{"a": [1, -2.5e3, "x\\"y"], "b": {"c": null, "d": true}}'
JSON_FORMAT = {"type": "json_object"}


class _Client:
    """The app over a scripted engine that answers `answer` to every prompt."""

    def __init__(self, answer: str):
        self.harness = Harness()
        self.harness.engine.script = lambda prompt: answer

    def __enter__(self):
        return self.harness.__enter__().client

    def __exit__(self, *exc):
        self.harness.__exit__(*exc)


def test_an_object_answer_comes_out_whole_and_stops_at_its_close():
    with _Client(OBJECT + " and then some prose") as client:
        r = client.post("/v1/chat/completions", json=chat(response_format=JSON_FORMAT))
        choice = r.json()["choices"][0]
        assert choice["message"]["content"] == OBJECT and choice["finish_reason"] == "stop"
        assert json.loads(choice["message"]["content"]) == json.loads(OBJECT)
        plain = client.post("/v1/chat/completions", json=chat()).json()["choices"][0]
        assert plain["message"]["content"] == OBJECT + " and then some prose"
        r = client.post("/v1/chat/completions", json=chat(response_format=JSON_FORMAT,
                                                          stream=True))
        chunks = [json.loads(d) for _, d in sse_events(r.text)[:-1]]
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == OBJECT


def test_a_prose_answer_is_bent_into_an_objects_prefix():
    with _Client("Sure! Here it is: {\"k\": 1}") as client:
        r = client.post("/v1/chat/completions", json=chat(response_format=JSON_FORMAT,
                                                          max_tokens=80))
        choice = r.json()["choices"][0]
        text = choice["message"]["content"]
        assert text.startswith("{") and "Sure" not in text
        assert feed(start(object_node()), text.encode("utf-8")) is not None  # an object's prefix
        assert choice["finish_reason"] in ("length", "stop")


def test_a_json_sequence_is_sampled_on_the_host():
    engine = PickingEngine(lambda p: '{"x": 1}', n_slots=2)
    sinks = run(engine, [("a", Sampling(max_tokens=50, temperature=0.0)),
                         ("b", Sampling(max_tokens=50, temperature=0.0, json_object=True))])
    assert [s.text for s in sinks] == ['{"x": 1}', '{"x": 1}']
    mixed = [g for g in engine.given if len(g) == 2]
    assert mixed and all(g[1] is None and g[0] is not None for g in mixed)


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True,
                                                                 "schema": {
        "type": "object", "properties": {"d": {"type": "string", "format": "date"}}}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"d": {"type": "string"}}, "oneOf": [{}]}}}},
     "response_format.json_schema.schema"),  # without strict too: more than a value's check
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
     "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {}}, "response_format.type"),
])
def test_formats_it_cannot_keep_are_400s(extra, param):
    with _Client(OBJECT) as client:
        r = client.post("/v1/chat/completions", json=chat(**extra))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param


def test_a_schema_without_strict_holds_its_structure_not_its_value_checks():
    """OpenAI's API holds a json_schema without `strict` to nothing; here its structure still
    is (types, keys), but not the keywords narrowing a value within its type (`format`,
    `minimum`, `pattern`, ...: what Pydantic writes for a date or a bounded number), which
    are a 400 only under `strict` (test above)."""
    schema = {"type": "object", "properties": {
        "when": {"type": "string", "format": "date"},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "tag": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8}},
        "required": ["when", "n", "tag"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    with _Client('{"when": "soon", "n": 42, "tag": "UPPER", "x": 1} trailing') as client:
        r = client.post("/v1/chat/completions", json=chat(response_format=fmt))
        assert r.status_code == 200, r.text
        doc = json.loads(r.json()["choices"][0]["message"]["content"])
        assert set(doc) == {"when", "n", "tag"} and isinstance(doc["n"], int)
        r = client.post("/v1/responses", json={
            "model": "fake", "input": "hi",
            "text": {"format": {"type": "json_schema", "name": "t", "schema": schema}}})
        assert r.status_code == 200, r.text
        r = client.post("/v1/responses", json={
            "model": "fake", "input": "hi", "text": {"format": {
                "type": "json_schema", "name": "t", "schema": schema, "strict": True}}})
        assert r.status_code == 400 and "format" in r.json()["error"]["message"]


SCHEMA = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "number"}},
                                           "b": {"type": "object"}},
          "required": ["a"], "additionalProperties": False}


def test_a_schema_answer_comes_out_whole_and_one_it_breaks_is_held_to_it():
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "strict": True, "schema": SCHEMA}}
    with _Client('{"a": [1, -2.5e3], "b": {"c": null}} trailing') as client:
        r = client.post("/v1/chat/completions", json=chat(response_format=fmt))
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        assert json.loads(choice["message"]["content"]) == {"a": [1, -2.5e3], "b": {"c": None}}
    with _Client('{"a": ["x"], "z": 1}') as client:  # a string item and an unknown key
        r = client.post("/v1/chat/completions", json=chat(response_format=fmt, max_tokens=60))
        text = r.json()["choices"][0]["message"]["content"]
        assert text.startswith('{"a": [') and '"x"' not in text and '"z"' not in text
        assert feed(start(compile_schema(SCHEMA)), text.encode("utf-8")) is not None


CALL = '<tool_call>\n{"name": "f", "arguments": {"q": 1}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("answer, call, content", [
    (OBJECT + " and then prose", None, OBJECT),     # the document, and nothing after it
    ("  " + CALL, {"q": 1}, None),                  # a call (blank space before it dropped)
    (CALL + "\nDone.", {"q": 1}, "Done."),          # free text after a call, as with tools
    ('<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>', {}, None),  # held: only f
])
def test_tools_beside_a_json_format_answer_a_call_or_the_document(answer, call, content):
    """Tools and a JSON format together (OpenAI's Agents SDK sends both for an agent with
    tools and an output type): the answer is tool calls or the document, each held
    (`strata.engine.json_either`); the same on the Responses, Anthropic and Ollama routes."""
    with _Client(answer) as client:
        r = client.post("/v1/chat/completions", json=chat(response_format=JSON_FORMAT,
                                                         tools=TOOLS))
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        if call is None:
            assert json.loads(msg["content"]) == json.loads(OBJECT) and "tool_calls" not in msg
        else:
            (c,) = msg["tool_calls"]
            assert c["function"]["name"] == "f" and json.loads(c["function"]["arguments"]) == call
            assert (msg["content"] or "").strip() == (content or "")
        r = client.post("/v1/responses", json={
            "model": "fake", "input": "hi", "text": {"format": JSON_FORMAT},
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]})
        assert r.status_code == 200, r.text
        kinds = [o["type"] for o in r.json()["output"]]
        assert ("function_call" in kinds) == (call is not None)
        r = client.post("/v1/messages", json={
            "model": "fake", "max_tokens": 200, "messages": [{"role": "user", "content": "hi"}],
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
            "tools": [{"name": "f", "input_schema": {"type": "object"}}]})
        assert r.status_code == 200, r.text
        kinds = [b["type"] for b in r.json()["content"]]
        assert ("tool_use" in kinds) == (call is not None)
        r = client.post("/api/chat", json={
            "model": "fake", "stream": False, "format": "json", "tools": TOOLS,
            "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        assert bool(r.json()["message"].get("tool_calls")) == (call is not None)


def test_tools_left_out_by_choice_allow_the_json_format():
    with _Client(OBJECT) as client:
        r = client.post("/v1/chat/completions", json=chat(
            response_format=JSON_FORMAT, tool_choice="none",
            tools=[{"type": "function", "function": {"name": "f"}}]))
        assert r.status_code == 200, r.text
        assert json.loads(r.json()["choices"][0]["message"]["content"]) == json.loads(OBJECT)
