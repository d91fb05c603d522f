"""`TriggeredJson` on a small vocabulary: free text takes anything; a trigger (whole, split over
tokens, or sharing a token with the document's first bytes) opens a document the schema holds;
the end token waits for the suffix; after it, free text again."""

from __future__ import annotations

import json

import numpy as np
import pytest

from strata.engine.json_constraint import TokenBytes
from strata.engine.json_schema import any_of_node, call_node, compile_schema
from strata.engine.json_trigger import TriggeredJson
from strata.engine.sampler import Sampler, SamplingParams

ARGS = compile_schema({"type": "object", "properties": {"n": {"type": "integer"}},
                       "required": ["n"], "additionalProperties": False})
ROOT = any_of_node([call_node("f", ARGS)])
PIECES = [b"<call>", b"<ca", b"ll>", b"ll>\n{", b"hello ", b'"name"', b":", b'"f"', b",",
          b'"arguments"', b"{", b"}", b'"n"', b"7", b"\n</call>", b"\n", b"x", b"1.5", b" ",
          b"</call>", b"<think>", b"<thi", b"nk>", b"</think>", b"</th", b"ink>\n\n"]
EOT = len(PIECES)
ID = {p: i for i, p in enumerate(PIECES)}


def _make(**kw) -> TriggeredJson:
    return TriggeredJson(TokenBytes(PIECES + [None]), [EOT], trigger=b"<call>", root=ROOT,
                         suffix=b"\n</call>", **kw)


def _feed(c: TriggeredJson, *pieces: bytes) -> None:
    for p in pieces:
        c.advance(ID[p])


CALL = (b"{", b'"name"', b":", b'"f"', b",", b'"arguments"', b":", b"{", b'"n"', b":", b"7",
        b"}", b"}")


@pytest.mark.parametrize("opening", [(b"<call>", b"\n"), (b"<ca", b"ll>", b"\n"),
                                     (b"<ca", b"ll>\n{")])
def test_a_call_opened_any_way_is_held_and_closed(opening):
    c = _make()
    _feed(c, b"hello ", b"x")
    assert c.allows(EOT) and c.allows(ID[b"1.5"]) and not c.in_call
    _feed(c, *opening)
    rest = CALL[1:] if opening[-1].endswith(b"{") else CALL
    for p in rest[:-1]:
        assert not c.allows(EOT)  # a call opened is a call finished
        _feed(c, p)
    _feed(c, rest[-1])
    assert not c.allows(EOT) and not c.allows(ID[b"x"])  # the suffix is due
    _feed(c, b"\n</call>")
    assert not c.in_call and c.allows(EOT) and c.allows(ID[b"<call>"])  # free again


def test_the_schema_holds_inside_the_call():
    c = _make()
    _feed(c, b"<call>", b"{", b'"name"', b":", b'"f"', b",", b'"arguments"', b":", b"{",
          b'"n"', b":")
    assert not c.allows(ID[b"1.5"]) and not c.allows(ID[b'"f"']) and c.allows(ID[b"7"])
    with pytest.raises(ValueError, match="tool call"):
        c.advance(ID[b"x"])


def test_a_forced_call_starts_inside_its_arguments():
    c = _make(inside=(ARGS, b"}\n</call>"))
    assert not c.allows(EOT) and not c.allows(ID[b"hello "]) and c.allows(ID[b"{"])
    _feed(c, b"{", b'"n"', b":", b"7", b"}")
    assert not c.allows(ID[b"\n</call>"])  # the outer object's "}" first
    _feed(c, b"}", b"\n</call>")
    assert c.allows(EOT) and not c.in_call


def test_random_generation_writes_only_valid_calls():
    rng = np.random.default_rng(4)
    n_calls = 0
    for trial in range(30):
        c = _make()
        s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=trial),
                    c)
        out = b""
        for _ in range(300):
            z = rng.standard_normal(EOT + 1).astype(np.float32)
            z[[ID[b"<call>"], EOT]] += 1.0
            allowed = {i for i in range(EOT + 1) if c.allows(i)}
            assert allowed and allowed <= set(c.candidates().tolist()) | {EOT}
            t = s(z)
            if t == EOT:
                break
            out += PIECES[t]
        for block in out.split(b"<call>")[1:]:
            if b"\n</call>" in block:
                n_calls += 1
                doc = json.loads(block.split(b"\n</call>")[0].strip())
                assert doc["name"] == "f" and isinstance(doc["arguments"]["n"], int)
                assert set(doc) == {"name", "arguments"} and set(doc["arguments"]) == {"n"}
    assert n_calls >= 10


@pytest.mark.parametrize("think, opening", [
    ("start", (b"\n", b"<think>")), ("start", (b"<thi", b"nk>")), ("open", ())])
def test_no_call_opens_inside_a_think_block(think, opening):
    """A thinking model's reasoning may name the trigger without opening a call; after
    `</think>` (whole or split) the trigger opens one as usual."""
    c = _make(think=think)
    _feed(c, *opening, b"hello ", b"<call>", b"x", b"1.5")  # inside the block: free text
    assert not c.in_call and c.allows(EOT) and c.allows(ID[b"x"])
    _feed(c, b"</th", b"ink>\n\n", b"<call>")
    assert c.in_call and not c.allows(ID[b"x"]) and not c.allows(EOT)
    _feed(c, *CALL, b"\n</call>")
    assert not c.in_call


def test_an_answer_without_a_block_is_held_from_its_first_token():
    c = _make(think="start")
    _feed(c, b"<call>")  # not a <think>: the trigger counts at once
    assert c.in_call
    c = _make(think="start")
    _feed(c, b"x", b"<think>", b"<call>")  # a block opened later is not reasoning
    assert c.in_call
    with pytest.raises(ValueError, match="think"):
        _make(think="maybe")
