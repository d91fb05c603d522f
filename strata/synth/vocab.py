"""The synthetic model's tokenizer: a byte-level BPE vocabulary in the `gpt2` / `qwen2` style.

Ids 0..255 are the 256 single bytes (each written with the GPT-2 byte-to-character mapping), then
merges learned from a small built-in English text, then the ChatML control tokens, then unused
`[PAD<id>]` fillers up to the model's vocabulary size (no merge produces them, so no text
tokenizes to them). Every string of bytes therefore has a tokenization.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass

from strata.tokenizer.bytelevel import BYTE_TO_CHAR  # the byte alphabet the tokenizer reads

# GGUF token types (llama.cpp's LLAMA_TOKEN_TYPE_*)
NORMAL, CONTROL, UNUSED = 1, 3, 5
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MAX_MERGES = 480

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Pre-tokenization in the spirit of qwen2's pattern (contractions, letters with one leading
# non-letter, single digits, punctuation runs, whitespace), ASCII-only: merges are learned only
# inside such pieces, so every merge is one the qwen2 pre-tokenizer can reach.
_PIECES = re.compile(
    r"'(?:s|t|re|ve|m|ll|d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TRAINING_TEXT = """\
The river starts high in the hills, where the snow melts in the spring and the water runs
clear and cold over the stones. In the morning the light comes slowly down the valley, and the
people of the village walk to the market with bread, cheese, apples and fresh milk. The market
is small, but it has everything that the families need for the week: salt and oil, wool and
thread, tools for the garden, and a little news from the town on the other side of the river.

An old bridge crosses the water near the mill. It was built of grey stone more than two hundred
years ago, and it has stood through floods and storms that took the wooden bridges away. The
children like to stand on the bridge and count the fish that rest in the shade below. When the
weather is warm they sit on the bank, read their books, and talk about the places they would
like to see when they are older: the sea, the mountains in the north, the great cities with
their trains and towers and bright lights at night.

In the evening the workers come back from the fields. They have cut the hay, moved the sheep to
the higher meadow, and mended the fence that the wind had broken. Dinner is simple but good:
soup with beans and onions, potatoes from the garden, a piece of meat on Sunday, and a cake
when someone has a birthday. After dinner the older people tell stories about the winters of
their youth, when the snow was so deep that the school was closed for a month and the only way
to reach the town was on foot.

A computer is a machine that follows instructions. It reads numbers from its memory, changes
them, and writes them back, billions of times every second. A program is a list of such
instructions, written by people who want the machine to solve a problem for them: to count the
words in a book, to find the shortest road between two towns, to predict the weather for
tomorrow, or to answer a question in plain language. Good programs are clear, tested, and
honest about what they cannot do. When a program fails, it should say what went wrong and what
the user can change to make it work.

Questions and answers. What is the time? It is half past seven. Where is the station? Go
straight on, then turn left at the church. How much does the ticket cost? Three pounds for a
single and five for a return. Thank you very much. You are welcome, and have a good day.
"""


def to_symbols(text: str) -> str:
    """A piece of text as the byte-level characters the vocabulary is written in."""
    table = BYTE_TO_CHAR
    return "".join(table[b] for b in text.encode("utf-8"))


def _merge_word(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(pair[0] + pair[1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


@functools.lru_cache(maxsize=4)
def learn_merges(max_merges: int = MAX_MERGES) -> tuple[tuple[str, str], ...]:
    """Byte-pair merges learned from `TRAINING_TEXT`: most frequent pair first (ties broken by
    the pair's text), stopping at `max_merges` or when no pair occurs twice."""
    words = Counter(tuple(to_symbols(p)) for p in _PIECES.findall(TRAINING_TEXT))
    merges: list[tuple[str, str]] = []
    while len(merges) < max_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, n in words.items():
            for a, b in zip(w[:-1], w[1:], strict=True):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        merged: Counter[tuple[str, ...]] = Counter()
        for w, n in words.items():
            merged[_merge_word(w, best)] += n
        words = merged
    return tuple(merges)


@dataclass(frozen=True, slots=True)
class Vocab:
    """Tokens, their GGUF types, the merges, and the special ids."""

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]  # "a b" strings, in rank order
    bos_id: int
    eos_id: int
    eot_id: int
    pad_id: int

    @property
    def n_real(self) -> int:
        """Tokens a text can produce (bytes, merges, specials) — the rest are fillers."""
        return self.pad_id + len(SPECIALS)


def build_vocab(n_vocab: int) -> Vocab:
    """The vocabulary for a model with `n_vocab` rows in its embedding."""
    room = n_vocab - 256 - len(SPECIALS)
    if room < 0:
        raise ValueError(f"n_vocab {n_vocab} leaves no room for 256 bytes and "
                         f"{len(SPECIALS)} special tokens")
    merges = learn_merges()[:room]
    tokens = list(BYTE_TO_CHAR) + [a + b for a, b in merges]
    types = [NORMAL] * len(tokens)
    first_special = len(tokens)
    tokens += SPECIALS
    types += [CONTROL] * len(SPECIALS)
    tokens += [f"[PAD{i}]" for i in range(len(tokens), n_vocab)]
    types += [UNUSED] * (n_vocab - len(types))
    if len(set(tokens)) != len(tokens):
        raise ValueError("duplicate token text in the synthetic vocabulary")
    eot, im_end = first_special, first_special + 2
    return Vocab(tokens=tuple(tokens), token_types=tuple(types),
                 merges=tuple(f"{a} {b}" for a, b in merges),
                 bos_id=eot, eos_id=im_end, eot_id=im_end, pad_id=eot)
