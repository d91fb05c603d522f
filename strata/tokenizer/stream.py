"""`StreamDecoder`: token ids in, text out, one token at a time, never half a character."""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from strata.tokenizer.tokenizer import Tokenizer


class StreamDecoder:
    """Decodes a stream of token ids. `push` returns only complete UTF-8 text: the bytes of a
    character split across tokens are held until the rest arrives; bytes that can never form a
    character come out as U+FFFD at once. Call `flush` at the end of the stream for whatever is
    still held (an incomplete character becomes U+FFFD).

    The concatenation of every `push` and the final `flush` equals `Tokenizer.decode` of the same
    ids. Make one with `Tokenizer.stream_decoder()`.
    """

    __slots__ = ("_tok", "_skip_special", "_after_special", "_utf8")

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False,
                 after_special: bool = True):
        self._tok = tokenizer
        self._skip_special = skip_special
        self._after_special = after_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (may be empty)."""
        piece, self._after_special = self._tok._piece(
            token_id, skip_special=self._skip_special, after_special=self._after_special)
        return self._utf8.decode(piece) if piece else ""

    def flush(self) -> str:
        """End the stream: return the held bytes (U+FFFD for an incomplete character)."""
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out
