"""Qwen3-Coder's tool calls (`strata.serve.xml_calls`): `<function=NAME>` with a
`<parameter=KEY>` block each inside the `<tool_call>` block, read into the same `ToolCall`s as
the JSON form, each value typed by the request's tool schema, at every way the streamed text can
be cut; the template told apart; a forced call begun in the XML form; strict tools and forced
calls held in the XML form (`strata.engine.xml_trigger`, alone in test_xml_trigger); and
through the chat and Anthropic routes."""

from __future__ import annotations

import json

import pytest

from test_serve_app import Harness, chat, sse_events
from test_serve_text import parse_all, splits
from strata.serve.chat import ChatInput, chat_text, prepare_chat
from strata.serve.tools import StrictXmlCalls, ToolCallParser
from strata.serve.xml_calls import param_types, parse_xml_body, template_uses_xml_calls

TOOLS = [{"type": "function", "function": {"name": "write_file", "parameters": {
    "type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"},
        "mode": {"type": "integer"}, "force": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "limit": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "note": {"description": "no type given"}}}}}]
TYPES = param_types(TOOLS)
CODE = "def f(x):\n    return x + 1\n"
XML_CALL = ("<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
            f"<parameter=content>\n{CODE}\n</parameter>\n<parameter=mode>\n420\n</parameter>\n"
            "<parameter=force>\nTrue\n</parameter>\n<parameter=tags>\n[\"x\", \"y\"]\n"
            "</parameter>\n<parameter=limit>\nnull\n</parameter>\n<parameter=note>\n7\n"
            "</parameter>\n</function>\n</tool_call>")
WANT = {"path": "src/a.py", "content": CODE, "mode": 420, "force": True, "tags": ["x", "y"],
        "limit": None, "note": "7"}


def test_a_call_typed_by_its_schema():
    body = XML_CALL[len("<tool_call>\n"):-len("\n</tool_call>")]
    assert parse_xml_body(body, TYPES) == ("write_file", WANT)
    # no schema for the tool: every value its text
    name, args = parse_xml_body(body, None)
    assert args["mode"] == "420" and args["content"] == CODE and args["force"] == "True"
    # a value that does not spell its type stays text; an integer typed number is a number
    assert parse_xml_body("<function=write_file>\n<parameter=mode>\n0o644\n</parameter>\n"
                          "</function>", TYPES)[1] == {"mode": "0o644"}
    assert parse_xml_body("<function=write_file>\n<parameter=limit>\n2.5\n</parameter>\n"
                          "</function>", TYPES)[1] == {"limit": 2.5}


def test_tools_of_any_shape_give_types_without_failing():
    odd = [{"type": "function", "function": {"name": "a", "parameters": None}},
           {"type": "function", "function": {"name": "b", "parameters": {"properties": []}}},
           {"type": "function", "function": "c"}, "d"]
    assert param_types(odd) == {}


def test_left_out_closing_tags_and_what_is_no_call():
    # a parameter's closing tag left out before the next, and at the function's end
    assert parse_xml_body("<function=f>\n<parameter=a>\n1\n<parameter=b>\n2\n</function>") == (
        "f", {"a": "1", "b": "2"})
    assert parse_xml_body("<function=f>\n</function>") == ("f", {})
    assert parse_xml_body("<function=f>\n<parameter=a>\nx\n</parameter>") == ("f", {"a": "x"})
    for bad in ("<function=>\n</function>", "<function=f>\nprose\n</function>",
                "<function=f>\n<parameter=a>\n1\n</parameter>\nprose\n</function>",
                "<function=f>\n</function>\n<function=g>\n</function>",
                "<function=f>\n<parameter=>\n1\n</parameter>\n</function>"):
        assert parse_xml_body(bad) is None, bad


@pytest.mark.parametrize("pieces", list(splits("Writing it." + XML_CALL)))
def test_the_stream_gives_the_call_at_any_split(pieces):
    p = ToolCallParser("call_", TYPES)
    out = [x for piece in pieces for x in p.feed(piece)] + p.finish()
    assert "".join(x for x in out if isinstance(x, str)) == "Writing it."
    (call,) = [x for x in out if not isinstance(x, str)]
    assert (call.name, call.arguments) == ("write_file", WANT)


def test_a_malformed_xml_call_comes_back_as_text():
    raw = "<tool_call>\n<function=f>\nnot a parameter\n</function>\n</tool_call>"
    assert parse_all([raw]) == (raw, [])


def test_a_call_the_answer_ends_in_is_one_only_if_its_function_closed():
    """max_tokens cutting a value (a file's content) must not pass it on as a whole call; the
    turn ending after `</function>`, its block left open, is the call."""
    cut = "<tool_call>\n<function=write_file>\n<parameter=content>\ndef f(x):\n    ret"
    assert parse_all([cut]) == (cut, [])
    p = ToolCallParser("call_", TYPES)
    out = p.feed(XML_CALL[:-len("\n</tool_call>")]) + p.finish()
    assert [(c.name, c.arguments) for c in out] == [("write_file", WANT)]


class _Model:
    max_context, splits_thinking, tool_calls_parsed, xml_calls = 4096, False, True, True

    def render_chat(self, messages, tools, extra=None):
        return "<user>" + messages[-1]["content"] + "<assistant>"

    def encode(self, text):
        return [min(ord(c), 255) for c in text]


def test_the_template_and_a_forced_call():
    assert template_uses_xml_calls("{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
                                   "{{- '<parameter=' + args_name + '>\\n' }}")
    assert not template_uses_xml_calls("{{- '<tool_call>\\n' }}{{ tool_call | tojson }}")
    msgs = ({"role": "user", "content": "go"},)
    for choice, want in (("write_file", "<tool_call>\n<function=write_file>\n"),
                         ("required", "<tool_call>\n"), ("auto", "")):
        chat_in = ChatInput(messages=msgs, tools=tuple(TOOLS), tool_choice=choice)
        assert chat_text(_Model(), chat_in)[1] == want
        prepared = prepare_chat(_Model(), chat_in, limit=None)
        strict = prepared.sampling.strict_calls  # a forced call is held, in the XML form
        assert (strict is None if choice == "auto" else
                isinstance(strict, StrictXmlCalls) and strict.forced == choice)
        assert prepared.tool_types == TYPES and prepared.forced_prefix == want
    # a JSON format beside the tools: a forced call is still the answer; else a call or the
    # document (`CallsOrJson` over the XML calls), the calls held though no tool is strict
    for choice in ("write_file", "auto"):
        prepared = prepare_chat(_Model(), ChatInput(messages=msgs, tools=tuple(TOOLS),
                                                    tool_choice=choice, json_object=True),
                                limit=None)
        strict = prepared.sampling.strict_calls
        assert isinstance(strict, StrictXmlCalls) and prepared.sampling.json_object
        assert strict.forced == (None if choice == "auto" else choice)


def test_the_routes_return_typed_calls():
    with Harness() as h:
        h.model.xml_calls = True
        h.engine.script = lambda p: "Writing it." + XML_CALL
        r = h.client.post("/v1/chat/completions", json=chat(tools=TOOLS))
        msg = r.json()["choices"][0]
        assert msg["finish_reason"] == "tool_calls" and msg["message"]["content"] == "Writing it."
        (call,) = msg["message"]["tool_calls"]
        assert json.loads(call["function"]["arguments"]) == WANT
        r = h.client.post("/v1/chat/completions", json=chat(tools=TOOLS, stream=True))
        deltas = [json.loads(d)["choices"][0]["delta"] for _, d in sse_events(r.text)[:-1]]
        (tc,) = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
        assert json.loads(tc["function"]["arguments"]) == WANT
        anthropic_tools = [{"name": "write_file",
                            "input_schema": TOOLS[0]["function"]["parameters"]}]
        r = h.client.post("/v1/messages", json={
            "model": "fake", "max_tokens": 500, "tools": anthropic_tools,
            "messages": [{"role": "user", "content": "go"}]})
        blocks = r.json()["content"]
        assert [b["type"] for b in blocks] == ["text", "tool_use"]
        assert blocks[1]["input"] == WANT and r.json()["stop_reason"] == "tool_use"
        # a forced call: the prompt ends with the function's opening, the model writes the rest
        h.engine.script = lambda p: XML_CALL[len("<tool_call>\n<function=write_file>\n"):]
        r = h.client.post("/v1/chat/completions", json=chat(
            tools=TOOLS, tool_choice={"type": "function", "function": {"name": "write_file"}}))
        assert h.engine.prefills[-1].endswith("<tool_call>\n<function=write_file>\n")
        (call,) = r.json()["choices"][0]["message"]["tool_calls"]
        assert json.loads(call["function"]["arguments"]) == WANT


STRICT = [{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Rome", "Oslo"]},
                                     "days": {"type": "integer"}},
    "required": ["city", "days"], "additionalProperties": False}}}]


def _xml(city: str, days: str) -> str:
    return (f"<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n"
            f"<parameter=days>\n{days}\n</parameter>\n</function>\n</tool_call>")


def test_a_strict_tools_xml_call_is_held_to_its_schema():
    """Over the scripted engine (one-hot logits: the constrained arg-max takes the scripted byte
    wherever the schema allows it, else the lowest allowed): a call within the schema goes
    through as written; a city outside the enum and days that are no integer are bent into
    the schema, the prose before the call untouched."""
    with Harness() as h:
        h.model.xml_calls = True
        h.engine.script = lambda p: "Checking." + _xml("Oslo", "3")
        r = h.client.post("/v1/chat/completions", json=chat(tools=STRICT)).json()["choices"][0]
        (c,) = r["message"]["tool_calls"]
        assert json.loads(c["function"]["arguments"]) == {"city": "Oslo", "days": 3}
        h.engine.script = lambda p: "Checking." + _xml("Paris", "two")
        r = h.client.post("/v1/chat/completions", json=chat(tools=STRICT)).json()["choices"][0]
        assert r["message"]["content"] == "Checking."
        (c,) = r["message"]["tool_calls"]
        args = json.loads(c["function"]["arguments"])
        assert args["city"] in ("Rome", "Oslo") and isinstance(args["days"], int), args
        # without strict the same text is the model's business: read as written
        loose = [{"type": "function", "function": {**STRICT[0]["function"], "strict": False}}]
        r = h.client.post("/v1/chat/completions", json=chat(tools=loose)).json()["choices"][0]
        (c,) = r["message"]["tool_calls"]
        assert json.loads(c["function"]["arguments"]) == {"city": "Paris", "days": "two"}


def test_a_forced_xml_call_is_held_to_a_call():
    """The prompt opened the call: text that runs on past it is not a call's, so the call is
    closed where the model would have wandered off (held though no tool is strict)."""
    with Harness() as h:
        h.model.xml_calls = True
        h.engine.script = lambda p: ("<parameter=path>\na.py\n</parameter>\nand then words the "
                                     "model went on to")
        r = h.client.post("/v1/chat/completions", json=chat(
            tools=TOOLS, tool_choice={"type": "function", "function": {"name": "write_file"}}))
        (c,) = r.json()["choices"][0]["message"]["tool_calls"]
        assert json.loads(c["function"]["arguments"]) == {"path": "a.py"}


def test_a_strict_key_the_xml_form_cannot_write_is_a_400():
    with Harness() as h:
        h.model.xml_calls = True
        bad = [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
            "type": "object", "properties": {"a>b": {"type": "string"}}, "required": ["a>b"],
            "additionalProperties": False}}}]
        r = h.client.post("/v1/chat/completions", json=chat(tools=bad))
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0]", r.text
        assert "a>b" in r.json()["error"]["message"]


def test_tools_beside_a_json_format_answer_a_call_or_the_document():
    """The OpenAI Agents SDK sends an agent's tools beside its output type's JSON format: the
    model calls a tool (in its XML form) or answers with the document, held either way."""
    fmt = {"type": "json_schema", "json_schema": {"name": "out", "strict": True, "schema": {
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
        "additionalProperties": False}}}
    with Harness() as h:
        h.model.xml_calls = True
        h.engine.script = lambda p: _xml("Rome", "2")
        body = chat(tools=STRICT, response_format=fmt)
        r = h.client.post("/v1/chat/completions", json=body).json()["choices"][0]
        (c,) = r["message"]["tool_calls"]
        assert json.loads(c["function"]["arguments"]) == {"city": "Rome", "days": 2}
        h.engine.script = lambda p: '{"ok": true}'
        r = h.client.post("/v1/chat/completions", json=body).json()["choices"][0]
        assert json.loads(r["message"]["content"]) == {"ok": True} and not r["message"].get(
            "tool_calls")
        h.engine.script = lambda p: "Sure: it is fine."  # neither: bent into one of them
        r = h.client.post("/v1/chat/completions", json=body).json()["choices"][0]
        content = r["message"]["content"]
        assert r["message"].get("tool_calls") or json.loads(content)["ok"] in (True, False)
        # a forced call beside the format is the answer (the format does not hold it)
        h.engine.script = lambda p: '<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n' \
                                    '1\n</parameter>\n</function>\n</tool_call>'
        forced = {"type": "function", "function": {"name": "get_weather"}}
        r = h.client.post("/v1/chat/completions", json={**body, "tool_choice": forced})
        (c,) = r.json()["choices"][0]["message"]["tool_calls"]
        assert json.loads(c["function"]["arguments"]) == {"city": "Oslo", "days": 1}
