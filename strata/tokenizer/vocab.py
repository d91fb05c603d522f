"""`Vocab`: the tokenizer part of a GGUF file's metadata, read and checked once."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from strata.tokenizer.errors import TokenizerError

MODELS = ("gpt2", "llama")
"""`tokenizer.ggml.model` values Strata reads: byte-level BPE and SentencePiece-style BPE."""

_ID_KEYS = {
    "bos_id": "tokenizer.ggml.bos_token_id",
    "eos_id": "tokenizer.ggml.eos_token_id",
    "eot_id": "tokenizer.ggml.eot_token_id",
    "eom_id": "tokenizer.ggml.eom_token_id",
    "pad_id": "tokenizer.ggml.padding_token_id",
    "unk_id": "tokenizer.ggml.unknown_token_id",
    # fill-in-the-middle (`strata.tokenizer.fim`), as llama.cpp's converter names code models'
    "fim_pre_id": "tokenizer.ggml.fim_pre_token_id",
    "fim_suf_id": "tokenizer.ggml.fim_suf_token_id",
    "fim_mid_id": "tokenizer.ggml.fim_mid_token_id",
    "fim_pad_id": "tokenizer.ggml.fim_pad_token_id",
    "fim_rep_id": "tokenizer.ggml.fim_rep_token_id",
    "fim_sep_id": "tokenizer.ggml.fim_sep_token_id",
}


class TokenType(IntEnum):
    """`tokenizer.ggml.token_type` values (the GGUF convention)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


@dataclass(frozen=True, slots=True, eq=False)
class Vocab:
    """Everything the tokenizer needs from the metadata. `types` is `[n_vocab]` int64 (a
    `TokenType` each); `scores` holds n_vocab floats (SentencePiece vocabularies) or none."""

    model: str
    pre: str
    tokens: tuple[str, ...]
    types: np.ndarray
    scores: tuple[float, ...]
    merges: tuple[str, ...]
    bos_id: int | None = None
    eos_id: int | None = None
    eot_id: int | None = None
    eom_id: int | None = None
    pad_id: int | None = None
    unk_id: int | None = None
    fim_pre_id: int | None = None
    fim_suf_id: int | None = None
    fim_mid_id: int | None = None
    fim_pad_id: int | None = None
    fim_rep_id: int | None = None
    fim_sep_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool = True

    def __post_init__(self):
        if self.model not in MODELS:
            raise TokenizerError(f"tokenizer.ggml.model is {self.model!r}, which Strata does not "
                                 f"support (supported: {', '.join(MODELS)})")
        n = len(self.tokens)
        if n == 0:
            raise TokenizerError("tokenizer.ggml.tokens is empty")
        if len(self.types) != n:
            raise TokenizerError(f"tokenizer.ggml.token_type has {len(self.types)} entries but "
                                 f"tokenizer.ggml.tokens has {n}")
        if self.scores and len(self.scores) != n:
            raise TokenizerError(f"tokenizer.ggml.scores has {len(self.scores)} entries but "
                                 f"tokenizer.ggml.tokens has {n}")
        bad = np.flatnonzero((self.types < 0) | (self.types > max(TokenType)))
        if bad.size:
            i = int(bad[0])
            raise TokenizerError(f"tokenizer.ggml.token_type[{i}] is {int(self.types[i])}, "
                                 f"not a token type (0..{int(max(TokenType))})")
        for field, key in _ID_KEYS.items():
            v = getattr(self, field)
            if v is not None and not 0 <= v < n:
                raise TokenizerError(f"{key} is {v}, outside the vocabulary of {n} tokens")

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


def _get(meta: Any, key: str, default: Any = None) -> Any:
    return meta.get(key, default) if key in meta else default


def _as_int(meta: Any, key: str) -> int | None:
    v = _get(meta, key)
    if v is None:
        return None
    if isinstance(v, (bool, str, bytes, float)) or not isinstance(v, (int, np.integer)):
        raise TokenizerError(f"metadata key {key!r} should be an integer token id, found {v!r}")
    return int(v)


def _as_bool(meta: Any, key: str, default: bool) -> bool:
    v = _get(meta, key)
    if v is None:
        return default
    if not isinstance(v, (bool, np.bool_, int, np.integer)):
        raise TokenizerError(f"metadata key {key!r} should be a boolean, found {v!r}")
    return bool(v)


def _as_strings(meta: Any, key: str, *, required: bool) -> tuple[str, ...]:
    v = _get(meta, key)
    if v is None:
        if required:
            raise TokenizerError(f"the model file has no vocabulary: metadata key {key!r} is "
                                 f"missing")
        return ()
    if isinstance(v, str) or not all(isinstance(s, str) for s in v):
        raise TokenizerError(f"metadata key {key!r} should be an array of strings")
    return tuple(v)


def _as_numbers(meta: Any, key: str, dtype: type) -> np.ndarray | None:
    v = _get(meta, key)
    if v is None:
        return None
    try:
        arr = np.asarray(v, dtype=dtype)
    except (TypeError, ValueError) as e:
        raise TokenizerError(f"metadata key {key!r} should be an array of numbers ({e})") from e
    if arr.ndim != 1:
        raise TokenizerError(f"metadata key {key!r} should be a flat array, found shape "
                             f"{arr.shape}")
    return arr


def read_vocab(meta: Any) -> Vocab:
    """Read the tokenizer keys of `meta` (a `strata.gguf.Metadata` or any mapping with the same
    keys and values). Raises `TokenizerError` naming the key that is missing or malformed."""
    model = _get(meta, "tokenizer.ggml.model")
    if model is None:
        raise TokenizerError("the model file has no tokenizer: metadata key "
                             "'tokenizer.ggml.model' is missing")
    if not isinstance(model, str):
        raise TokenizerError(f"metadata key 'tokenizer.ggml.model' should be a string, "
                             f"found {model!r}")
    tokens = _as_strings(meta, "tokenizer.ggml.tokens", required=True)
    types = _as_numbers(meta, "tokenizer.ggml.token_type", np.int64)
    if types is None:  # older files: every token ordinary
        types = np.full(len(tokens), TokenType.NORMAL, dtype=np.int64)
    scores = _as_numbers(meta, "tokenizer.ggml.scores", np.float64)
    pre = _get(meta, "tokenizer.ggml.pre", "default")
    if not isinstance(pre, str):
        raise TokenizerError(f"metadata key 'tokenizer.ggml.pre' should be a string, found {pre!r}")
    ids = {field: _as_int(meta, key) for field, key in _ID_KEYS.items()}
    is_spm = model == "llama"
    return Vocab(
        model=model, pre=pre, tokens=tokens, types=types,
        scores=tuple(scores.tolist()) if scores is not None else (),
        merges=_as_strings(meta, "tokenizer.ggml.merges", required=False),
        add_bos=_as_bool(meta, "tokenizer.ggml.add_bos_token", is_spm),
        add_eos=_as_bool(meta, "tokenizer.ggml.add_eos_token", False),
        add_space_prefix=_as_bool(meta, "tokenizer.ggml.add_space_prefix", is_spm),
        **ids,
    )
