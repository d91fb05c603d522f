"""`TriggeredJson`: free text in which, once a trigger appears, a JSON document a schema allows
must follow, then a fixed suffix, then free text again: strict tool calls, where the model may
write prose or call a tool, and a call it opens (`<tool_call>` and a newline) must hold a JSON
object naming a tool with arguments its schema allows, closed by `\\n</tool_call>`.

Free text allows every token (an end token too); a token may carry the trigger's last bytes and
the document's first. Inside the document and its suffix an end token is refused: a call the
model opens is a call it finishes. Like `JsonConstraint`, it is a pure function of bytes, so a
candidate is tried without undoing anything.

A thinking model's reasoning is free text the trigger does not open a call in (`think`): where
the answer opens with `<think>` (after blank space), or starts inside the block the prompt
opened, the trigger counts only after `</think>`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from strata.engine.json_constraint import TokenBytes, complete, feed, start
from strata.engine.json_schema import Node

# a state: ("free", the text's last bytes, as many as the trigger is long but one)
#          ("gap", None): the trigger is whole; an optional newline, then the document
#          ("json", States)  ("suffix", the suffix's bytes still due)
#          ("lead", bytes): the answer's first bytes (blank space dropped), while they may
#                  open a <think> block   ("think", the block's last bytes): inside it
State = tuple
THINK_OPEN, THINK_CLOSE = b"<think>", b"</think>"
_FREE = ("free", "lead", "think")  # states where any token may come (an end one too)


class TriggeredJson:
    """`trigger` (e.g. b"<tool_call>") opens a document of `root`, which `suffix` (e.g.
    b"\\n</tool_call>") closes. `inside`: start inside a document already opened by the prompt
    (a forced call): (its root, its suffix), which after the suffix leaves free text."""

    def __init__(self, vocab: TokenBytes, stop_ids: Sequence[int], *, trigger: bytes,
                 root: Node, suffix: bytes, inside: tuple[Node, bytes] | None = None,
                 think: str | None = None):
        if not trigger or not suffix:
            raise ValueError("a trigger and a suffix are both needed")
        self.vocab, self.trigger, self.root, self.suffix = vocab, trigger, root, suffix
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self._inside_suffix = None
        if think not in (None, "start", "open"):
            raise ValueError(f"think must be None, 'start' or 'open', got {think!r}")
        if inside is None:
            self.state: State = {None: ("free", b""), "start": ("lead", b""),
                                 "open": ("think", b"")}[think]
        else:
            self.state = ("json", start(inside[0]))
            self._inside_suffix = inside[1]

    def _step(self, state: State, suffix_due: bytes | None, c: int
              ) -> tuple[State, bytes | None] | None:
        kind, aux = state
        if kind == "lead":
            if not aux and c in b" \t\r\n":
                return state, None
            lead = aux + bytes([c])
            if lead == THINK_OPEN:
                return ("think", b""), None
            if THINK_OPEN.startswith(lead):
                return ("lead", lead), None
            out: tuple[State, bytes | None] | None = (("free", b""), None)
            for b in lead:  # no block: the bytes are the answer's free text
                out = self._step(out[0], None, b)
                if out is None:  # (a short trigger among them, then no document)
                    return None
            return out
        if kind == "think":
            tail = (aux + bytes([c]))[-len(THINK_CLOSE):]
            if tail == THINK_CLOSE:
                return ("free", b""), None
            return ("think", tail[1 - len(THINK_CLOSE):]), None
        if kind == "free":
            tail = (aux + bytes([c]))[-len(self.trigger):]
            if tail == self.trigger:
                return ("gap", None), None
            return ("free", tail[1 - len(self.trigger):] if len(self.trigger) > 1 else b""), None
        if kind == "gap" and c == 0x0A:  # the newline the template writes after the tag
            return ("json", start(self.root)), None
        if kind == "gap":
            nxt = feed(start(self.root), bytes([c]))
            return (None if nxt is None else (("json", nxt), None))
        if kind == "json":
            if complete(aux):  # the document is whole: the suffix's turn
                due = suffix_due if suffix_due is not None else self.suffix
                return self._step(("suffix", due), None, c)
            nxt = feed(aux, bytes([c]))
            return None if nxt is None else (("json", nxt), suffix_due)
        # suffix
        if c != aux[0]:
            return None
        return (("suffix", aux[1:]), None) if len(aux) > 1 else (("free", b""), None)

    def _next(self, token: int) -> tuple[State, bytes | None] | None:
        state, due = self.state, self._inside_suffix
        if token in self.stop_ids:  # only where no call is open
            return (state, due) if state[0] in _FREE else None
        data = self.vocab.pieces[token] if 0 <= token < len(self.vocab.pieces) else None
        if not data:
            return None if state[0] not in _FREE else (state, due)  # control text: free only
        for c in data:
            out = self._step(state, due, c)
            if out is None:
                return None
            state, due = out
        return state, due

    def allows(self, token: int) -> bool:
        return self._next(token) is not None

    def advance(self, token: int) -> None:
        nxt = self._next(token)
        if nxt is None:
            raise ValueError(f"token {token} does not continue the tool call")
        self.state, self._inside_suffix = nxt

    def candidates(self) -> np.ndarray:
        """Every token (free text takes any); inside a call, those whose first byte fits."""
        if self.state[0] in _FREE:
            return np.arange(len(self.vocab.pieces), dtype=np.int64)
        return self.vocab.with_first(
            lambda b: self._step(self.state, self._inside_suffix, b) is not None)

    @property
    def in_call(self) -> bool:
        return self.state[0] not in _FREE
