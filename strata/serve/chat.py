"""`ChatInput`: a chat request in one form, whichever dialect it came in; `prepare_chat` turns
it into prompt tokens through the model's own chat template.

Messages follow the form chat templates read: ``{"role": "system"|"user"|"assistant"|"tool",
"content": str}``, an assistant's calls as ``tool_calls=[{"type": "function", "function":
{"name", "arguments": dict}}]``, and tools as ``{"type": "function", "function": {"name",
"description", "parameters"}}``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Protocol

from strata.engine.json_schema import Node, SchemaError
from strata.engine.json_schema_request import compile_request_schema
from strata.serve.errors import bad_request
from strata.serve.generation import Prepared, fit_max_tokens
from strata.serve.job import PENALTY_LAST_N, Sampling
from strata.serve.reasoning import CLOSE, OPEN, opens_thinking
from strata.serve.tools import (OPEN_TAG, StrictCalls, StrictXmlCalls, strict_calls,
                                strict_xml_calls)
from strata.serve.xml_calls import forced_xml_prefix, param_types

TOOL_CHOICES = ("auto", "none", "required")


def schema_node(schema: dict, where: str, loose: bool = False) -> Node:
    """A request's JSON schema (a response format's, a strict tool's) compiled for the
    constraint; one outside the subset it holds output to is a 400 naming `where` (`loose`, a
    format without `strict`: the keywords narrowing a value within its type not held, as
    `compile_schema` says)."""
    try:
        return compile_request_schema(schema, loose)
    except SchemaError as e:
        raise bad_request(f"{where}: {e}", where) from e


class ChatModel(Protocol):
    max_context: int
    tool_calls_parsed: bool  # the template's tool-call format is one we parse back
    xml_calls: bool  # ... and its calls' bodies are Qwen3-Coder's XML (`xml_calls`), not JSON
    splits_thinking: bool  # a <think> block in the answer is returned apart

    def render_chat(self, messages: list[dict], tools: list[dict] | None,
                    extra: dict | None = None) -> str: ...

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class ChatInput:
    """A validated chat request. `tool_choice` is "auto", "none", "required" or a tool's name
    (that tool must be called)."""

    messages: tuple[dict, ...]
    tools: tuple[dict, ...] = ()
    tool_choice: str = "auto"
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = PENALTY_LAST_N
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None  # None: none; n: each token's and the n most likely
    json_object: bool = False  # response_format json_object: the answer is one JSON object
    json_schema: Node | None = None  # response_format json_schema: the schema it follows
    # (tool name, its parameters' schema where it is strict, else None), one per tool
    tool_schemas: tuple[tuple[str, Node | None], ...] = ()
    # (name, JSON value) variables for the chat template (`enable_thinking`, ...)
    template_vars: tuple[tuple[str, Any], ...] = ()
    # the start of the answer, written for the model after the generation prompt (Anthropic's
    # final assistant turn): the model continues it, and the answer is only what follows
    prefill: str = ""
    # False: at most one tool call (OpenAI's `parallel_tool_calls`, Anthropic's
    # `disable_parallel_tool_use`; `Prepared.one_call`)
    parallel_tool_calls: bool = True
    reasoning_budget: int | None = None  # the most reasoning tokens (`Sampling`)

    def __post_init__(self) -> None:
        if not self.messages:
            raise ValueError("a chat needs at least one message")
        names = {t["function"]["name"] for t in self.tools}
        if self.tool_choice not in TOOL_CHOICES and self.tool_choice not in names:
            raise ValueError(f"tool_choice names {self.tool_choice!r}, which is not among the "
                             f"tools ({', '.join(sorted(names)) or 'none given'})")

    def sampling(self, max_tokens: int,
                 strict: StrictCalls | StrictXmlCalls | None = None) -> Sampling:
        return Sampling(max_tokens=max_tokens, strict_calls=strict, temperature=self.temperature,
                        top_p=self.top_p, top_k=self.top_k, seed=self.seed, stop=self.stop,
                        presence_penalty=self.presence_penalty,
                        frequency_penalty=self.frequency_penalty, min_p=self.min_p,
                        repeat_penalty=self.repeat_penalty, repeat_last_n=self.repeat_last_n,
                        logit_bias=self.logit_bias, logprobs=self.logprobs,
                        json_object=self.json_object, json_schema=self.json_schema)


def forced_prefix(tool_choice: str) -> str:
    """Assistant text that makes a `<tool_call>` model call a tool (any, or the named one):
    the start of the call is written for it and it continues from there."""
    if tool_choice == "required":
        return OPEN_TAG + "\n"
    if tool_choice in ("auto", "none"):
        return ""
    return OPEN_TAG + "\n" + '{"name": ' + json.dumps(tool_choice) + ', "arguments": '


def chat_text(model: ChatModel, chat: ChatInput) -> tuple[str, str]:
    """The prompt's text as two pieces: the conversation rendered by the model's template
    (generation prompt included) followed by the prefill, and the forced call's opening
    (`forced_prefix`) that ends the prompt after them. Their encoding is the prompt the
    worker runs, and the one `count_tokens` counts."""
    use_tools = bool(chat.tools) and chat.tool_choice != "none"
    text = model.render_chat(list(chat.messages), list(chat.tools) if use_tools else None,
                             dict(chat.template_vars))
    prefix = ""
    if use_tools and model.tool_calls_parsed:
        prefix = (forced_xml_prefix if model.xml_calls else forced_prefix)(chat.tool_choice)
    if prefix and _inside_thinking(text + chat.prefill, chat.prefill):
        # the template opened a <think> block (a thinking-only model's does): a forced call
        # is the answer, so the block is closed empty first, as Qwen3's template writes it
        # with thinking off, rather than the call written inside the reasoning
        return text + chat.prefill + CLOSE + "\n\n", prefix
    return text + chat.prefill, prefix


def _inside_thinking(text: str, prefill: str) -> bool:
    """Whether the prompt ends inside an open `<think>` block: the generation prompt opened
    one that the prefill does not close, or the prefill opens one itself."""
    rendered = text[:len(text) - len(prefill)]
    if OPEN in prefill:
        return CLOSE not in prefill[prefill.rindex(OPEN):]
    return opens_thinking(rendered) and CLOSE not in prefill


def prepare_chat(model: ChatModel, chat: ChatInput, *, limit: int | None) -> Prepared:
    """Render, tokenize, clamp max_tokens to the room left: the request as the worker runs it."""
    use_tools = bool(chat.tools) and chat.tool_choice != "none"
    text, prefix = chat_text(model, chat)
    prompt = model.encode(text + prefix)
    max_tokens = fit_max_tokens(len(prompt), chat.max_tokens, max_context=model.max_context,
                                limit=limit)
    split = model.splits_thinking and not prefix  # a forced call starts the answer
    opened = split and _inside_thinking(text, chat.prefill)
    if chat.prefill and not opened:  # the answer's text has begun: no <think> starts it now
        split = False
    think = ("open" if opened else "start") if split else None  # no call inside <think>
    # strict tools (and forced calls, and calls beside a JSON format) hold the calls the model
    # makes, in its form: JSON, or Qwen3-Coder's XML
    parse = use_tools and model.tool_calls_parsed
    hold = strict_xml_calls if model.xml_calls else strict_calls
    strict = (hold(chat.tool_schemas, chat.tool_choice, forced=bool(prefix), think=think,
                   json_answer=chat.json_object) if parse else None)
    sampling = chat.sampling(max_tokens, strict)
    ids = getattr(model, "think_ids", None) if split else None
    if ids is not None:  # the reasoning's tokens counted, for usage, and held to a budget
        sampling = dataclasses.replace(sampling, reasoning_ids=ids, reasoning_open=opened,
                                       reasoning_budget=chat.reasoning_budget)
    return Prepared(prompt=tuple(prompt), sampling=sampling,
                    requested_max_tokens=chat.max_tokens, parse_tools=parse,
                    tool_types=param_types(chat.tools) if parse else None,
                    forced_prefix=prefix, split_thinking=split, thinking_open=opened,
                    one_call=parse and not chat.parallel_tool_calls)


RESERVED_VARS = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                 "unk_token", "pad_token")


def template_vars(value: Any, where: str) -> tuple[tuple[str, Any], ...]:
    """`chat_template_kwargs`: an object of variables for the chat template, each name an
    identifier the renderer does not set itself."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise bad_request(f"{where}: expected an object of template variables", where)
    for name in value:
        if not name.isidentifier() or name in RESERVED_VARS:
            raise bad_request(f"{where}.{name}: not a template variable a request may set",
                              f"{where}.{name}")
    return tuple(sorted(value.items()))


def tool_arguments(value: Any) -> Any:
    """An assistant call's arguments as the template wants them: a dict when they are JSON."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except (json.JSONDecodeError, RecursionError):  # nested too deep to be a dict here
            return value
        return parsed if isinstance(parsed, dict) else value
    return value
