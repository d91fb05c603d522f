"""Stop strings and tool-call parsing over streamed text, split at every possible boundary."""

from __future__ import annotations

import json

import pytest

from strata.serve.stops import StopMatcher
from strata.serve.tools import ToolCall, ToolCallParser, parse_call, template_uses_hermes_calls


def run_stops(stops, pieces):
    m = StopMatcher(stops)
    out, hit = [], None
    for p in pieces:
        text, hit = m.feed(p)
        out.append(text)
        if hit:
            break
    if hit is None:
        out.append(m.flush())
    return "".join(out), hit


def splits(text):
    """Every way of cutting `text` into two pieces, plus one character at a time."""
    yield [text]
    yield list(text)
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]


@pytest.mark.parametrize("pieces", list(splits("say hi<END>bye")))
def test_stop_found_across_any_split(pieces):
    assert run_stops(["<END>"], pieces) == ("say hi", "<END>")


def test_earliest_of_several_stops_wins():
    assert run_stops(["bye", "hi"], ["say hi, bye"]) == ("say ", "hi")


def test_text_that_only_looks_like_a_stop_prefix_is_released():
    assert run_stops(["<END>"], ["a <E", "N", "x> b"]) == ("a <ENx> b", None)
    m = StopMatcher(["<END>"])
    assert m.feed("tail <EN") == ("tail ", None)  # held back, not lost
    assert m.flush() == "<EN"


def test_no_stops_passes_everything():
    assert run_stops([], ["a", "b"]) == ("ab", None)


def test_empty_stop_is_refused():
    with pytest.raises(ValueError, match="empty"):
        StopMatcher([""])


def parse_all(pieces, prefix="call_"):
    p = ToolCallParser(prefix)
    out = []
    for piece in pieces:
        out.extend(p.feed(piece))
    out.extend(p.finish())
    texts = "".join(x for x in out if isinstance(x, str))
    calls = [x for x in out if isinstance(x, ToolCall)]
    return texts, calls


MODEL_OUTPUT = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
                '"days": 2}}\n</tool_call>\n<tool_call>\n{"name": "clock", "arguments": {}}\n'
                '</tool_call>')


@pytest.mark.parametrize("pieces", list(splits(MODEL_OUTPUT)))
def test_two_calls_parsed_at_any_split(pieces):
    text, calls = parse_all(pieces)
    assert text == "Let me look."
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 2}), ("clock", {})]
    assert all(c.id.startswith("call_") for c in calls)
    assert len({c.id for c in calls}) == 2


def test_plain_text_is_unchanged_even_with_trailing_space():
    assert parse_all(["Hello ", "world  "]) == ("Hello world  ", [])


def test_a_malformed_call_comes_back_as_text():
    raw = "<tool_call>\n{not json}\n</tool_call>"
    assert parse_all([raw]) == (raw, [])


def test_an_unterminated_call_comes_back_as_text():
    raw = '<tool_call>\n{"name": "f", "argu'
    assert parse_all([raw]) == (raw, [])


@pytest.mark.parametrize("end", ["", "\n", "\n</tool", "\n</tool_call"])
def test_a_whole_call_without_its_closing_tag_is_a_call(end):
    """The turn ended (or max_tokens cut) where the closing tag belongs: the body is a whole
    call, so it is one, at any split of the text."""
    raw = 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}' + end
    for pieces in splits(raw):
        text, calls = parse_all(pieces)
        assert text == "Sure." and [(c.name, c.arguments) for c in calls] == [("f", {"a": 1})]


def test_string_arguments_are_decoded_and_ids_take_the_prefix():
    call = parse_call(json.dumps({"name": "f", "arguments": json.dumps({"a": 1})}), "toolu_")
    assert call.arguments == {"a": 1} and call.id.startswith("toolu_")
    assert parse_call('{"arguments": {}}', "x") is None  # no name: not a call
    assert parse_call('["f"]', "x") is None


def test_template_detection():
    assert template_uses_hermes_calls("{{- '<tool_call>\\n' }}...{{- '</tool_call>' }}")
    assert not template_uses_hermes_calls("{{ message.content }}")
