"""Qwen3-Coder's tool calls (`strata.serve.xml_calls`): `<function=NAME>` with a
`<parameter=KEY>` block each inside the `<tool_call>` block, read into the same `ToolCall`s as
the JSON form, each value typed by the request's tool schema, at every way the streamed text can
be cut; the template told apart; a forced call begun in the XML form; a JSON grammar never laid
over XML calls; and through the chat and Anthropic routes."""

from __future__ import annotations

import json

import pytest

from test_serve_app import Harness, chat, sse_events
from test_serve_text import parse_all, splits
from strata.serve.chat import ChatInput, chat_text, prepare_chat
from strata.serve.errors import ApiError
from strata.serve.tools import ToolCallParser
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
        assert prepared.sampling.strict_calls is None  # no JSON grammar over XML calls
        assert prepared.tool_types == TYPES and prepared.forced_prefix == want
    with pytest.raises(ApiError) as e:
        prepare_chat(_Model(), ChatInput(messages=msgs, tools=tuple(TOOLS),
                                         tool_choice="write_file", json_object=True), limit=None)
    assert e.value.param == "tool_choice"


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
