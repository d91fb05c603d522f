"""Byte-level BPE (`tokenizer.ggml.model = "gpt2"`), on the Hugging Face `tokenizers` core.

`tokenizers` applies ranked merges exactly as GGUF vocabularies expect (lowest rank first,
leftmost first among equal pairs), with the same "isolated" regex split and byte-level alphabet,
so the core is built from the file's tokens and merges rather than rewritten. Special tokens
are cut out before text reaches it (see `specials.py`), so it holds no added tokens.
"""

from __future__ import annotations

import warnings

from tokenizers import Regex, Tokenizer
from tokenizers import pre_tokenizers as pre
from tokenizers.models import BPE

from strata.tokenizer.bytelevel import BYTE_TO_CHAR
from strata.tokenizer.errors import TokenizerError, TokenizerWarning
from strata.tokenizer.pretokenize import pre_tokenizer
from strata.tokenizer.vocab import Vocab


def _merge_pairs(merges: tuple[str, ...], ids: dict[str, int]) -> list[tuple[str, str]]:
    """The usable merges in rank order: each "left right" whose parts and result are tokens.
    A repeated pair keeps its first (best) rank."""
    pairs: dict[tuple[str, str], None] = {}
    n_skipped = 0
    for m in merges:
        cut = m.find(" ", 1)  # from 1: a left part may itself be a space character
        if cut < 0:
            n_skipped += 1
            continue
        a, b = m[:cut], m[cut + 1:]
        if a in ids and b in ids and a + b in ids:
            pairs.setdefault((a, b), None)
        else:
            n_skipped += 1
    if n_skipped:
        warnings.warn(f"{n_skipped} of {len(merges)} entries of tokenizer.ggml.merges are not "
                      f"'left right' pairs of vocabulary tokens that merge into a token; they "
                      f"are ignored", TokenizerWarning, stacklevel=4)
    return list(pairs)


class BpeModel:
    """Encodes raw text (no special tokens in it) to ids of a byte-level BPE vocabulary."""

    def __init__(self, vocab: Vocab):
        ids = {t: i for i, t in enumerate(vocab.tokens) if t}  # a repeated text: last id wins
        missing = [b for b in range(256) if BYTE_TO_CHAR[b] not in ids]
        if missing:
            shown = ", ".join(f"0x{b:02X} ({BYTE_TO_CHAR[b]!r})" for b in missing[:8])
            raise TokenizerError(
                f"byte-level vocabulary lacks {len(missing)} of the 256 byte tokens ({shown}"
                f"{', ...' if len(missing) > 8 else ''}): text with those bytes cannot be encoded")
        p = pre_tokenizer(vocab.pre)
        self.pre_name = p.name
        model = BPE(vocab=ids, merges=_merge_pairs(vocab.merges, ids),
                    ignore_merges=p.ignore_merges, fuse_unk=False, byte_fallback=False)
        core = Tokenizer(model)
        splits = [pre.Split(Regex(pattern), behavior="isolated") for pattern in p.patterns]
        core.pre_tokenizer = pre.Sequence(
            [*splits, pre.ByteLevel(add_prefix_space=False, use_regex=False)])
        self._core = core

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, which must hold no special tokens that should stay whole."""
        if not text:
            return []
        return self._core.encode(text, add_special_tokens=False).ids
