"""`ChatTemplate`: a model's `tokenizer.chat_template` rendered as Hugging Face renders it.

The template is Jinja2, run in an immutable sandbox with the environment HF templates are
written against: `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a
`{% generation %}` block (rendered as its body), `raise_exception(msg)`, `strftime_now(fmt)`,
a `tojson` filter with HF's defaults (non-ASCII kept, optional `indent`), and the variables
`messages`, `tools`, `add_generation_prompt`, `bos_token`, `eos_token`, `unk_token`,
`pad_token` plus any extra keyword (`enable_thinking=False`, ...).
"""

from __future__ import annotations

import json
import warnings
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from strata.tokenizer.errors import ChatTemplateError, TokenizerWarning
from strata.tokenizer.tokenizer import Tokenizer

FALLBACK_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
"""ChatML, used for a model whose file has no `tokenizer.chat_template`: each message is
``<|im_start|>{role}\\n{content}<|im_end|>\\n``; the generation prompt is
``<|im_start|>assistant\\n``."""


class _TemplateRaised(Exception):
    """`raise_exception(...)` called by the template itself."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters and sorts keys; HF templates expect neither.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks in
    HF; rendering only needs the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise ChatTemplateError(f"messages must be a list of dicts, got "
                                f"{type(messages).__name__}")
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"messages[{k}] must be a dict with a string 'role', "
                                    f"got {m!r}")


class ChatTemplate:
    """A compiled chat template and the special-token texts it is rendered with."""

    def __init__(self, source: str, *, special_tokens: dict[str, str], is_fallback: bool = False):
        self.source = source
        self.is_fallback = is_fallback
        self._special_tokens = dict(special_tokens)
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template does not compile: {e.message} "
                                    f"(template line {e.lineno})") from e

    @classmethod
    def from_metadata(cls, meta: Any, tokenizer: Tokenizer, *,
                      template: str | None = None) -> ChatTemplate:
        """The template of a model: `template` if given (e.g. from a user's file), else the
        file's `tokenizer.chat_template`, else `FALLBACK_TEMPLATE` (ChatML) with a
        `TokenizerWarning`. `bos_token`/`eos_token` are the texts of the tokenizer's BOS/EOS."""
        source = template
        if source is None and "tokenizer.chat_template" in meta:
            source = meta.get("tokenizer.chat_template")
            if not isinstance(source, str):
                raise ChatTemplateError(f"metadata key 'tokenizer.chat_template' should be a "
                                        f"string, found {type(source).__name__}")
        is_fallback = source is None
        if is_fallback:
            warnings.warn("the model file has no tokenizer.chat_template: using the ChatML "
                          "fallback (<|im_start|>role ... <|im_end|>)", TokenizerWarning,
                          stacklevel=2)
            source = FALLBACK_TEMPLATE
        v = tokenizer.vocab
        specials = {name: (tokenizer.token_text(i) if i is not None else "")
                    for name, i in (("bos_token", v.bos_id), ("eos_token", v.eos_id),
                                    ("unk_token", v.unk_id), ("pad_token", v.pad_id))}
        return cls(source, special_tokens=specials, is_fallback=is_fallback)

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True,
               tools: list[dict] | None = None, **extra: Any) -> str:
        """The prompt text for `messages` (each a dict with 'role' and 'content'). Encode it
        with `parse_special=True` so the template's control tokens become their ids.
        Raises `ChatTemplateError` when the template fails or rejects the conversation."""
        _check_messages(messages)
        context = {**self._special_tokens, **extra, "messages": messages, "tools": tools,
                   "add_generation_prompt": add_generation_prompt}
        try:
            return self._template.render(**context)
        except _TemplateRaised as e:
            raise ChatTemplateError(f"chat template rejected the conversation: {e}") from None
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
