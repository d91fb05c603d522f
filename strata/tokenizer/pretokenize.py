"""Pre-tokenizer patterns of byte-level BPE vocabularies, chosen by `tokenizer.ggml.pre`.

A byte-level BPE vocabulary is only reproduced when the text is first cut into the same words
the model's own tokenizer cut it into; each family publishes its pattern. Every match of the
pattern is one word and so is every run of text between matches ("isolated" splitting). BPE
merges never cross a word.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from strata.tokenizer.errors import TokenizerWarning

# Contractions, then letters with at most one leading non-letter, then digits, then punctuation
# runs, then whitespace. The families differ in the digit rule and in how newlines attach.
_CONTRACTIONS_ANY_CASE = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (_CONTRACTIONS_ANY_CASE + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (_CONTRACTIONS_ANY_CASE + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True, slots=True)
class PreTokenizer:
    """How one family cuts text into words: the patterns applied in order, and whether a word
    that is itself a token is taken whole before any merge (`ignore_merges`, Llama 3)."""

    name: str
    patterns: tuple[str, ...]
    ignore_merges: bool = False

    def __post_init__(self):
        if not self.patterns:
            raise ValueError(f"pre-tokenizer {self.name!r} needs at least one pattern")


PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": PreTokenizer("gpt2", (GPT2,)),
    "gpt2": PreTokenizer("gpt2", (GPT2,)),
    "gpt-2": PreTokenizer("gpt2", (GPT2,)),
    "llama-bpe": PreTokenizer("llama3", (LLAMA3,), ignore_merges=True),
    "llama3": PreTokenizer("llama3", (LLAMA3,), ignore_merges=True),
    "llama-v3": PreTokenizer("llama3", (LLAMA3,), ignore_merges=True),
    "qwen2": PreTokenizer("qwen2", (QWEN2,)),
}
"""`tokenizer.ggml.pre` value -> pre-tokenizer. Unknown values fall back to `DEFAULT_PRE`."""

DEFAULT_PRE = "gpt2"


def pre_tokenizer(pre: str) -> PreTokenizer:
    """The pre-tokenizer for a `tokenizer.ggml.pre` value; an unknown value gets the GPT-2
    pattern and a `TokenizerWarning` (text still round-trips; token ids may differ from the
    model's own tokenizer around digits and newlines)."""
    found = PRE_TOKENIZERS.get(pre)
    if found is not None:
        return found
    warnings.warn(f"unknown tokenizer.ggml.pre {pre!r}: using the {DEFAULT_PRE} pre-tokenizer "
                  f"(known: {', '.join(sorted(PRE_TOKENIZERS))}); token ids may differ from the "
                  f"model's own tokenizer", TokenizerWarning, stacklevel=3)
    return PRE_TOKENIZERS[DEFAULT_PRE]
