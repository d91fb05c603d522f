"""Tokenizer and chat template of a GGUF model, built from its metadata.

`Tokenizer.from_metadata(meta)` reads `tokenizer.ggml.*` (byte-level BPE "gpt2" or
SentencePiece-style "llama"); `ChatTemplate.from_metadata(meta, tokenizer)` renders
`tokenizer.chat_template` (or a ChatML fallback) with Jinja2 as Hugging Face does.
"""

from strata.tokenizer.chat import FALLBACK_TEMPLATE, ChatTemplate
from strata.tokenizer.errors import ChatTemplateError, TokenizerError, TokenizerWarning
from strata.tokenizer.stream import StreamDecoder
from strata.tokenizer.tokenizer import Tokenizer, replace_surrogates
from strata.tokenizer.vocab import TokenType, Vocab, read_vocab

__all__ = [
    "FALLBACK_TEMPLATE", "ChatTemplate", "ChatTemplateError", "StreamDecoder", "TokenType",
    "Tokenizer", "TokenizerError", "TokenizerWarning", "Vocab", "read_vocab",
    "replace_surrogates",
]
