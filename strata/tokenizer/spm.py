"""SentencePiece-style BPE (`tokenizer.ggml.model = "llama"`): merges chosen by token score.

Spaces become ``▁``; the text starts as one symbol per character; every adjacent pair whose
concatenation is a vocabulary token is a candidate, and the candidate whose token has the
highest score is merged first (leftmost first on a tie), until no pair forms a token. A final
symbol that is not a token (a character the vocabulary lacks) is spelled as byte tokens
``<0xNN>``. This is the algorithm llama.cpp runs on these vocabularies, and the tests pin
token ids to llama.cpp.
"""

from __future__ import annotations

import heapq
import re

from strata.tokenizer.errors import TokenizerError
from strata.tokenizer.vocab import TokenType, Vocab

SPACE = "\u2581"  # ▁, SentencePiece's visible space
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_CACHE_WORDS = 65536


def _byte_ids(vocab: Vocab, ids: dict[str, int]) -> list[int | None]:
    """`[256]`: the token spelling each byte: its ``<0xNN>`` byte token, else (ASCII) the
    one-character token, else the unknown token, else None."""
    out: list[int | None] = [None] * 256
    for i in map(int, (vocab.types == TokenType.BYTE).nonzero()[0]):
        m = _BYTE_TOKEN.fullmatch(vocab.tokens[i])
        if m:
            out[int(m.group(1), 16)] = i
    for b in range(256):
        if out[b] is None:
            out[b] = ids.get(chr(b)) if b < 0x80 else None
        if out[b] is None:
            out[b] = vocab.unk_id
    return out


def _word_breaks(tokens: tuple[str, ...]) -> re.Pattern[str]:
    """A pattern of the places before a ``▁`` that no token spans: those where the character
    before it is not ``▁`` and never precedes ``▁`` inside any token. Merges cannot cross such a
    place, so the words between them are encoded independently (and cached) with the same
    result as the whole text."""
    joined: set[str] = set()
    for t in tokens:
        k = t.find(SPACE, 1)
        while k > 0:
            if t[k - 1] != SPACE:
                joined.add(t[k - 1])
            k = t.find(SPACE, k + 1)
    before = "".join(re.escape(c) for c in sorted(joined))
    return re.compile(f"(?<=[^{SPACE}{before}])(?={SPACE})")


class SpmModel:
    """Encodes raw text (no special tokens in it) to ids of a SentencePiece-style vocabulary."""

    def __init__(self, vocab: Vocab):
        self._ids = {t: i for i, t in enumerate(vocab.tokens) if t}  # a repeated text: last wins
        self._scores = vocab.scores or (0.0,) * vocab.n_vocab
        self._bytes = _byte_ids(vocab, self._ids)
        self._breaks = _word_breaks(vocab.tokens)
        self._cache: dict[str, tuple[int, ...]] = {}

    def encode(self, text: str, *, prefix_space: bool) -> list[int]:
        """Token ids of `text` (no special tokens in it); `prefix_space` puts the dummy space
        in front first, as SentencePiece does at the start of a text."""
        if not text:
            return []
        if prefix_space:
            text = " " + text
        text = text.replace(" ", SPACE)
        out: list[int] = []
        cache = self._cache
        for word in self._breaks.split(text):
            ids = cache.get(word)
            if ids is None:
                if len(cache) >= _CACHE_WORDS:
                    cache.clear()
                ids = cache[word] = self._encode_word(word)
            out.extend(ids)
        return out

    def _encode_word(self, word: str) -> tuple[int, ...]:
        ids, scores = self._ids, self._scores
        syms = list(word)  # one symbol per character; merged-away symbols become ""
        n = len(syms)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []  # (-score, left, right, merged length)
        for i in range(n - 1):
            tid = ids.get(syms[i] + syms[i + 1])
            if tid is not None:
                heap.append((-scores[tid], i, i + 1, 2))
        heapq.heapify(heap)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            if not a or not b or len(a) + len(b) != size:
                continue  # stale: one side has merged with something else since
            syms[left], syms[right] = a + b, ""
            after = nxt[left] = nxt[right]
            if after != -1:
                prv[after] = left
            for l, r in ((prv[left], left), (left, after)):
                if l != -1 and r != -1:
                    t = syms[l] + syms[r]
                    tid = ids.get(t)
                    if tid is not None:
                        heapq.heappush(heap, (-scores[tid], l, r, len(t)))
        return self._spell(syms, nxt)

    def _spell(self, syms: list[str], nxt: list[int]) -> tuple[int, ...]:
        out: list[int] = []
        i = 0
        while i != -1:
            tid = self._ids.get(syms[i])
            if tid is not None:
                out.append(tid)
            else:
                for b in syms[i].encode("utf-8"):
                    bid = self._bytes[b]
                    if bid is None:
                        raise TokenizerError(
                            f"cannot encode {syms[i]!r}: the vocabulary has no token for it, no "
                            f"byte token <0x{b:02X}> and no unknown token")
                    out.append(bid)
            i = nxt[i]
        return tuple(out)
