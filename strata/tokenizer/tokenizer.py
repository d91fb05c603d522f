"""`Tokenizer`: text <-> token ids for a GGUF vocabulary (byte-level BPE or SentencePiece)."""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from strata.tokenizer.bpe import BpeModel
from strata.tokenizer.bytelevel import decode_text
from strata.tokenizer.errors import TokenizerError
from strata.tokenizer.specials import SpecialSplitter
from strata.tokenizer.spm import SPACE, SpmModel
from strata.tokenizer.stream import StreamDecoder
from strata.tokenizer.vocab import TokenType, Vocab, read_vocab

END_OF_TURN_TEXTS = frozenset({
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<|end|>", "<EOT>", "<|return|>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
})
"""Token texts that end a turn in the chat formats of the common model families."""

_CUT_OUT = (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.USER_DEFINED)
_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_surrogates(text: str) -> str:
    """`text` with each lone UTF-16 surrogate replaced by U+FFFD (a high and low surrogate
    standing as two code points become the one character they spell).

    A Python string can hold code points no UTF-8 text can: a JSON escape such as ``"\\ud800"``
    decodes to a lone surrogate, and a command-line argument that is not UTF-8 keeps its bad
    bytes as surrogates (surrogateescape: byte 0xFF is ``"\\udcff"``). The BPE core refuses
    such a string (a TypeError from `tokenizers`) and byte tokens are spelled from the text's
    UTF-8, so a model can only be given what a decoder shows for bytes that are not text:
    the replacement character."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


class Tokenizer:
    """Encodes text to token ids and back, exactly as the model's vocabulary prescribes.

    Build it with `Tokenizer.from_metadata(model_file.metadata)`.
    """

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        types = vocab.types
        self._model = BpeModel(vocab) if vocab.model == "gpt2" else SpmModel(vocab)
        self._spm_prefix = vocab.model == "llama" and vocab.add_space_prefix
        # Control and unknown tokens are cut out of text only when asked (parse_special);
        # user-defined tokens always are: they are ordinary text the vocabulary keeps whole.
        cut = np.isin(types, _CUT_OUT)
        self._cut_out = cut  # [n_vocab] bool: the token stands apart from the text around it
        self._split_all = SpecialSplitter(self._texts_of(cut))
        self._split_user = SpecialSplitter(self._texts_of(types == TokenType.USER_DEFINED))
        special = np.isin(types, (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.UNUSED))
        for i in (vocab.bos_id, vocab.eos_id, vocab.eot_id, vocab.eom_id, vocab.pad_id,
                  vocab.unk_id):
            if i is not None:
                special[i] = True
        self._special = special  # [n_vocab] bool: hidden by skip_special
        ends = {i for i in (vocab.eos_id, vocab.eot_id, vocab.eom_id) if i is not None}
        ends |= {i for i, t in enumerate(vocab.tokens) if t in END_OF_TURN_TEXTS}
        self._eot_ids = frozenset(ends)
        self._pieces: list[bytes | None] = [None] * vocab.n_vocab

    def _texts_of(self, mask: np.ndarray) -> Iterable[tuple[str, int]]:
        return ((self.vocab.tokens[i], i) for i in map(int, np.flatnonzero(mask)))

    @classmethod
    def from_metadata(cls, meta: Any) -> Tokenizer:
        """The tokenizer of a model: `meta` is `ModelFile.metadata` (or any mapping holding the
        `tokenizer.ggml.*` keys). Raises `TokenizerError` naming a missing or malformed key."""
        return cls(read_vocab(meta))

    # ----------------------------------------------------------------------------- properties
    @property
    def n_vocab(self) -> int:
        """Number of tokens in the vocabulary (valid ids are 0..n_vocab-1)."""
        return self.vocab.n_vocab

    @property
    def bos_id(self) -> int | None:
        """The beginning-of-sequence token, or None when the vocabulary names none."""
        return self.vocab.bos_id

    @property
    def eos_id(self) -> int | None:
        """The end-of-sequence token, or None when the vocabulary names none."""
        return self.vocab.eos_id

    @property
    def eot_ids(self) -> frozenset[int]:
        """Every token that ends a turn: eos, eot, eom and end-of-turn tokens such as
        ``<|im_end|>`` or ``<end_of_turn>`` present in the vocabulary."""
        return self._eot_ids

    def _check(self, token_id: Any) -> int:
        try:
            i = operator.index(token_id)
        except TypeError:
            raise TokenizerError(f"token id {token_id!r} is not an integer") from None
        if not 0 <= i < self.vocab.n_vocab:
            n = self.vocab.n_vocab
            raise TokenizerError(f"token id {i} is out of range for a vocabulary of {n} tokens "
                                 f"(valid ids: 0..{n - 1})")
        return i

    def token_text(self, token_id: int) -> str:
        """The token's text as the vocabulary stores it (``Ġthe``, ``▁the``, ``<0x0A>``)."""
        return self.vocab.tokens[self._check(token_id)]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes the token stands for in decoded text (control tokens: their text)."""
        i = self._check(token_id)
        piece = self._pieces[i]
        if piece is None:
            piece = self._pieces[i] = self._piece_bytes(i)
        return piece

    def is_special(self, token_id: int) -> bool:
        """True for control, unknown and unused tokens and the named bos/eos/eot/pad ids: the
        tokens `decode(..., skip_special=True)` leaves out."""
        return bool(self._special[self._check(token_id)])

    def _piece_bytes(self, i: int) -> bytes:
        text, kind = self.vocab.tokens[i], int(self.vocab.types[i])
        if kind in (TokenType.NORMAL, TokenType.UNDEFINED, TokenType.BYTE):
            if self.vocab.model == "gpt2":
                return decode_text(text)
            if kind == TokenType.BYTE and len(text) == 6 and text.startswith("<0x"):
                return bytes([int(text[3:5], 16)])
            return text.replace(SPACE, " ").encode("utf-8")
        return text.encode("utf-8")

    def _piece(self, token_id: int, *, skip_special: bool,
               after_special: bool) -> tuple[bytes, bool]:
        """The bytes one token adds to decoded text, and whether it stands apart (for the next).
        SentencePiece vocabularies put a dummy space at the start of text and after each token
        that stands apart; it is removed again here, so decode inverts encode."""
        i = self._check(token_id)
        if skip_special and self._special[i]:
            return b"", True
        piece = self.token_bytes(i)
        cut = bool(self._cut_out[i])
        if self._spm_prefix and after_special and not cut and piece[:1] == b" ":
            piece = piece[1:]
        return piece, cut

    # ----------------------------------------------------------------------------- encode
    def encode(self, text: str, *, add_bos: bool | None = None,
               parse_special: bool = True) -> list[int]:
        """Token ids of `text`.

        `add_bos`: None follows the metadata (`add_bos_token`, `add_eos_token`); True adds BOS
        (EOS still as the metadata says); False adds neither, for text that is a fragment or
        already carries its BOS. A BOS is never doubled: text that already starts with it (a
        chat template writing ``bos_token``) gets none added.
        `parse_special`: control tokens written in the text (``<|im_start|>``) become their
        ids; when False they are tokenized as plain text. User-defined tokens are always kept
        whole, as the model's own tokenizer does. A lone surrogate in `text` (which no UTF-8
        text holds) is encoded as U+FFFD (`replace_surrogates`).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() needs a str, got {type(text).__name__}")
        text = replace_surrogates(text)
        v = self.vocab
        want_bos = v.add_bos if add_bos is None else add_bos
        want_eos = v.add_eos and add_bos is not False
        if add_bos and v.bos_id is None:
            raise TokenizerError("add_bos=True but the vocabulary names no BOS token "
                                 "(tokenizer.ggml.bos_token_id is missing)")
        splitter = self._split_all if parse_special else self._split_user
        out: list[int] = []
        after_special = True
        for frag in splitter.split(text):
            if isinstance(frag, int):
                out.append(frag)
                after_special = True
            else:
                out.extend(self._encode_raw(frag, after_special))
                after_special = False
        if want_bos and v.bos_id is not None and out[:1] != [v.bos_id]:
            out.insert(0, v.bos_id)
        if want_eos and v.eos_id is not None:
            out.append(v.eos_id)
        return out

    def _encode_raw(self, text: str, after_special: bool) -> list[int]:
        if isinstance(self._model, SpmModel):
            return self._model.encode(text, prefix_space=self._spm_prefix and after_special)
        return self._model.encode(text)

    # ----------------------------------------------------------------------------- decode
    def stream_decoder(self, *, skip_special: bool = False,
                       after: int | None = None) -> StreamDecoder:
        """A `StreamDecoder` for generated tokens. `after`: the last token before the stream
        (the prompt's last); SentencePiece vocabularies drop the dummy space of a stream's first
        token only when it starts the text or follows a special token."""
        after_special = True if after is None else bool(self._cut_out[self._check(after)])
        return StreamDecoder(self, skip_special=skip_special, after_special=after_special)

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """The text of `ids`. Invalid UTF-8 (a lone byte token) becomes U+FFFD. With
        `skip_special`, control tokens (BOS, EOS, ``<|im_end|>``...) are left out."""
        d = StreamDecoder(self, skip_special=skip_special)
        return "".join([d.push(i) for i in ids]) + d.flush()

    def __repr__(self) -> str:
        v = self.vocab
        return (f"Tokenizer(model={v.model!r}, pre={v.pre!r}, n_vocab={v.n_vocab}, "
                f"bos_id={v.bos_id}, eos_id={v.eos_id})")
