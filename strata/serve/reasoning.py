"""`ThinkSplitter`: a thinking model's answer split into its reasoning (`<think>` ... `</think>`)
and its content, as it streams, so each dialect returns the reasoning in its own field
(`reasoning_content`, Anthropic `thinking` blocks, Responses `reasoning` items, Ollama
`thinking`) and the content without it.

The reasoning is recognised only at the start of the answer (after blank space), or from the
first token where the prompt itself opened the block (a template that writes `<think>` into
the generation prompt). A `</think>` split across pieces is held back until it is whole; the
blank space inside the block's ends and the blank lines a model writes after it are dropped. An answer that never opens a block is all
content; one that never closes it is all reasoning.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from strata.engine.json_trigger import THINK_CLOSE, THINK_OPEN

OPEN, CLOSE = THINK_OPEN.decode(), THINK_CLOSE.decode()


@dataclass(frozen=True, slots=True)
class Thinking:
    """A piece of the model's reasoning (not part of its answer)."""

    text: str


def signature(text: str) -> str:
    """An Anthropic `thinking` block's `signature`: a digest of its text. Anthropic's proves the
    block came from its API; this proves nothing (nothing checks it here), but a client that
    keeps or replays only signed thinking blocks gets one, the same for the same text."""
    return "strata-sha256:" + hashlib.sha256(text.encode()).hexdigest()


def thinks(template_source: str) -> bool:
    """Whether a chat template is a thinking model's (it writes or strips `<think>` blocks)."""
    return OPEN in template_source and CLOSE in template_source


def opens_thinking(prompt_text: str) -> bool:
    """Whether a rendered prompt ends inside an open `<think>` block."""
    tail = prompt_text.rstrip()
    return tail.endswith(OPEN)


def _held(text: str, tag: str) -> int:
    """How many trailing characters of `text` could be the start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ThinkSplitter:
    """Feed the answer's text in pieces; get back `Thinking` and content (`str`) pieces."""

    def __init__(self, *, inside: bool = False):
        self._state = "opened" if inside else "start"
        self._buf = ""

    def feed(self, text: str) -> list[Thinking | str]:
        self._buf += text
        out: list[Thinking | str] = []
        while self._buf:
            if self._state == "start":
                lead = self._buf.lstrip()
                if lead.startswith(OPEN):
                    self._buf, self._state = lead[len(OPEN):], "opened"
                elif OPEN.startswith(lead):  # blank space or a partial tag: wait
                    break
                else:
                    self._state = "content"
            elif self._state == "opened":  # the blank lines that open the block are dropped
                self._buf = self._buf.lstrip()
                if self._buf:
                    self._state = "thinking"
            elif self._state == "thinking":
                at = self._buf.find(CLOSE)
                if at >= 0:
                    self._emit(out, Thinking(self._buf[:at].rstrip()))
                    self._buf, self._state = self._buf[at + len(CLOSE):], "after"
                    continue
                # held back: a partial close tag, and blank space that may end the block
                keep = _held(self._buf, CLOSE)
                body = self._buf[:len(self._buf) - keep]
                sent = body.rstrip()
                self._emit(out, Thinking(sent))
                self._buf = self._buf[len(sent):]
                break
            elif self._state == "after":  # the blank lines after the block are not content
                self._buf = self._buf.lstrip()
                if self._buf:
                    self._state = "content"
            else:
                self._emit(out, self._buf)
                self._buf = ""
        return out

    def finish(self) -> list[Thinking | str]:
        """What is still held back, at the end of the answer."""
        rest, self._buf = self._buf, ""
        if self._state in ("thinking", "opened"):
            rest = rest.rstrip()
            return [Thinking(rest)] if rest else []
        if not rest or self._state == "after":
            return []
        return [rest]

    @staticmethod
    def _emit(out: list, piece: Thinking | str) -> None:
        if (piece.text if isinstance(piece, Thinking) else piece):
            out.append(piece)
