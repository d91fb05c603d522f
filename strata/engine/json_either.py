"""`CallsOrJson`: an answer that is either tool calls or one JSON document — a request with both
tools and a JSON format (OpenAI's API takes `tools` beside `response_format`, as its Agents
SDK sends them for an agent with tools and an output type): the model calls a tool, or it
answers, and then its answer is the document.

The two are told apart by the answer's first bytes: a prefix of the trigger (`<tool_call>`)
keeps the calls open, where `TriggeredJson` then holds them (after the first
call, free text again, as with tools alone); `{` keeps the document open, where
`JsonConstraint` holds it. Nothing comes before either (no blank space: the document's
constraint takes none before its first byte, so neither does the calls' side, lest a newline
decide for the calls). A token either takes is allowed; each is fed the tokens as long as
it allows them, so a candidate is tried without undoing anything. An end token comes only
where one of them is whole: the document, or the text after a closed call (an empty answer is
neither).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from strata.engine.json_constraint import JsonConstraint, TokenBytes
from strata.engine.json_schema import Node
from strata.engine.json_trigger import TriggeredJson


class CallsOrJson:
    """`allows(token)` / `advance(token)` / `candidates()`, as `JsonConstraint`: a document of
    `root` (None: any object) or calls, each `trigger` + a document of `call_root` + `suffix`;
    or, given `calls`, the calls that constraint holds (opened by the same `trigger`: the
    XML form's, `strata.engine.xml_trigger.TriggeredXml`)."""

    def __init__(self, vocab: TokenBytes, stop_ids: Sequence[int], *, root: Node | None,
                 trigger: bytes, call_root: Node | None = None, suffix: bytes = b"",
                 calls: TriggeredJson | None = None):
        self.vocab, self.trigger = vocab, trigger
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.json: JsonConstraint | None = JsonConstraint(vocab, stop_ids, root)
        if calls is None:
            if call_root is None:
                raise ValueError("CallsOrJson needs call_root and suffix, or calls")
            calls = TriggeredJson(vocab, stop_ids, trigger=trigger, root=call_root,
                                  suffix=suffix)
        self.calls: TriggeredJson | None = calls
        self.lead = b""  # the answer so far, until the trigger is whole

    def _calls_take(self, token: int) -> tuple[bool, bytes]:
        """Whether the calls' side takes `token`, and its lead after it."""
        if self.calls is None:
            return False, self.lead
        if len(self.lead) >= len(self.trigger):  # the trigger is whole: the calls decide
            return self.calls.allows(token), self.lead
        if token in self.stop_ids:
            return False, self.lead  # no call yet: nothing to end
        data = self.vocab.pieces[token] if 0 <= token < len(self.vocab.pieces) else None
        if not data:
            return False, self.lead
        lead = self.lead + data
        n = min(len(lead), len(self.trigger))
        if lead[:n] != self.trigger[:n]:
            return False, self.lead
        return self.calls.allows(token), lead

    def allows(self, token: int) -> bool:
        return ((self.json is not None and self.json.allows(token))
                or self._calls_take(token)[0])

    def advance(self, token: int) -> None:
        json_ok = self.json is not None and self.json.allows(token)
        calls_ok, lead = self._calls_take(token)
        if not (json_ok or calls_ok):
            raise ValueError(f"token {token} continues neither a tool call nor the document")
        if json_ok:
            self.json.advance(token)
        else:
            self.json = None
        if calls_ok:
            self.calls.advance(token)
            self.lead = lead
        else:
            self.calls = None

    def candidates(self) -> np.ndarray:
        """A superset of the allowed tokens: every token while the calls' side is open (its
        free text takes any), else the document's."""
        if self.calls is not None:
            return np.arange(len(self.vocab.pieces), dtype=np.int64)
        return self.json.candidates()
