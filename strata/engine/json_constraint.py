"""`JsonConstraint`: keeps generated text a prefix of one JSON document (RFC 8259) that a schema
allows (`strata.engine.json_schema`), token by token, and ends it with an end-of-turn token once
the document is whole: the API's `response_format` json_object (any object) and json_schema.

The check runs on bytes (a token's bytes in decoded text), so a token that ends inside a UTF-8
character is judged like any other: inside a string every byte from 0x20 up except `"` and `\\`
stands for itself, as long as the bytes are well-formed UTF-8 (RFC 3629: no overlong forms, no
surrogates), so the text decodes without a replacement character. A state is an immutable
tuple, so trying a candidate token costs one walk over its bytes and nothing to undo; where the
schema leaves a choice open (`anyOf`, an enum of which one value begins another) several states
run side by side, and a byte keeps those it continues. No state is ever kept that cannot be
completed: a comma needs a key or an item still to come, a close needs the required keys and
`minItems`, so a model is never cornered. The document opens at the first byte (no whitespace
before it, none after its close: the end token is due there), and whitespace inside takes
llama.cpp's JSON grammar's forms: none, one space, or a newline and an indent of at most
`MAX_INDENT` spaces or tabs. A model that would pad with newlines or tabs forever cannot.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from strata.engine.json_schema import Node, object_node

MAX_INDENT = 20  # spaces or tabs after a newline

# modes
(ROOT, VALUE, OBJ_OPEN, OBJ_KEY, KEY, COLON, AFTER, ARR_OPEN, STRING, ESCAPE, HEX, NUMBER,
 LITERAL, DONE) = range(14)
# a number's parts: what the bytes so far end with (EXP, EXP2: one or two exponent digits)
MINUS, ZERO, INT, DOT, FRAC, EXP_MARK, EXP_SIGN, EXP, EXP2 = range(9)
_NUMBER_ENDS = frozenset({ZERO, INT, FRAC, EXP, EXP2})  # where a number may stop
# Exponents have at most two digits: within a double's range, so no number written here
# parses to infinity (9e348363 is JSON, and inf in every client). The integer and fraction parts
# have at most MAX_DIGITS digits each, as llama.cpp's JSON grammar has: a model repeating a digit
# cannot write a number forever.
MAX_DIGITS = 16

_WS = frozenset(b" \t\n\r")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'"\\/bfnrt')

# A state: (mode, stack, aux, n_ws). stack: the open containers, innermost last, each
# ("o", node, keys seen) or ("a", node, items done); aux per mode (VALUE: the node expected;
# KEY: (the key's bytes so far, 0 / "\\" after a backslash / hex digits due / UTF-8
# continuation bytes due); STRING: UTF-8 continuation bytes due; COLON: the key;
# NUMBER: (part, integers only, digits of the part); LITERAL: (the texts still possible, the
# bytes so far); HEX: digits left); n_ws: the whitespace run so far (`_ws_next`).
State = tuple
States = tuple  # of State, none twice


def start(root: Node) -> States:
    return ((ROOT, (), root, 0),)


def _utf8_lead(c: int):
    """What a byte from 0x80 up starts: (continuation bytes due, the next one's low, high), or
    None where it cannot start a character."""
    if 0xC2 <= c <= 0xDF:
        return (1, 0x80, 0xBF)
    if 0xE0 <= c <= 0xEF:
        return (2, 0xA0 if c == 0xE0 else 0x80, 0x9F if c == 0xED else 0xBF)
    if 0xF0 <= c <= 0xF4:
        return (3, 0x90 if c == 0xF0 else 0x80, 0x8F if c == 0xF4 else 0xBF)
    return None


def _utf8_more(due: tuple, c: int):
    """After continuation byte `c` of a character: False where it does not fit, None where the
    character is whole, else what is still due."""
    n, lo, hi = due
    if not lo <= c <= hi:
        return False
    return None if n == 1 else (n - 1, 0x80, 0xBF)


def _after_value(stack: tuple) -> State:
    if not stack:
        return (DONE, (), None, 0)
    top = stack[-1]
    if top[0] == "a":  # one more item done
        stack = stack[:-1] + (("a", top[1], top[2] + 1),)
    return (AFTER, stack, None, 0)


def _alternatives(node: Node, seen: frozenset = frozenset()):
    """The nodes a value of `node` may be, `anyOf`s flattened (one that leads back to itself
    adds nothing)."""
    if node.any_of is None:
        yield node
    elif node not in seen:
        for alt in node.any_of:
            yield from _alternatives(alt, seen | {node})


def _literal(stack: tuple, texts: tuple[bytes, ...], typed: bytes) -> list[State]:
    texts = tuple(t for t in texts if t.startswith(typed))
    out = [_after_value(stack)] if typed in texts else []
    if any(len(t) > len(typed) for t in texts):
        out.append((LITERAL, stack, (texts, typed), 0))
    return out


def _value_start(stack: tuple, node: Node, c: int) -> list[State]:
    out: list[State] = []
    for alt in _alternatives(node):
        if alt.literals is not None:
            out += _literal(stack, alt.literals, bytes([c]))
            continue
        k = alt.kinds
        if c == 0x7B and "object" in k:  # {
            out.append((OBJ_OPEN, stack + (("o", alt, frozenset()),), None, 0))
        elif c == 0x5B and "array" in k:  # [
            out.append((ARR_OPEN, stack + (("a", alt, 0),), None, 0))
        elif c == 0x22 and "string" in k:  # "
            out.append((STRING, stack, None, 0))
        elif (c == 0x2D or c in _DIGITS) and ("number" in k or "integer" in k):
            part = MINUS if c == 0x2D else ZERO if c == 0x30 else INT
            out.append((NUMBER, stack, (part, "number" not in k, int(part == INT)), 0))
        elif c in (0x74, 0x66) and "boolean" in k:  # t f
            out += _literal(stack, (b"true", b"false"), bytes([c]))
        elif c == 0x6E and "null" in k:  # n
            out += _literal(stack, (b"null",), bytes([c]))
    return out


def _keys_left(frame: tuple) -> bool:
    _, node, seen = frame
    return node.additional is not None or any(k not in seen for k in node.props)


def _close(stack: tuple, c: int) -> list[State]:
    kind, node, done = stack[-1]
    if kind == "o" and c == 0x7D and node.required <= done:  # }
        return [_after_value(stack[:-1])]
    if kind == "a" and c == 0x5D and done >= node.min_items:  # ]
        return [_after_value(stack[:-1])]
    return []


def _key_byte(state: State, c: int) -> list[State]:
    """A byte of a key. A schema's keys are matched as written (they hold no escapes); a key
    only `additionalProperties` allows is any JSON string, escapes included."""
    _, stack, (typed, esc), _ = state
    _, node, seen = stack[-1]
    free = node.additional is not None
    if isinstance(esc, tuple) or (esc == 0 and c >= 0x80):  # a multi-byte character's byte
        due = _utf8_more(esc, c) if isinstance(esc, tuple) else _utf8_lead(c)
        if due is False or (due is None and not isinstance(esc, tuple)):
            return []
        typed += bytes([c])
        if free or any(k.startswith(typed) and k not in seen for k in node.props):
            return [(KEY, stack, (typed, due or 0), 0)]
        return []
    if esc == "\\":  # after a backslash
        if c == 0x75:
            return [(KEY, stack, (typed + b"\\u", 4), 0)]
        return [(KEY, stack, (typed + bytes([0x5C, c]), 0), 0)] if c in _ESCAPES else []
    if esc:  # the hex digits of a \u escape still due
        return [(KEY, stack, (typed + bytes([c]), esc - 1), 0)] if c in _HEX else []
    if c == 0x22:  # the key is whole
        if typed not in seen and (typed in node.props or free):
            return [(COLON, stack, typed, 0)]
        return []
    if c < 0x20:
        return []
    if c == 0x5C:
        return [(KEY, stack, (typed, "\\"), 0)] if free else []
    typed += bytes([c])
    if free or any(k.startswith(typed) and k not in seen for k in node.props):
        return [(KEY, stack, (typed, 0), 0)]
    return []


def _number(state: State, c: int) -> list[State]:
    _, stack, (part, integer, n_digits), _ = state
    if c in _DIGITS:
        nxt = {MINUS: ZERO if c == 0x30 else INT, INT: INT, DOT: FRAC, FRAC: FRAC,
               EXP_MARK: EXP, EXP_SIGN: EXP, EXP: EXP2}.get(part)
        n = n_digits + 1 if nxt == part else int(nxt in (INT, FRAC))  # digits of this part
        if nxt is None or n > MAX_DIGITS:
            return []
        return [(NUMBER, stack, (nxt, integer, n), 0)]
    if c == 0x2E and part in (ZERO, INT) and not integer:  # .
        return [(NUMBER, stack, (DOT, integer, 0), 0)]
    if c in (0x65, 0x45) and part in (ZERO, INT, FRAC) and not integer:  # e E
        return [(NUMBER, stack, (EXP_MARK, integer, 0), 0)]
    if c in (0x2B, 0x2D) and part == EXP_MARK:  # + -
        return [(NUMBER, stack, (EXP_SIGN, integer, 0), 0)]
    if part in _NUMBER_ENDS:  # the number is over: the byte is the next thing's
        return _step(_after_value(stack), c)
    return []


def _step(state: State, c: int) -> list[State]:
    """The states one deterministic state goes to on byte `c` (none: refused)."""
    mode, stack, aux, n_ws = state
    if mode == STRING:  # aux: the UTF-8 continuation bytes due (None: none)
        if aux is not None:
            due = _utf8_more(aux, c)
            return [] if due is False else [(STRING, stack, due, 0)]
        if c == 0x22:
            return [_after_value(stack)]
        if c == 0x5C:
            return [(ESCAPE, stack, None, 0)]
        if c >= 0x80:
            due = _utf8_lead(c)
            return [] if due is None else [(STRING, stack, due, 0)]
        return [state] if c >= 0x20 else []
    if mode == ESCAPE:
        if c == 0x75:  # u
            return [(HEX, stack, 4, 0)]
        return [(STRING, stack, None, 0)] if c in _ESCAPES else []
    if mode == HEX:
        if c not in _HEX:
            return []
        return [(STRING, stack, None, 0)] if aux == 1 else [(HEX, stack, aux - 1, 0)]
    if mode == NUMBER:
        return _number(state, c)
    if mode == LITERAL:
        return _literal(stack, aux[0], aux[1] + bytes([c]))
    if mode == KEY:
        return _key_byte(state, c)
    if mode == DONE:
        return []
    if mode == ROOT:
        return _value_start(stack, aux, c)
    if c in _WS:  # every mode left takes whitespace before what it expects
        return [(mode, stack, aux, n)] if (n := _ws_next(n_ws, c)) else []
    if mode == VALUE:
        return _value_start(stack, aux, c)
    if mode == COLON:
        if c != 0x3A:
            return []
        _, node, seen = stack[-1]
        value = node.props.get(aux, node.additional)
        frame = ("o", node, seen | {aux})
        return [(VALUE, stack[:-1] + (frame,), value, 0)]
    if mode in (OBJ_OPEN, OBJ_KEY):
        if c == 0x22 and _keys_left(stack[-1]):
            return [(KEY, stack, (b"", 0), 0)]
        return _close(stack, c) if mode == OBJ_OPEN else []
    if mode == ARR_OPEN:
        node = stack[-1][1]
        if c == 0x5D:
            return _close(stack, c)
        return _value_start(stack, node.items, c) if node.max_items != 0 else []
    # AFTER a value inside a container
    kind, node, done = stack[-1]
    if c == 0x2C:  # , : only where another key or item may follow
        if kind == "o":
            return [(OBJ_KEY, stack, None, 0)] if _keys_left(stack[-1]) else []
        if node.max_items is None or done < node.max_items:
            return [(VALUE, stack, node.items, 0)]
        return []
    return _close(stack, c)


def _ws_next(n_ws: int, c: int) -> int:
    """The whitespace run's state after byte `c` (0: refused). n_ws: 0 none yet, 1 one space
    (the run is over), 2 + k a newline and k spaces or tabs."""
    if n_ws == 0:
        return 1 if c == 0x20 else 2 if c == 0x0A else 0
    if n_ws >= 2 and c in (0x20, 0x09) and n_ws - 2 < MAX_INDENT:
        return n_ws + 1
    return 0


def feed(states: States, data: bytes) -> States | None:
    """The states after `data`, or None where no allowed document continues with it."""
    for c in data:
        nxt: dict[State, None] = {}
        for s in states:
            for t in _step(s, c):
                nxt[t] = None
        if not nxt:
            return None
        states = tuple(nxt)
    return states


def complete(states: States) -> bool:
    """Whether the text so far is one whole allowed document."""
    return any(s[0] == DONE for s in states)


class TokenBytes:
    """A vocabulary's tokens as the constraint reads them: `pieces[i]` the bytes token i adds to
    decoded text (None for a control token), and the tokens grouped by first byte, so the
    tokens a state could take are found by trying 256 bytes, not every token. Built once per
    model (152K tokens: see the README)."""

    def __init__(self, pieces: Sequence[bytes | None]):
        self.pieces = list(pieces)
        first = np.array([p[0] if p else -1 for p in self.pieces], np.int64)  # [n_vocab]
        order = np.argsort(first, kind="stable")
        cuts = np.searchsorted(first[order], np.arange(257))
        self.by_first = [order[cuts[b]:cuts[b + 1]] for b in range(256)]  # ids, ascending

    def with_first(self, fits: Callable[[int], bool]) -> np.ndarray:
        """int64 ids of the tokens whose first byte `fits`."""
        groups = [self.by_first[b] for b in range(256) if fits(b)]
        return np.concatenate(groups) if groups else np.zeros(0, np.int64)

    @classmethod
    def of_tokenizer(cls, tok) -> TokenBytes:
        """From a `strata.tokenizer.Tokenizer`: control tokens None, the others their bytes."""
        return cls([None if tok.is_special(i) else tok.token_bytes(i) for i in range(tok.n_vocab)])


class JsonConstraint:
    """The constraint for one sequence: `allows(token)` whether the token keeps the text a
    prefix of a document `root` allows (an end token only once it is whole, and then nothing
    else; a token of no bytes or a control token never), `advance(token)` takes it;
    `candidates()` the tokens whose first byte the document may take next (a superset of the
    allowed ones, for a search that would otherwise try every token). `root` None: any JSON
    object."""

    def __init__(self, vocab: TokenBytes, stop_ids: Sequence[int], root: Node | None = None):
        self.vocab = vocab
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.states: States = start(root if root is not None else object_node())

    def _next(self, token: int) -> States | None:
        if token in self.stop_ids:
            return self.states if complete(self.states) else None
        data = self.vocab.pieces[token] if 0 <= token < len(self.vocab.pieces) else None
        if not data:  # a control token, or one that adds nothing: no progress
            return None
        return feed(self.states, data)

    def candidates(self) -> np.ndarray:
        """int64 ids: the end tokens once the document is whole, else every token whose first
        byte some state takes."""
        if complete(self.states):
            return np.array(sorted(self.stop_ids), np.int64)
        return self.vocab.with_first(lambda b: any(_step(s, b) for s in self.states))

    def allows(self, token: int) -> bool:
        return self._next(token) is not None

    def advance(self, token: int) -> None:
        nxt = self._next(token)
        if nxt is None:
            raise ValueError(f"token {token} does not continue the JSON document")
        self.states = nxt

    @property
    def complete(self) -> bool:
        return complete(self.states)
