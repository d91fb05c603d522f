"""`Engine`: what every backend's engine offers — one sequence, a KV cache sized for
`max_context`, `prefill` and `decode_step` returning the next token's logits.

The sampler, the generation loop and the server drive any engine through this interface only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from strata.errors import StrataError
from strata.gguf import ModelShape

# cb(name, layer, tensor): sees each intermediate of the forward (layer -1 outside the blocks).
Callback = Callable[[str, int, np.ndarray], None]


class EngineInputError(StrataError, ValueError):
    """Tokens the engine cannot take: empty, out of the vocabulary, or past the context."""


class ContextFullError(EngineInputError):
    """The sequence would not fit in the engine's `max_context` positions."""


def common_prefix(kept: Sequence[int] | None, tokens: Sequence[int]) -> int:
    """How many leading tokens of a new prompt `tokens` a kept sequence's `kept` holds, at most
    all but the prompt's last (a prefill computes at least one token: its logits are the
    prefill's result). The rule every engine that keeps a finished sequence's KV reuses by."""
    n = min(len(kept) if kept is not None else 0, len(tokens) - 1)
    if n <= 0:
        return 0
    diff = np.flatnonzero(np.asarray(kept[:n], np.int64) != np.asarray(tokens[:n], np.int64))
    return int(diff[0]) if diff.size else n


def kept_positions(n_keep: int, n_past: int) -> int:
    """`n_keep` as an engine's `rewind` keeps it (at most the `n_past` positions it holds), or a
    ValueError naming both."""
    if not 0 <= n_keep <= n_past:
        raise ValueError(f"cannot keep {n_keep} positions of a {n_past}-position sequence")
    return int(n_keep)


@dataclass(frozen=True, slots=True)
class PromptRecord:
    """A sequence's prompt ([n] i64) and the logits its prefill returned ([n_vocab] f32), kept
    by an engine that holds several sequences while that sequence's KV holds the prompt."""

    tokens: np.ndarray
    logits: np.ndarray

    @classmethod
    def of(cls, tokens: Sequence[int], logits: np.ndarray) -> "PromptRecord":
        return cls(np.array(tokens, np.int64), np.array(logits, np.float32))

    def begins(self, fed: Sequence[int] | None) -> bool:
        """Whether `fed` (a finished sequence's tokens) starts with this prompt."""
        n = self.tokens.size
        return fed is not None and len(fed) >= n and np.array_equal(
            np.asarray(fed[:n], np.int64), self.tokens)


def reusable_prefix(record: PromptRecord | None, kept: Sequence[int] | None,
                    tokens: Sequence[int], *, running: bool) -> int:
    """How many leading `tokens` of a new prompt a sequence's KV gives it: all where they are
    the sequence's recorded prompt (its logits are kept too: nothing is computed), else
    `common_prefix` of what its KV holds that another may take: its prompt while it runs (the
    positions past it are still its own to write), its kept tokens once it finished."""
    if record is not None and record.tokens.size == len(tokens) and record.begins(tokens):
        return len(tokens)
    if running:
        return common_prefix(None if record is None else record.tokens, tokens)
    return common_prefix(kept, tokens)


class Engine(ABC):
    """One sequence through a model. `prefill` appends tokens at positions n_past.. and
    `decode_step` appends one; both return float32[n_vocab] logits of the next token."""

    backend: str  # "cpu", "cuda", ...
    shape: ModelShape
    max_context: int

    @property
    @abstractmethod
    def n_past(self) -> int:
        """Positions of the sequence already in the KV cache."""

    @abstractmethod
    def reset(self) -> None:
        """Forget the sequence (the KV cache is reused, not freed)."""

    @abstractmethod
    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Process `tokens` after the current sequence; float32[n_vocab] logits of the token
        that follows them."""

    @abstractmethod
    def decode_step(self, token: int) -> np.ndarray:
        """Process one token; float32[n_vocab] logits of the next."""

    def check_tokens(self, tokens: Sequence[int]) -> np.ndarray:
        """The tokens as int64[n], or an `EngineInputError` naming what is wrong."""
        arr = np.asarray(tokens)
        if arr.ndim != 1 or arr.size == 0:
            raise EngineInputError("the prompt is empty: give at least one token")
        if not np.issubdtype(arr.dtype, np.integer):
            raise EngineInputError(f"token ids must be integers, got {arr.dtype}")
        bad = arr[(arr < 0) | (arr >= self.shape.n_vocab)]
        if bad.size:
            raise EngineInputError(f"token id {int(bad[0])} is outside the vocabulary "
                                   f"(0..{self.shape.n_vocab - 1})")
        if self.n_past + arr.size > self.max_context:
            what = (f"the prompt has {arr.size} tokens" if self.n_past == 0 else
                    f"{arr.size} more tokens after {self.n_past}")
            trained = (f"; the model was trained for {self.shape.n_ctx_train}"
                       if self.shape.n_ctx_train > 0 else "")  # 0: the file does not say
            raise ContextFullError(
                f"{what} but the context holds {self.max_context} (raise --max-context"
                f"{trained})")
        return arr.astype(np.int64)
