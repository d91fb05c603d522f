"""Cutting special-token texts (``<|im_start|>``, ``<end_of_turn>``...) out of raw text.

The scan is leftmost-longest, as Hugging Face `tokenizers` matches added tokens: the earliest
position where some special text starts wins, and there the longest special text. (llama.cpp
instead takes the longest special text first anywhere; the two differ only where two special
texts overlap each other in the input, which no common vocabulary's texts can do.)
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_NO_PREFIX = object()

Fragment = str | int
"""A piece of text still to be tokenized (`str`) or a token id already decided (`int`)."""


class SpecialSplitter:
    """Finds the special texts of a fixed set in raw text and cuts the text around them."""

    def __init__(self, specials: Iterable[tuple[str, int]]):
        # Every prefix of every special text maps to the id of the special it spells, or to
        # None: a walk from a candidate position stops at the first text that is no prefix.
        self._prefixes: dict[str, int | None] = {}
        n_specials = 0
        for text, token_id in sorted(specials, key=lambda s: -s[1]):
            if not text:
                continue
            n_specials += 1
            for k in range(1, len(text)):
                self._prefixes.setdefault(text[:k], None)
            self._prefixes[text] = token_id  # the lowest id wins a duplicated text
        self._n_specials = n_specials
        first = sorted({t[0] for t in self._prefixes})
        # candidate positions (a special's first character) are found in C
        self._candidates = re.compile("[" + "".join(re.escape(c) for c in first) + "]") \
            if first else None

    def __len__(self) -> int:
        return self._n_specials

    def _longest_at(self, text: str, pos: int) -> tuple[int, int] | None:
        """(end, id) of the longest special text starting at `pos`, or None."""
        prefixes, best = self._prefixes, None
        for end in range(pos + 1, len(text) + 1):
            tid = prefixes.get(text[pos:end], _NO_PREFIX)
            if tid is _NO_PREFIX:
                break
            if tid is not None:
                best = (end, tid)
        return best

    def split(self, text: str) -> list[Fragment]:
        """`text` as raw-text pieces and special token ids, in order; no empty pieces."""
        if self._candidates is None or not text:
            return [text] if text else []
        out: list[Fragment] = []
        at = 0  # start of the raw text not yet emitted
        m = self._candidates.search(text)
        while m is not None:
            pos = m.start()
            hit = self._longest_at(text, pos)
            if hit is None:
                m = self._candidates.search(text, pos + 1)
                continue
            end, tid = hit
            if pos > at:
                out.append(text[at:pos])
            out.append(tid)
            at = end
            m = self._candidates.search(text, end)
        if at < len(text):
            out.append(text[at:])
        return out
