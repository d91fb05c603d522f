"""`Generation`: one request's job seen from the asyncio side — prepare, submit, read events.

Both dialects turn their request into a `Prepared` (prompt tokens, sampling, tool handling),
then read `items()`: plain text pieces and parsed `ToolCall`s, in order. `finish` holds the
worker's `FinishEvent` afterwards. Where the request asked for logprobs, `take_logprobs()` hands
out each token's entry once: after a text piece, those of the tokens sent so far. `max_tokens`
is clamped to the room the prompt leaves in the context and the clamp is reported in response
headers, never refused.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator, Protocol

from strata.serve.errors import ContextExceeded
from strata.serve.job import FinishEvent, Job, PromptEvent, Sampling, TextEvent, TokenLogprob
from strata.serve.reasoning import Thinking, ThinkSplitter
from strata.serve.tools import ToolCall, ToolCallParser


class Submitter(Protocol):
    max_queue: int  # jobs the queue holds at most

    def submit(self, job: Job) -> None: ...

    def submit_all(self, jobs: list[Job]) -> None: ...


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request ready for the worker."""

    prompt: tuple[int, ...]
    sampling: Sampling
    requested_max_tokens: int | None  # what the client asked for (None: as much as fits)
    parse_tools: bool = False  # split <tool_call> blocks out of the text
    forced_prefix: str = ""  # text the prompt already ends with, fed to the tool parser first
    # the request's tools' parameter types, which an XML call's values are read as
    # (`xml_calls.param_types`)
    tool_types: dict | None = None
    split_thinking: bool = False  # a thinking model's <think> block is returned apart
    thinking_open: bool = False  # the prompt itself opened the block: the answer starts in it
    # at most one tool call (`parallel_tool_calls: false`, Anthropic's
    # `disable_parallel_tool_use`): the job ends once its first call is complete, and nothing
    # generated after that call is part of the answer
    one_call: bool = False

    @property
    def clamped(self) -> bool:
        return (self.requested_max_tokens is not None
                and self.requested_max_tokens > self.sampling.max_tokens)

    @property
    def headers(self) -> dict[str, str]:
        """Response headers that say what max_tokens the request ran with and why."""
        h = {"x-strata-max-tokens": str(self.sampling.max_tokens)}
        if self.clamped:
            h["x-strata-max-tokens-clamped-from"] = str(self.requested_max_tokens)
        return h


def fit_max_tokens(n_prompt: int, requested: int | None, *, max_context: int,
                   limit: int | None, param: str = "messages") -> int:
    """The max_tokens a request runs with: what it asked, at most the room its prompt leaves
    (and the server's own limit). A prompt that leaves no room at all is a 400."""
    room = max_context - n_prompt
    if room < 1:
        raise ContextExceeded(n_prompt, max_context, param)
    want = room if requested is None else requested
    if limit is not None:
        want = min(want, limit)
    return max(1, min(want, room))


class Generation:
    """Submit a prepared request and read its output; `cancel()` when the client goes away."""

    def __init__(self, worker: Submitter, prepared: Prepared, *, id_prefix: str = "call_",
                 submit: bool = True):
        self.prepared = prepared
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue = asyncio.Queue()
        self.job = Job(prepared.prompt, prepared.sampling, self._sink)
        self._parser = (ToolCallParser(id_prefix, prepared.tool_types) if prepared.parse_tools
                        else None)
        self._splitter = (ThinkSplitter(inside=prepared.thinking_open)
                          if prepared.split_thinking else None)
        self.thinking: list[str] = []  # the reasoning pieces received (`Thinking` items)
        self.finish: FinishEvent | None = None
        self.tool_calls: list[ToolCall] = []
        self.logprobs: list[TokenLogprob] = []  # every entry received, in token order
        self._n_taken = 0
        self._ended = False  # a one-call answer's call is in: the rest is dropped
        if submit:  # else the caller submits `job` (with others: `Choices`)
            worker.submit(self.job)

    def _sink(self, event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the event loop closed: the server is going down
            self.job.cancel()

    def cancel(self) -> None:
        self.job.cancel()

    def take_logprobs(self) -> list[TokenLogprob]:
        """The log-probability entries received since the last call."""
        out = self.logprobs[self._n_taken:]
        self._n_taken = len(self.logprobs)
        return out

    def _parsed(self, pieces: list) -> list[str | ToolCall]:
        out = []
        for p in pieces:
            if self._ended or (isinstance(p, str) and not p):
                continue
            if isinstance(p, ToolCall):
                self.tool_calls.append(p)
                if self.prepared.one_call:
                    self._ended = True
                    self.job.end()  # the worker stops it at its next step, as a stop
            out.append(p)
        return out

    def _split(self, pieces: list) -> list[str | ToolCall | Thinking]:
        """Reasoning apart (kept in `thinking`), the content through the tool-call parser."""
        out: list[str | ToolCall | Thinking] = []
        for p in pieces:
            if self._ended:
                break
            if isinstance(p, Thinking):
                self.thinking.append(p.text)
                out.append(p)
            else:
                out += self._content(p)
        return out

    def _content(self, text: str) -> list[str | ToolCall]:
        """Answer text through the tool-call parser, where calls are parsed."""
        return self._parsed([text] if self._parser is None else self._parser.feed(text))

    def _text(self, text: str) -> list[str | ToolCall | Thinking]:
        if self._splitter is not None:
            return self._split(self._splitter.feed(text))
        return self._content(text)

    async def items(self, *, prompt: bool = False
                    ) -> AsyncIterator[str | ToolCall | Thinking | PromptEvent]:
        """Text pieces, tool calls and (a thinking model's, where split) `Thinking` pieces until
        the job ends; `finish` is set afterwards. `prompt`: also the `PromptEvent` that says
        the prompt has run (and how much of it was reused), before any text (none where the job
        ended first)."""
        if self._parser is not None and self.prepared.forced_prefix:
            for item in self._parsed(self._parser.feed(self.prepared.forced_prefix)):
                yield item
        while True:
            event = await self._events.get()
            if isinstance(event, PromptEvent):
                if prompt:
                    yield event
                continue
            if isinstance(event, TextEvent):
                self.logprobs.extend(event.logprobs)
                for item in self._text(event.text):
                    yield item
                continue
            self.finish = event
            if self._splitter is not None:
                for item in self._split(self._splitter.finish()):
                    yield item
            if self._parser is not None:
                for item in self._parsed(self._parser.finish()):
                    yield item
            return

    async def collect(self) -> tuple[str, list[ToolCall]]:
        """All text (joined) and all tool calls, for a non-streaming response (the reasoning,
        where split, is `reasoning` after)."""
        text = []
        async for item in self.items():
            if isinstance(item, str):
                text.append(item)
        return "".join(text), list(self.tool_calls)

    @property
    def reasoning(self) -> str | None:
        """The reasoning received, joined; None where the answer had none (or it is not split)."""
        return "".join(self.thinking) if self.thinking else None
