"""`JsonObject`: a constraint that keeps generated text a prefix of one JSON object (RFC 8259),
token by token, and ends it with an end-of-turn token once the object closes: the API's
`response_format: {"type": "json_object"}`.

The check runs on bytes (a token's bytes in decoded text), so a token that ends inside a UTF-8
character is judged like any other: inside a string every byte from 0x20 up except `"` and `\\`
stands for itself. The state is an immutable tuple, so trying a candidate token costs one walk
over its bytes and nothing to undo. The object opens at the first byte (no whitespace before
it, none after its close: the end token is due there), and runs of whitespace inside are capped
(`MAX_WS`, room for a newline and an indent): a model that would pad with newlines forever
cannot.
"""

from __future__ import annotations

from typing import Callable, Sequence

MAX_WS = 24  # consecutive whitespace bytes allowed inside the object

# modes
TOP, VALUE, KEY_OR_CLOSE, KEY, COLON, AFTER, VALUE_OR_CLOSE = range(7)
STRING, ESCAPE, HEX, NUMBER, LITERAL, DONE = range(7, 13)
# a number's parts: what the bytes so far end with
MINUS, ZERO, INT, DOT, FRAC, EXP_MARK, EXP_SIGN, EXP = range(8)
_NUMBER_ENDS = frozenset({ZERO, INT, FRAC, EXP})  # where a number may stop

_WS = frozenset(b" \t\n\r")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'"\\/bfnrt')
_LITERALS = {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}

# (mode, stack, aux, n_ws): stack a bytes of b"{" / b"[" (innermost last); aux per mode (a
# string: whether it is a key; HEX: (is_key, digits left); NUMBER: its part; LITERAL: the
# bytes still due); n_ws the whitespace bytes in a row
State = tuple
START: State = (TOP, b"", None, 0)


def _after_value(stack: bytes) -> State:
    return (DONE if not stack else AFTER, stack, None, 0)


def _value_start(stack: bytes, c: int) -> State | None:
    if c == 0x7B:  # {
        return (KEY_OR_CLOSE, stack + b"{", None, 0)
    if c == 0x5B:  # [
        return (VALUE_OR_CLOSE, stack + b"[", None, 0)
    if c == 0x22:  # "
        return (STRING, stack, False, 0)
    if c == 0x2D:  # -
        return (NUMBER, stack, MINUS, 0)
    if c in _DIGITS:
        return (NUMBER, stack, ZERO if c == 0x30 else INT, 0)
    if c in _LITERALS:
        return (LITERAL, stack, _LITERALS[c], 0)
    return None


def _close(stack: bytes, c: int) -> State | None:
    if stack and stack[-1] == (0x7B if c == 0x7D else 0x5B if c == 0x5D else -1):
        return _after_value(stack[:-1])
    return None


def _number(state: State, c: int) -> State | None:
    _, stack, part, _ = state
    if c in _DIGITS:
        nxt = {MINUS: ZERO if c == 0x30 else INT, INT: INT, DOT: FRAC, FRAC: FRAC,
               EXP_MARK: EXP, EXP_SIGN: EXP, EXP: EXP}.get(part)
        return None if nxt is None else (NUMBER, stack, nxt, 0)
    if c == 0x2E and part in (ZERO, INT):  # .
        return (NUMBER, stack, DOT, 0)
    if c in (0x65, 0x45) and part in (ZERO, INT, FRAC):  # e E
        return (NUMBER, stack, EXP_MARK, 0)
    if c in (0x2B, 0x2D) and part == EXP_MARK:  # + -
        return (NUMBER, stack, EXP_SIGN, 0)
    if part in _NUMBER_ENDS:  # the number is over: the byte is the next thing's
        return step(_after_value(stack), c)
    return None


def step(state: State, c: int) -> State | None:
    """The state after byte `c`, or None where no JSON object continues with it."""
    mode, stack, aux, n_ws = state
    if mode == STRING:
        if c == 0x22:
            return (COLON, stack, None, 0) if aux else _after_value(stack)
        if c == 0x5C:
            return (ESCAPE, stack, aux, 0)
        return state if c >= 0x20 else None
    if mode == ESCAPE:
        if c == 0x75:  # u
            return (HEX, stack, (aux, 4), 0)
        return (STRING, stack, aux, 0) if c in _ESCAPES else None
    if mode == HEX:
        if c not in _HEX:
            return None
        is_key, left = aux
        return (STRING, stack, is_key, 0) if left == 1 else (HEX, stack, (is_key, left - 1), 0)
    if mode == NUMBER:
        return _number(state, c)
    if mode == LITERAL:
        if c != aux[0]:
            return None
        return _after_value(stack) if len(aux) == 1 else (LITERAL, stack, aux[1:], 0)
    if mode == DONE:
        return None
    if mode == TOP:
        return (KEY_OR_CLOSE, b"{", None, 0) if c == 0x7B else None
    if c in _WS:  # every other mode takes whitespace before what it expects
        return (mode, stack, aux, n_ws + 1) if n_ws < MAX_WS else None
    if mode == VALUE:
        return _value_start(stack, c)
    if mode == VALUE_OR_CLOSE:
        return _close(stack, c) if c == 0x5D else _value_start(stack, c)
    if mode == KEY_OR_CLOSE:
        return (STRING, stack, True, 0) if c == 0x22 else _close(stack, c)
    if mode == KEY:
        return (STRING, stack, True, 0) if c == 0x22 else None
    if mode == COLON:
        return (VALUE, stack, None, 0) if c == 0x3A else None
    # AFTER
    if c == 0x2C:  # ,
        return (KEY if stack[-1] == 0x7B else VALUE, stack, None, 0)
    return _close(stack, c)


def feed(state: State, data: bytes) -> State | None:
    for c in data:
        state = step(state, c)
        if state is None:
            return None
    return state


def complete(state: State) -> bool:
    """Whether the text so far is one whole JSON object."""
    return state[0] == DONE


class JsonObject:
    """The constraint for one sequence: `allows(token)` whether the token keeps the text a
    prefix of a JSON object (an end token only once the object is whole; a token of no bytes
    or a control token never), `advance(token)` takes it. `token_bytes(i)`: the bytes token i
    adds to decoded text, None for a control token."""

    def __init__(self, token_bytes: Callable[[int], bytes | None], stop_ids: Sequence[int]):
        self.token_bytes = token_bytes
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.state: State = START

    def _next(self, token: int) -> State | None:
        if token in self.stop_ids:
            return self.state if complete(self.state) else None
        data = self.token_bytes(token)
        if not data:  # a control token, or one that adds nothing: no progress
            return None
        return feed(self.state, data)

    def allows(self, token: int) -> bool:
        return self._next(token) is not None

    def advance(self, token: int) -> None:
        nxt = self._next(token)
        if nxt is None:
            raise ValueError(f"token {token} does not continue the JSON object")
        self.state = nxt

    @property
    def complete(self) -> bool:
        return complete(self.state)
