"""`ServedModel`: the model as the HTTP side and the worker see it — its names, tokenizer, chat
template, end-of-turn tokens, and a sampler and text decoder per sequence.

Chat prompts are rendered with the model's own template and encoded with its control tokens
recognised and no extra BOS (the template writes it where the model wants one); plain
completion prompts follow the file's `add_bos_token`; a completion with a suffix is a
fill-in-the-middle prompt (`strata.tokenizer.fim`) where the vocabulary has the tokens.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import numpy as np

from strata.engine.json_constraint import JsonConstraint, TokenBytes
from strata.engine.json_either import CallsOrJson
from strata.engine.json_trigger import TriggeredJson
from strata.engine.xml_trigger import TriggeredXml
from strata.engine.sampler import Sampler, SamplingParams
from strata.serve.errors import bad_request
from strata.serve.job import Sampling
from strata.serve.reasoning import CLOSE, OPEN, thinks
from strata.serve.tools import (CALL_SUFFIX, OPEN_TAG, StrictXmlCalls,
                               template_uses_hermes_calls)
from strata.serve.xml_calls import template_uses_xml_calls
from strata.tokenizer import ChatTemplate, ChatTemplateError, StreamDecoder, Tokenizer
from strata.tokenizer.fim import FimTokens, fim_tokens

SEED_MODULUS = 1 << 64  # API seeds may be negative; numpy's generator wants 0..2**64-1


def make_constraint(sampling: Sampling, vocab: Callable[[], tuple[TokenBytes, frozenset[int]]]
                    ) -> JsonConstraint | TriggeredJson | TriggeredXml | CallsOrJson | None:
    """What holds a sequence's tokens: a JSON format, or strict tool calls, or either (tools
    beside a JSON format: calls, or the document as the answer), or nothing; a forced call
    is the answer whatever the format. `vocab()`: the model's `TokenBytes` and end tokens,
    asked for only where a constraint needs them (the table is built at the first such
    request)."""
    if not sampling.json_object and sampling.strict_calls is None:
        return None
    vocab, stop_ids = vocab()
    stops = sorted(stop_ids)
    calls = sampling.strict_calls
    if isinstance(calls, StrictXmlCalls):
        either = sampling.json_object and calls.forced is None  # a call, or the document
        xml = TriggeredXml(vocab, stops, trigger=OPEN_TAG.encode(), tools=calls.tools,
                           forced=calls.forced, think=None if either else calls.think)
        if either:
            return CallsOrJson(vocab, stops, root=sampling.json_schema,
                               trigger=OPEN_TAG.encode(), calls=xml)
        return xml
    if sampling.json_object and calls is not None and calls.inside is None:
        return CallsOrJson(vocab, stops, root=sampling.json_schema, call_root=calls.root,
                           trigger=OPEN_TAG.encode(), suffix=CALL_SUFFIX)
    if sampling.json_object and calls is None:
        return JsonConstraint(vocab, stops, sampling.json_schema)
    return TriggeredJson(vocab, stops, trigger=OPEN_TAG.encode(), root=calls.root,
                         suffix=CALL_SUFFIX, inside=calls.inside, think=calls.think)


class ServedModel:
    """One served model. `accepts_images` is False for every text-only model Strata runs: the
    dialects refuse image content by path instead of dropping it."""

    accepts_images = False

    def __init__(self, *, name: str, aliases: Sequence[str], tokenizer: Tokenizer,
                 template: ChatTemplate, max_context: int, split_thinking: bool = True):
        if max_context < 2:
            raise ValueError(f"max_context must be at least 2, got {max_context}")
        self.name = name
        self.aliases = tuple(a for a in aliases if a != name)
        self.tokenizer = tokenizer
        self.template = template
        self.max_context = max_context
        self.n_vocab = tokenizer.n_vocab
        # fill-in-the-middle where the vocabulary has its tokens (a code model's): a
        # completion's `suffix`; the tokens that end a middle end any answer (llama.cpp's
        # end-of-generation set holds them too)
        self.fim = fim_tokens(tokenizer)
        self.stop_token_ids = tokenizer.eot_ids | (self.fim.ends if self.fim else frozenset())
        self.tool_calls_parsed = template_uses_hermes_calls(template.source)
        # Qwen3-Coder's calls: XML bodies in the same blocks (`xml_calls`)
        self.xml_calls = self.tool_calls_parsed and template_uses_xml_calls(template.source)
        # a thinking model's <think> block returned apart from the answer (`--reasoning none`:
        # left in the text)
        self.splits_thinking = split_thinking and thinks(template.source)
        # the tags' token ids, where each is one token (Qwen3's are): the reasoning is counted
        ids = [self.encode(tag) for tag in (OPEN, CLOSE)] if self.splits_thinking else []
        self.think_ids = ((ids[0][0], ids[1][0]) if ids and all(len(i) == 1 for i in ids)
                          else None)

    def render_chat(self, messages: list[dict], tools: list[dict] | None,
                    extra: dict | None = None) -> str:
        """The prompt text (`extra`: more variables for the template, e.g. Qwen3's
        `enable_thinking`); a template that rejects the conversation is the client's 400."""
        try:
            return self.template.render(messages, add_generation_prompt=True, tools=tools,
                                        **(extra or {}))
        except ChatTemplateError as e:
            raise bad_request(f"messages: {e}", "messages") from e

    def encode(self, text: str) -> list[int]:
        """A rendered chat prompt's tokens."""
        return self.tokenizer.encode(text, add_bos=False, parse_special=True)

    def encode_prompt(self, text: str, *, special: bool = True) -> list[int]:
        """A raw completion prompt's tokens (BOS as the file says; `special` False: none)."""
        return self.tokenizer.encode(text, add_bos=None if special else False)

    def encode_fim(self, prefix: str, suffix: str, param: str = "suffix") -> list[int]:
        """The prompt asking for the text between `prefix` and `suffix` (`FimTokens.prompt`);
        a model without fill-in-the-middle tokens is the client's 400 naming `param`."""
        return self._fim(param).prompt(self.tokenizer, prefix, suffix)

    def _fim(self, param: str) -> FimTokens:
        if self.fim is None:
            raise bad_request(f"{param}: {self.name!r} has no fill-in-the-middle tokens (a code "
                              f"model's <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>), so it "
                              f"cannot insert text; leave {param} out", param)
        return self.fim

    def encode_infill(self, prefix: str, suffix: str, files: Sequence[tuple[str, str]],
                      middle: str, room: int) -> tuple[list[int], bool]:
        """llama.cpp's infill prompt (`FimTokens.infill_within`: other files' (name, text),
        the prefix and suffix around the insertion, then `middle`), cut to `room` tokens where
        it can be, and whether it was; no fill-in-the-middle tokens: a 400 naming
        input_suffix."""
        fim = self._fim("input_suffix")
        text = lambda t: self.tokenizer.encode(t, add_bos=False, parse_special=False)  # noqa: E731
        return fim.infill_within(self.tokenizer, text(prefix), text(suffix),
                                      [(text(n), text(t)) for n, t in files], text(middle), room)

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special=skip_special)

    @functools.cached_property
    def json_vocab(self) -> TokenBytes:
        """The vocabulary as the JSON constraint reads it, built at the first request that
        asks for a JSON format (on the engine thread, which makes every sampler)."""
        return TokenBytes.of_tokenizer(self.tokenizer)

    def sampler(self, sampling: Sampling) -> Callable[[np.ndarray], int]:
        seed = None if sampling.seed is None else sampling.seed % SEED_MODULUS
        constraint = make_constraint(sampling, lambda: (self.json_vocab, self.stop_token_ids))
        return Sampler(SamplingParams(
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
            min_p=sampling.min_p, repeat_penalty=sampling.repeat_penalty, seed=seed,
            repeat_last_n=sampling.repeat_last_n, presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty, logit_bias=sampling.logit_bias),
            constraint)

    def token_piece(self, token: int) -> tuple[str, bytes]:
        """A token as the API's logprobs show it: its text (a piece that is part of a UTF-8
        character shows as the replacement character) and its bytes in decoded text."""
        data = self.tokenizer.token_bytes(token)
        return data.decode("utf-8", errors="replace"), data

    def text_stream(self, after: int) -> StreamDecoder:
        return self.tokenizer.stream_decoder(skip_special=True, after=after)
