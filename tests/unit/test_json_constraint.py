"""The JSON-object constraint against Python's own `json` parser (strict: no NaN / Infinity):
every object it writes is accepted whole and in every prefix, every text the constraint calls
whole parses to an object, and the constrained sampler picks and draws only allowed tokens,
from the right distribution."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from strata.engine.json_constraint import (MAX_INDENT, JsonConstraint, TokenBytes, complete,
                                           feed, start)
from strata.engine.json_schema import object_node
from strata.engine.sampler import (Sampler, SamplingParams, constrained_argmax,
                                   constrained_draw)


START = start(object_node())  # any object: response_format json_object


def _strict(text: str):
    def no_constant(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=no_constant)


def _squeeze(data: bytes) -> bytes:
    """`data` without the whitespace outside its strings."""
    out, in_string, escaped = bytearray(), False, False
    for c in data:
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:
                escaped = True
            elif c == 0x22:
                in_string = False
        elif c in b" \t\n\r":
            continue
        else:
            in_string = c == 0x22
        out.append(c)
    return bytes(out)


def _random_value(rng: random.Random, depth: int):
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rng.choice([True, False, None])
    if kind == 1:
        return rng.randint(-10 ** 6, 10 ** 6)
    if kind == 2:
        return rng.choice([0.5, -1e-7, 3.25e12, -0.0, 1.0])
    if kind in (3, 4):
        return "".join(rng.choice('ab "\\\n\tü€😀/\x01') for _ in range(rng.randrange(6)))
    if kind == 5:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return _random_object(rng, depth + 1)


def _random_object(rng: random.Random, depth: int = 0) -> dict:
    return {f"k{i}{rng.choice(['', 'é', ' x'])}": _random_value(rng, depth)
            for i in range(rng.randrange(4))}


def _texts(n: int):
    rng = random.Random(7)
    for _ in range(n):
        obj = _random_object(rng)
        indent = rng.choice([None, 1, 2])
        # the forms of whitespace the constraint takes (llama.cpp's): a space, or a newline
        # and an indent; never a space before a newline
        separators = (rng.choice([None, (",", ":"), (", ", " : ")]) if indent is None
                      else rng.choice([None, (",", ":")]))
        yield json.dumps(obj, ensure_ascii=rng.random() < 0.5, indent=indent,
                         separators=separators)


def test_every_written_object_is_accepted_in_every_prefix():
    for text in _texts(300):
        data = text.encode("utf-8")
        state = START
        for i, c in enumerate(data):
            state = feed(state, bytes([c]))
            assert state is not None, (text, i)
            assert complete(state) == (i == len(data) - 1), (text, i)


def test_whatever_it_calls_whole_parses_and_mutations_it_accepts_do_too():
    """Soundness: random byte edits of valid objects; each one the constraint calls a whole
    object must parse to one, and each one it rejects at some byte must not parse (but for
    whitespace in a form it does not take: around the object, or a run llama.cpp's JSON
    grammar would not write)."""
    rng = random.Random(3)
    n_whole = n_rejected = 0
    alphabet = b'{}[]",:0123456789.-+eEtrufalsn \\\n/x\x01'
    for text in _texts(300):
        data = bytearray(text.encode("utf-8"))
        for _ in range(rng.randrange(1, 3)):
            op, at = rng.randrange(3), rng.randrange(len(data) + 1)
            if op == 0 and at < len(data):
                del data[at]
            elif op == 1:
                data.insert(at, rng.choice(alphabet))
            elif at < len(data):
                data[at] = rng.choice(alphabet)
        state = feed(START, bytes(data))
        try:
            parsed = _strict(bytes(data).decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            parsed = ValueError
        if state is not None and complete(state):
            n_whole += 1
            assert isinstance(parsed, dict), bytes(data)
        elif state is None:
            n_rejected += 1
            if isinstance(parsed, dict):  # whitespace in a form it refuses, by design
                squeezed = feed(START, _squeeze(bytes(data)))
                assert squeezed is not None and complete(squeezed), bytes(data)
    assert n_whole > 20 and n_rejected > 100  # both sides were exercised


@pytest.mark.parametrize("text", [
    '[1]', '"x"', '{"a":1,}', '{"a":01}', '{"a":1.}', '{"a":-}', '{"a":.5}', '{a:1}',
    "{'a':1}", '{"a":"\x01"}', '{"a":"\\x"}', '{"a":"\\u12G4"}', '{"a":tru}', '{"a":NaN}',
    '{"a" 1}', '{"a":1}}', '{}{', '{"a":[1,]}', '{"a":1e}', '{"a":+1}', '{,}',
])
def test_what_is_not_a_json_object_is_refused(text):
    state = feed(START, text.encode("utf-8"))
    assert state is None or not complete(state)
    with pytest.raises((ValueError, AssertionError)):
        assert isinstance(_strict(text), dict)


def test_whitespace_takes_llamas_forms_and_the_object_opens_at_once():
    assert feed(START, b" ") is None and feed(START, b"\n{") is None
    # llama.cpp's forms: none, one space, or a newline and an indent of up to 20
    assert feed(START, b'{"a": 1,\n' + b" " * MAX_INDENT + b'"b":\n\t\t[ 1 ]}') is not None
    for bad in (b'{"a":\n' + b" " * (MAX_INDENT + 1), b'{"a":  ', b'{"a":\t', b'{"a":\n\n',
                b'{"a": \n', b'{"a":\r\n'):
        assert feed(START, bad) is None, bad
    assert feed(START, b'{"a": "' + b" " * 500 + b'"}') is not None  # inside a string: text


# -- the constraint on tokens, and the sampler under it ------------------------------------

EOT = 99
VOCAB = [b"{", b"}", b'"', b"a", b":", b"1", b",", b" ", b"Hi", b'{"', b'":', b"", b"\n",
         b"[", b"]", b"true", b"x", b"{ "]


def _constraint():
    return JsonConstraint(TokenBytes(VOCAB + [None] * (100 - len(VOCAB))), [EOT])


def test_end_token_only_once_whole_and_control_tokens_never():
    c = _constraint()
    assert not c.allows(EOT) and not c.allows(11) and not c.allows(50)  # b"", control
    assert not c.allows(8) and not c.allows(7) and c.allows(0) and c.allows(9) and c.allows(17)
    for t in (9, 3, 10, 5, 1):  # {"a":1}
        c.advance(t)
    assert c.complete and c.allows(EOT) and not c.allows(7)
    with pytest.raises(ValueError, match="does not continue"):
        c.advance(0)


def _logits(rng, n=len(VOCAB)):
    z = np.full(100, -np.inf, np.float32)
    z[:n] = rng.standard_normal(n).astype(np.float32) * 2
    z[EOT] = 1.0
    return z


def test_constrained_generation_always_ends_in_an_object():
    """Random logits each step, greedy and drawn: the text stays a JSON prefix, and whatever
    ends with the end token parses to an object."""
    rng = np.random.default_rng(0)
    n_closed = 0
    for trial in range(60):
        params = SamplingParams(temperature=0 if trial % 2 else 1.0, top_k=5, top_p=1.0,
                                min_p=0.0, seed=trial)
        s = Sampler(params, _constraint())
        out = b""
        for _ in range(60):
            z = _logits(rng)
            z[1] += 1.5  # closing is likely enough that most runs end
            t = s(z)
            if t == EOT:
                n_closed += 1
                assert isinstance(_strict(out.decode()), dict), out
                break
            out += VOCAB[t]
            assert feed(START, out) is not None
    assert n_closed > 30


def test_constrained_argmax_is_the_best_allowed_token():
    c = _constraint()
    z = np.zeros(100, np.float32)
    z[8], z[16], z[9], z[0] = 9.0, 8.0, 3.0, 3.0  # "Hi", "x" refused; "{" and '{"' tie
    assert constrained_argmax(z, c) == 0  # the tie: the lower id
    c.advance(0)
    z[:] = -np.inf
    z[8] = 5.0
    with pytest.raises(ValueError, match="no token"):
        constrained_argmax(z, c)


def test_a_constrained_draw_is_the_restricted_distribution():
    c = _constraint()
    z = np.full(100, -np.inf, np.float32)
    z[[0, 17, 8, 9, 16]] = [1.0, 0.0, 2.0, 0.5, 1.5]  # 8 and 16 refused at the start
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    rng = np.random.default_rng(1)
    draws = np.bincount([constrained_draw(z, p, rng, c) for _ in range(20000)], minlength=100)
    allowed = np.exp(np.array([1.0, 0.0, 0.5]))
    np.testing.assert_allclose(draws[[0, 17, 9]] / 20000, allowed / allowed.sum(), atol=0.015)
    assert draws.sum() == draws[[0, 17, 9]].sum()
    # top-k 1 keeps only the refused "Hi": the best allowed token of the whole vocabulary
    assert constrained_draw(z, SamplingParams(temperature=1.0, top_k=1), rng, c) == 0


@pytest.mark.parametrize("text, ok", [
    ("é€😀".encode(), True), (b"\xc3", None), (b"\xc3E", False), (b"\x80", False),
    (b"\xc0\xaf", False), (b"\xe0\x80\x80", False), (b"\xed\xa0\x80", False),
    (b"\xf4\x90\x80\x80", False), (b"\xf5", False), ("\U0010ffff".encode(), True),
])
def test_strings_and_free_keys_are_well_formed_utf8(text, ok):
    """Overlong forms, surrogates and stray bytes are refused, as Python's strict decoder
    refuses them; a character cut short is a prefix (None), not whole."""
    for doc in (b'{"k": "' + text + b'"}', b'{"' + text + b'": 1}'):
        states = feed(START, doc)
        if ok:
            assert states is not None and complete(states)
            assert isinstance(_strict(doc.decode("utf-8")), dict)
        else:
            assert states is None
            if ok is False:
                with pytest.raises(UnicodeDecodeError):
                    doc.decode("utf-8")
    if ok is None:
        assert feed(START, b'{"k": "' + text) is not None
