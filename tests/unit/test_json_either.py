"""`CallsOrJson` on a small vocabulary: an answer that is tool calls (each held as
`TriggeredJson` holds them) or one JSON document (as `JsonConstraint` holds it), told apart by
its first bytes; random generation through it writes only one or the other."""

from __future__ import annotations

import json

import numpy as np
import pytest

from strata.engine.json_constraint import TokenBytes
from strata.engine.json_either import CallsOrJson
from strata.engine.json_schema import any_of_node, call_node, compile_schema
from strata.engine.sampler import Sampler, SamplingParams

ARGS = compile_schema({"type": "object", "properties": {"n": {"type": "integer"}},
                       "required": ["n"], "additionalProperties": False})
CALLS = any_of_node([call_node("f", ARGS)])
DOC = compile_schema({"type": "object", "properties": {"ok": {"type": "boolean"}},
                      "required": ["ok"], "additionalProperties": False})
PIECES = [b"<call>", b"<ca", b"ll>", b"\n", b" ", b"{", b"}", b'"name"', b":", b'"f"', b",",
          b'"arguments"', b'"n"', b"7", b"\n</call>", b'"ok"', b"true", b"hello", b"x",
          b"</call>"]
EOT = len(PIECES)
ID = {p: i for i, p in enumerate(PIECES)}


def _make() -> CallsOrJson:
    return CallsOrJson(TokenBytes(PIECES + [None]), [EOT], root=DOC, call_root=CALLS,
                       trigger=b"<call>", suffix=b"\n</call>")


def _feed(c: CallsOrJson, *pieces: bytes) -> None:
    for p in pieces:
        c.advance(ID[p])


def test_the_answer_is_the_document():
    c = _make()
    assert not c.allows(EOT)  # nothing yet is neither
    assert not c.allows(ID[b"hello"]) and not c.allows(ID[b"x"])  # prose is neither
    assert not c.allows(ID[b" "]) and not c.allows(ID[b"\n"])  # nothing before either
    _feed(c, b"{", b'"ok"', b":", b"true")
    assert not c.allows(ID[b"<call>"]) and not c.allows(EOT)  # the document has begun
    _feed(c, b"}")
    assert c.allows(EOT) and not c.allows(ID[b"hello"])
    with pytest.raises(ValueError):
        c.advance(ID[b"x"])


@pytest.mark.parametrize("opening", [(b"<call>",), (b"<ca", b"ll>")])
def test_the_answer_is_a_call_then_free_text(opening):
    c = _make()
    _feed(c, *opening)
    assert not c.allows(ID[b'"ok"'])  # the document is out
    _feed(c, b"\n", b"{", b'"name"', b":", b'"f"', b",", b'"arguments"', b":", b"{", b'"n"',
          b":", b"7", b"}")
    assert not c.allows(ID[b'"ok"'])  # only the call's own keys
    _feed(c, b"}")
    assert not c.allows(EOT)  # the suffix is due
    _feed(c, b"\n</call>")
    assert c.allows(EOT) and c.allows(ID[b"hello"]) and c.allows(ID[b"<call>"])


def test_a_token_neither_takes_is_refused_and_candidates_cover_the_allowed():
    c = _make()
    assert not c.allows(ID[b"ll>"])  # not the start of the trigger, nor of a document
    ids = set(int(t) for t in c.candidates())
    assert {t for t in range(EOT + 1) if c.allows(t)} <= ids
    _feed(c, b"{")
    ids = set(int(t) for t in c.candidates())
    assert {t for t in range(EOT + 1) if c.allows(t)} <= ids and ID[b"<call>"] not in ids


@pytest.mark.parametrize("seed", range(20))
def test_random_generation_writes_a_document_or_calls(seed):
    rng = np.random.default_rng(seed)
    c = _make()
    sampler = Sampler(SamplingParams(temperature=1.0, seed=seed), c)
    text = b""
    for _ in range(2000):
        logits = rng.standard_normal(EOT + 1).astype(np.float32)
        t = sampler(logits)
        if t == EOT:
            break
        text += PIECES[t]
    else:
        raise AssertionError(f"no end within 2,000 tokens: {text[:200]!r}")
    body = text
    if body.startswith(b"{"):
        assert json.loads(body)["ok"] is True or json.loads(body)["ok"] is False
        assert set(json.loads(body)) == {"ok"}
    else:
        assert body.startswith(b"<call>") and b"\n</call>" in body
        doc = body[len(b"<call>"):body.index(b"\n</call>")]
        call = json.loads(doc)
        assert call == {"name": "f", "arguments": {"n": call["arguments"]["n"]}}
