"""The schema-held JSON constraint against an independent validator (jsonschema_rs, Draft
2020-12): documents written by random constrained generation all validate, valid documents are
accepted in every prefix, invalid ones are refused, no prefix it keeps is a dead end, and
every keyword it cannot hold is refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from strata.engine.json_constraint import JsonConstraint, TokenBytes, complete, feed, start
from strata.engine.json_schema import SchemaError, compile_schema
from strata.engine.sampler import Sampler, SamplingParams

jsonschema_rs = pytest.importorskip("jsonschema_rs")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "annotations are fine"},
        "age": {"type": "integer"},
        "height": {"type": ["number", "null"]},
        "tags": {"type": "array", "items": {"enum": ["a", "ab", "b"]}, "minItems": 1,
                 "maxItems": 3},
        "pet": {"anyOf": [{"$ref": "#/$defs/pet"}, {"type": "null"}]},
        "ok": {"type": "boolean"},
        "level": {"const": 12},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
    "$defs": {"pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog", 1]},
                                                       "friend": {"$ref": "#/$defs/pet"}},
                      "required": ["kind"], "additionalProperties": False}},
}
OPEN = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
        "additionalProperties": {"type": "string"}}
SCHEMAS = {"person": PERSON, "open": OPEN}

VALID = [
    (PERSON, {"name": "Ann", "age": 31, "tags": ["a"]}),
    (PERSON, {"tags": ["ab", "b", "a"], "age": -2, "name": "", "height": 1.5e2, "ok": False}),
    (PERSON, {"name": "x", "age": 0, "tags": ["b"], "pet": {"kind": "cat", "friend": {
        "kind": 1}}, "height": None, "level": 12}),
    (OPEN, {"id": 3, "anything": "goes", "é \\ \"": "x"}),
]
INVALID = [
    (PERSON, {"name": "Ann", "age": 31}),  # a required key missing
    (PERSON, {"name": "Ann", "age": 3.5, "tags": ["a"]}),  # not an integer
    (PERSON, {"name": "Ann", "age": 3, "tags": []}),  # minItems
    (PERSON, {"name": "Ann", "age": 3, "tags": ["a", "a", "a", "a"]}),  # maxItems
    (PERSON, {"name": "Ann", "age": 3, "tags": ["c"]}),  # not in the enum
    (PERSON, {"name": "Ann", "age": 3, "tags": ["a"], "extra": 1}),  # no other keys
    (PERSON, {"name": "Ann", "age": 3, "tags": ["a"], "pet": {"kind": "cow"}}),
    (PERSON, {"name": "Ann", "age": 3, "tags": ["a"], "level": 13}),
    (PERSON, {"name": 5, "age": 3, "tags": ["a"]}),
    (OPEN, {"id": 3, "other": 4}),  # additionalProperties' schema
    (OPEN, {"other": "x"}),
]


@pytest.mark.parametrize("schema, doc", VALID)
def test_valid_documents_are_accepted_in_every_prefix(schema, doc):
    assert jsonschema_rs.is_valid(schema, doc)  # the reference agrees it is valid
    root = compile_schema(schema)
    for indent in (None, 2):
        data = json.dumps(doc, indent=indent, ensure_ascii=False).encode("utf-8")
        states = start(root)
        for i in range(len(data)):
            states = feed(states, data[i:i + 1])
            assert states is not None, (data, i)
        assert complete(states)


@pytest.mark.parametrize("schema, doc", INVALID)
def test_invalid_documents_are_refused(schema, doc):
    assert not jsonschema_rs.is_valid(schema, doc)
    states = feed(start(compile_schema(schema)), json.dumps(doc).encode("utf-8"))
    assert states is None or not complete(states)


# every byte a document here needs (as a byte-level vocabulary has), and a few longer pieces
BYTES = [bytes([c]) for c in b'{}[]",:-.0123456789eE+ \nabcdefghijklmnopqrstuvwxyzA'] + [
    "é".encode(), b'"name"', b'"age"', b'"tags"', b'"pet"', b'"kind"', b'"cat"', b"null",
    b"true", b'": "', b'", "', b"12", b'"ab"', b"\\", b"u00e9", b'"id"', b'{"id":']
EOT = len(BYTES)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_random_generation_writes_only_valid_documents(name):
    """Random logits every step, greedy and drawn: each document that ends (the end token is
    allowed only once it is whole) validates, every step had an allowed token (no dead end: a
    corner would raise), and `candidates()` never leaves an allowed token out."""
    schema = SCHEMAS[name]
    root = compile_schema(schema)
    rng = np.random.default_rng(11)
    n_done = 0
    for trial in range(40):
        c = JsonConstraint(TokenBytes(BYTES + [None]), [EOT], root)
        s = Sampler(SamplingParams(temperature=0 if trial % 4 == 0 else 1.5, top_k=0,
                                   top_p=1.0, min_p=0.0, seed=trial), c)
        out, t = b"", -1
        for _ in range(400):
            z = rng.standard_normal(EOT + 1).astype(np.float32)
            z[EOT] += 4.0  # end as soon as the constraint lets it
            z[[1, 2]] += 1.0  # closes and required keys: documents end within the budget
            z[EOT - 2:EOT] += 1.0
            if _ == 0 or t in (0, 2):  # now and then: candidates() holds every allowed token
                allowed = {i for i in range(EOT + 1) if c.allows(i)}
                assert allowed and allowed <= set(c.candidates().tolist())
            t = s(z)
            if t == EOT:
                n_done += 1
                doc = json.loads(out.decode("utf-8"))
                assert jsonschema_rs.is_valid(schema, doc), out
                break
            out += BYTES[t]
    assert n_done >= 25


@pytest.mark.parametrize("schema, message", [
    ({"type": "object", "properties": {"d": {"type": "string", "format": "date-time"}}},
     "schema.properties.d: format not supported"),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}},
     "schema.properties.n: minimum not supported"),
    ({"type": "object", "properties": {"s": {"oneOf": [{"type": "string"}]}}},
     "schema.properties.s: oneOf not supported"),
    ({"type": "object", "properties": {"s": {"type": "text"}}}, "schema.properties.s.type"),
    ({"type": "object", "properties": {}, "required": ["a"]}, "a not among the properties"),
    ({"type": "array", "items": {}}, "the root must be"),
    ({"anyOf": [{"type": "object"}]}, "the root must be"),
    ({"type": "object", "properties": {"p": {"$ref": "#/$defs/nope"}}}, "not among the"),
    ({"type": "object", "properties": {'a"b': {}}}, "a quote, backslash"),
    ({"type": "object", "properties": {"l": {"type": "array", "minItems": 3, "maxItems": 2}}},
     "maxItems is below minItems"),
    ({"type": "object", "properties": {"e": {"enum": []}}}, "non-empty array"),
    ([], "must be a JSON object"),
])
def test_keywords_it_cannot_hold_are_refused_by_name(schema, message):
    with pytest.raises(SchemaError, match=message.replace(".", r"\.")):
        compile_schema(schema)


def test_an_enum_whose_value_begins_another_keeps_both_open():
    root = compile_schema({"type": "object", "properties": {
        "n": {"enum": [1, 12, 123]}}, "required": ["n"], "additionalProperties": False})
    for text in (b'{"n":1}', b'{"n":12}', b'{"n":123}'):
        assert complete(feed(start(root), text))
    assert feed(start(root), b'{"n":13') is None and feed(start(root), b'{"n":1234') is None


def test_numbers_stay_within_a_doubles_range_and_sixteen_digits():
    root = compile_schema({"type": "object", "properties": {"x": {"type": "number"}}})
    assert complete(feed(start(root), b'{"x":-1.5e-99}'))
    assert feed(start(root), b'{"x":1e308') is None  # three digits: could be inf
    root = compile_schema({"type": "object", "properties": {"i": {"type": "integer"}}})
    assert feed(start(root), b'{"i":1.0') is None and feed(start(root), b'{"i":1e2') is None
    # at most 16 digits in the integer and the fraction parts (llama.cpp's JSON grammar)
    assert complete(feed(start(root), b'{"i":-' + b"9" * 16 + b"}"))
    assert feed(start(root), b'{"i":' + b"9" * 17) is None
    root = compile_schema({"type": "object", "properties": {"x": {"type": "number"}}})
    assert complete(feed(start(root), b'{"x":0.' + b"1" * 16 + b"e-5}"))
    assert feed(start(root), b'{"x":0.' + b"1" * 17) is None
