"""`strata.engine.xml_trigger.TriggeredXml`: strict tool calls in Qwen3-Coder's XML form, held
over a byte vocabulary, against the XML reader the server parses calls with
(`strata.serve.xml_calls.parse_xml_body`, typed by `param_types`) as the independent check: every
call the constraint lets through is read back into arguments its schema allows, and each way a
call can break its schema is refused at the byte that breaks it."""

from __future__ import annotations

import random

import numpy as np
import pytest

from strata.engine.json_constraint import TokenBytes
from strata.engine.json_schema import compile_schema, object_node
from strata.engine.json_schema_request import types_of
from strata.engine.xml_trigger import TriggeredXml
from strata.serve.xml_calls import param_types, parse_xml_body

EOT = 256
VOCAB = TokenBytes([bytes([i]) for i in range(256)] + [None])  # a byte a token, then the end
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["path", "mode"],
          "properties": {"path": {"type": "string"}, "mode": {"type": "integer"},
                         "unit": {"enum": ["c", "f"]}, "ratio": {"type": ["number", "null"]},
                         "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                         "opts": {"$ref": "#/$defs/opts"}, "note": {"description": "untyped"}},
          "$defs": {"opts": {"type": "object", "properties": {"x": {"type": "boolean"}},
                             "required": ["x"], "additionalProperties": False}}}
TOOLS_JSON = [{"type": "function", "function": {"name": "write", "parameters": SCHEMA}},
              {"type": "function", "function": {"name": "echo", "parameters": {
                  "type": "object", "properties": {}}}}]
TYPES = param_types(TOOLS_JSON)
TOOLS = [("write", compile_schema(SCHEMA)), ("echo", object_node())]


def held(forced=None, think=None) -> TriggeredXml:
    return TriggeredXml(VOCAB, [EOT], trigger=b"<tool_call>", tools=TOOLS, forced=forced,
                        think=think)


def feed(c: TriggeredXml, text: str) -> int | None:
    """Feeds `text` a byte at a time; the index of the first byte refused, None if none."""
    for i, b in enumerate(text.encode("utf-8")):
        if not c.allows(b):
            return i
        c.advance(b)
    return None


def call(name: str, params: list[tuple[str, str]]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def valid(args: dict) -> bool:
    """`SCHEMA` checked by hand (the reader's arguments; no schema library in the suite)."""
    props = SCHEMA["properties"]
    if not {"path", "mode"} <= set(args) or not set(args) <= set(props):
        return False
    checks = {"path": lambda v: isinstance(v, str), "note": lambda v: isinstance(v, str),
              "mode": lambda v: "integer" in types_of(v), "unit": lambda v: v in ("c", "f"),
              "ratio": lambda v: v is None or "number" in types_of(v),
              "tags": lambda v: isinstance(v, list) and len(v) <= 2
              and all(isinstance(t, str) for t in v),
              "opts": lambda v: isinstance(v, dict) and set(v) == {"x"}
              and isinstance(v["x"], bool)}
    return all(checks[k](v) for k, v in args.items())


def read(text: str):
    body = text[len("<tool_call>\n"):-len("\n</tool_call>")]
    return parse_xml_body(body, TYPES)


GOOD = call("write", [("path", "src/a.py"), ("mode", "420"), ("unit", "c"), ("ratio", "0.5"),
                      ("tags", '["x", "y"]'), ("opts", '{"x": true}'),
                      ("note", "any <b>text</b>\n  kept")])


def test_a_whole_call_passes_and_reads_back_as_its_schema_allows():
    c = held()
    assert feed(c, "Sure. " + GOOD + " Done.") is None and not c.in_call and c.allows(EOT)
    name, args = read(GOOD)
    assert name == "write" and valid(args) and args["mode"] == 420 and args["unit"] == "c"
    assert args["opts"] == {"x": True} and args["note"] == "any <b>text</b>\n  kept"


@pytest.mark.parametrize("text, at", [
    (call("wrote", [("path", "a"), ("mode", "1")]), "<function=wr"),  # no such tool
    (call("write", [("path", "a")]), "</parameter>\n<"),  # mode is required: no </function>
    (call("write", [("path", "a"), ("mode", "1.5")]), "<parameter=mode>\n1"),  # not an integer
    (call("write", [("path", "a"), ("mode", "x")]), "<parameter=mode>\n"),
    (call("write", [("path", "a"), ("mode", "1"), ("unit", "k")]), "<parameter=unit>\n"),
    (call("write", [("path", "a"), ("mode", "1"), ("path", "b")]), "<parameter="),  # twice
    (call("write", [("path", "a"), ("mode", "1"), ("pth", "b")]), "<parameter="),  # given
    (call("write", [("path", "a"), ("mde", "1")]), "<parameter=m"),  # no such key
    (call("write", [("path", "a"), ("mode", "1"), ("tags", '["a","b","c"]')]), '"a","b"'),
    (call("write", [("path", "a"), ("mode", "1"), ("opts", '{"y": 1}')]), '<parameter=opts>\n{"'),
    (call("write", [("path", "a <parameter=mode>"), ("mode", "1")]), "a <parameter"),
    (call("write", [("path", "a </tool_call>"), ("mode", "1")]), "a </tool_call"),
])
def test_a_call_that_breaks_its_schema_is_refused_where_it_breaks(text, at):
    c = held()
    i = feed(c, "ok " + text)
    assert i is not None, "the call was let through"
    prefix = ("ok " + text).encode()[:i].decode()
    assert prefix.endswith(at), (prefix[-40:], at)


def test_an_end_token_only_outside_a_call_and_no_call_inside_reasoning():
    c = held()
    assert feed(c, "text <tool_call>\n<function=echo>\n") is None
    assert c.in_call and not c.allows(EOT)
    c = held(think="start")  # a <think> block first: a call written inside it is free text
    assert feed(c, "<think>maybe <tool_call>\nnot a call</think>\n") is None
    assert not c.in_call and c.allows(EOT)
    assert feed(c, "<tool_call>\n<function=nope") is not None


def test_a_tool_without_a_schema_takes_any_keys_and_text_values():
    text = call("echo", [("anything", "some text"), ("n", "7")])
    assert feed(held(), text) is None
    assert read(text) == ("echo", {"anything": "some text", "n": "7"})
    for bad in ("has space", "a/b", ""):  # keys the reader would not take back as written
        assert feed(held(), call("echo", [(bad, "v")])) is not None


def test_forced_calls_start_inside_the_call():
    rest = GOOD[len("<tool_call>\n<function=write>\n"):]
    c = held(forced="write")
    assert c.in_call and feed(c, rest) is None and not c.in_call
    c = held(forced="required")  # the prompt ends with the tag and its newline
    assert feed(c, GOOD[len("<tool_call>\n"):]) is None and not c.in_call
    assert feed(held(forced="write"), "Sure, " + rest) == 0  # no prose first


def test_candidates_cover_every_allowed_byte():
    c = held()
    feed(c, "x <tool_call>\n<function=write>\n<parameter=mode>\n4")
    allowed = {b for b in range(256) if c.allows(b)}
    assert allowed <= set(c.candidates().tolist())
    # more digits, blank space, or the closing tag; not "." (an integer), nor the "]" that
    # closes the brackets the value is held in
    assert allowed == set(b"0123456789 \n<")


GOOD_VALUES = {"path": ['"quoted"', "a b", "x\n\ny", "", "<b>"], "mode": ["0", "-12", "7"],
               "unit": ["c", "f"], "ratio": ["null", "2.5", "-1", "1e3"],
               "tags": ["[]", '["a"]', '["a", "b"]'], "opts": ['{"x": false}', '{"x":true}'],
               "note": ["42", "[1]", "t"]}
BAD_VALUES = {"mode": ["1e3", "7.0", "x", "null"], "unit": ["C", '"c"'], "ratio": ["none"],
              "tags": ['["a", 1]', '["a","b","c"]', '"a"'], "opts": ['{"x": 1}', "{}"],
              "bogus": ["1"]}


@pytest.mark.parametrize("seed", range(40))
def test_what_it_lets_through_reads_back_valid(seed):
    """Calls built at random from the schema's keys and values: built only of good values,
    each passes; with bad values and keys mixed in, whichever the constraint lets through
    whole, the reader types into arguments the schema allows."""
    rng = random.Random(seed)
    keys = ["path", "mode"] + rng.sample(list(GOOD_VALUES)[2:], rng.randint(0, 5))
    rng.shuffle(keys)
    good = call("write", [(k, rng.choice(GOOD_VALUES[k])) for k in keys])
    c = held()
    assert feed(c, good) is None and not c.in_call, good
    assert valid(read(good)[1]), good
    mixed = {**{k: GOOD_VALUES[k] for k in keys}, **{k: BAD_VALUES[k] for k in
                                                     rng.sample(list(BAD_VALUES), 2)}}
    text = call("write", [(k, rng.choice(v)) for k, v in mixed.items()])
    c = held()
    if feed(c, text) is None and not c.in_call:
        parsed = read(text)
        assert parsed is not None and valid(parsed[1]), (text, parsed)


def test_the_bytes_are_refused_as_a_sampler_would_see_them():
    """Multi-byte tokens: a token is allowed only if every byte of it is."""
    pieces = [bytes([i]) for i in range(256)] + [b"<tool_call>", b"\n<function=write>\n",
                                                  b"<parameter=mode>\n", b"<parameter=mde>\n"]
    vocab = TokenBytes(pieces + [None])
    c = TriggeredXml(vocab, [len(pieces)], trigger=b"<tool_call>", tools=TOOLS)
    for t in (256, 257, 258):
        assert c.allows(t)
        c.advance(t)
    c = TriggeredXml(vocab, [len(pieces)], trigger=b"<tool_call>", tools=TOOLS)
    c.advance(256)
    c.advance(257)
    assert not c.allows(259)
    assert isinstance(c.candidates(), np.ndarray)


def test_a_call_or_a_document_beside_a_json_format():
    """`CallsOrJson` over the XML calls (tools beside a JSON format): the answer opens a call
    or the document, and each is held as it would be alone."""
    from strata.engine.json_either import CallsOrJson
    doc = compile_schema({"type": "object", "properties": {"ok": {"type": "boolean"}},
                          "required": ["ok"], "additionalProperties": False})

    def either() -> CallsOrJson:
        return CallsOrJson(VOCAB, [EOT], root=doc, trigger=b"<tool_call>", calls=held())
    c = either()
    assert feed(c, '{"ok": false}') is None and c.allows(EOT)
    c = either()
    assert feed(c, GOOD) is None and c.allows(EOT)
    assert feed(either(), '{"ok": 1}') == 7  # the document held to its schema
    assert feed(either(), call("write", [("path", "a")])) is not None  # mode is required
    assert feed(either(), "Sure") == 0 and not either().allows(EOT)  # no prose, no empty answer
