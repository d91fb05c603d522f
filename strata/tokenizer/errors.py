"""Errors and warnings of the tokenizer and the chat template."""

from __future__ import annotations

from strata.errors import StrataError


class TokenizerError(StrataError, ValueError):
    """A vocabulary Strata cannot use, or a token id / request the vocabulary cannot serve."""


class ChatTemplateError(StrataError, ValueError):
    """A chat template that does not compile or fails while rendering; names the problem."""


class TokenizerWarning(UserWarning):
    """Something in the vocabulary was odd but usable (an unknown pre-tokenizer, skipped merges)."""
