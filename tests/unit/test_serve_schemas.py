"""A request's JSON schema before the compiler: a nesting limit (a 400, not a RecursionError),
`type` beside `enum`/`const` intersected, and `$defs` beside `$ref` taken as the containers
they are (Pydantic's recursive models). Each refusal is a 400 naming the schema's path."""

from __future__ import annotations

import copy

import pytest

from strata.engine.json_constraint import complete, feed, start
from strata.engine.json_schema import SchemaError
from strata.engine.json_schema_request import MAX_SCHEMA_DEPTH, compile_request_schema
from test_serve_app import chat
from test_serve_json import _Client

# what Pydantic writes for `class Node(BaseModel): name: str; children: list["Node"]`
PYDANTIC_TREE = {
    "$defs": {"Node": {
        "properties": {"name": {"title": "Name", "type": "string"},
                       "children": {"items": {"$ref": "#/$defs/Node"}, "title": "Children",
                                    "type": "array"}},
        "required": ["name", "children"], "title": "Node", "type": "object"}},
    "$ref": "#/$defs/Node",
}


def nested(levels: int, via: str) -> dict:
    """An object schema whose subschemas nest `levels` deep in all (the root is level 1)."""
    inner: dict = {"type": "string"}
    for _ in range(levels - 2):
        inner = ({"type": "object", "properties": {"a": inner}} if via == "properties"
                 else {"type": "array", "items": inner})
    return {"type": "object", "properties": {"a": inner}}


def accepts(schema: dict, doc: bytes) -> bool:
    states = feed(start(compile_request_schema(schema)), doc)
    return states is not None and complete(states)


def fmt(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}


# -- nesting ----------------------------------------------------------------------------------

@pytest.mark.parametrize("via", ["properties", "items"])
def test_a_schema_nested_past_the_limit_is_refused_by_path(via):
    compile_request_schema(nested(MAX_SCHEMA_DEPTH, via))  # at the limit: compiled
    with pytest.raises(SchemaError, match=f"more than {MAX_SCHEMA_DEPTH} levels deep") as e:
        compile_request_schema(nested(MAX_SCHEMA_DEPTH + 1, via))
    assert str(e.value).startswith("schema.properties.a." + via)


@pytest.mark.parametrize("levels", [MAX_SCHEMA_DEPTH + 1, 120])
def test_deep_schemas_are_400s_on_every_route(levels):
    deep = nested(levels, "items")  # one JSON level a schema level: within the body's limit
    tool = {"type": "function", "function": {"name": "f", "strict": True, "parameters": deep}}
    with _Client("{}") as client:
        for path, body, param in [
            ("/v1/chat/completions", chat(response_format=fmt(deep)),
             "response_format.json_schema.schema"),
            ("/v1/chat/completions", chat(tools=[tool]), "tools[0].function.parameters"),
            ("/v1/messages", {"model": "fake", "max_tokens": 4, "output_config": {
                "format": {"type": "json_schema", "schema": deep}},
                "messages": [{"role": "user", "content": "hi"}]}, None),
            ("/v1/responses", {"model": "fake", "input": "hi", "text": {"format": {
                "type": "json_schema", "name": "t", "schema": deep}}}, "text.format.schema"),
        ]:
            r = client.post(path, json=body)
            assert r.status_code == 400, (path, r.text)
            text = r.text
            assert f"more than {MAX_SCHEMA_DEPTH} levels deep" in text
            if param is not None:
                assert r.json()["error"]["param"] == param
        # a Responses tool whose strictness is the API's default: just not strict
        r = client.post("/v1/responses", json={"model": "fake", "input": "hi", "tools": [
            {"type": "function", "name": "f", "parameters": deep}]})
        assert r.status_code == 200 and r.json()["tools"][0]["strict"] is False


def test_the_schemas_that_exhausted_the_stack_are_400s():
    # 300 objects or 400 arrays deep: past the body's own nesting limit, which answers first
    with _Client("{}") as client:
        for deep in (nested(300, "properties"), nested(400, "items")):
            r = client.post("/v1/chat/completions", json=chat(response_format=fmt(deep)))
            assert r.status_code == 400 and "nested too deeply" in r.text


# -- type beside enum / const -----------------------------------------------------------------

@pytest.mark.parametrize("sub, where", [
    ({"type": "string", "const": 5}, "schema.properties.v.const: 5 is not of the schema's type"),
    ({"type": "string", "enum": [None]}, "schema.properties.v.enum: none of its values"),
    ({"type": "integer", "enum": [1.5, "1", True]}, "schema.properties.v.enum: none"),
])
def test_values_none_of_the_type_allows_are_refused(sub, where):
    with pytest.raises(SchemaError, match="^" + where.replace(".", r"\.")):
        compile_request_schema({"type": "object", "properties": {"v": sub}})
    with _Client("{}") as client:
        r = client.post("/v1/chat/completions", json=chat(response_format=fmt(
            {"type": "object", "properties": {"v": sub}})))
        assert r.status_code == 400 and r.json()["error"]["param"] == (
            "response_format.json_schema.schema")
        assert where in r.json()["error"]["message"]


def test_only_the_values_of_the_type_are_written():
    schema = {"type": "object", "properties": {
        "v": {"type": ["string", "null"], "enum": [None, 1, "x", [1]]},
        "n": {"type": "integer", "enum": [2, 2.0, 2.5, "2"]},
        "c": {"type": "number", "const": 3}}}
    original = copy.deepcopy(schema)
    for doc, ok in [(b'{"v":null}', True), (b'{"v":"x"}', True), (b'{"v":1}', False),
                    (b'{"v":[1]}', False), (b'{"n":2}', True), (b'{"n":2.0}', True),
                    (b'{"n":2.5}', False), (b'{"n":"2"}', False), (b'{"c":3}', True)]:
        assert accepts(schema, doc) is ok, doc
    assert schema == original  # the request's own schema is left as it came
    with _Client('{"v": 1}') as client:  # the scripted 1 is not a string: not written
        r = client.post("/v1/chat/completions", json=chat(response_format=fmt(
            {"type": "object", "properties": {"v": schema["properties"]["v"]},
             "required": ["v"]}), max_tokens=20))
        assert r.status_code == 200 and '"v": 1' not in r.json()["choices"][0]["message"][
            "content"]


# -- $defs beside $ref ------------------------------------------------------------------------

def test_a_pydantic_recursive_model_is_taken():
    assert accepts(PYDANTIC_TREE, b'{"name":"a","children":[{"name":"b","children":[]}]}')
    assert not accepts(PYDANTIC_TREE, b'{"name":"a","children":[{"name":"b"}]}')
    doc = '{"name": "root", "children": [{"name": "leaf", "children": []}]}'
    with _Client(doc) as client:
        r = client.post("/v1/chat/completions", json=chat(response_format=fmt(PYDANTIC_TREE)))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == doc
        r = client.post("/v1/messages", json={
            "model": "fake", "max_tokens": 80, "messages": [{"role": "user", "content": "x"}],
            "output_config": {"format": {"type": "json_schema", "schema": PYDANTIC_TREE}}})
        assert r.status_code == 200 and r.json()["content"][0]["text"] == doc


def test_definitions_beside_a_ref_anywhere_are_containers():
    legacy = {"definitions": {"A": {"type": "object", "properties": {"x": {"type": "integer"}}}},
              "$ref": "#/definitions/A", "title": "annotations beside it are fine"}
    assert accepts(legacy, b'{"x":1}') and not accepts(legacy, b'{"x":"1"}')
    alias = {"$defs": {"B": {"$ref": "#/$defs/A"}, "A": legacy["definitions"]["A"]},
             "$ref": "#/$defs/B"}
    assert accepts(alias, b'{"x":1}')
    inner = {"type": "object", "properties": {"p": {"$ref": "#/$defs/A", "$defs": {}}},
             "$defs": {"A": {"type": "integer"}}}
    assert accepts(inner, b'{"p":3}') and not accepts(inner, b'{"p":"3"}')


@pytest.mark.parametrize("schema, message", [
    ({"$defs": {"A": {"type": "object"}}, "$ref": "#/$defs/A", "type": "object"},
     "schema: keywords beside $ref are not taken: type"),
    ({"$defs": {"A": {"type": "object"}}, "$ref": "#/$defs/Z"},
     "schema.$ref: '#/$defs/Z' is not among"),
    ({"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"},
     "schema.$ref: '#/$defs/A' leads back to itself"),
    ({"type": "object", "properties": {"p": {"$ref": ["#/$defs/A"]}}},
     "schema.properties.p.$ref: expected a string"),
    ({"$defs": {"A": {"type": "string"}}, "$ref": "#/$defs/A"}, "the root must be"),
])
def test_refs_it_cannot_take_are_named(schema, message):
    with pytest.raises(SchemaError) as e:
        compile_request_schema(schema)
    assert message in str(e.value)
