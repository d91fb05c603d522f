"""`Job`: one generation request as the engine worker sees it, and the events it sends back.

The HTTP side builds a Job (prompt tokens, `Sampling`, a thread-safe `sink`), queues it, and
reads `TextEvent`s and one final `FinishEvent` from the sink. Cancelling (a client that went
away) is a flag the worker reads between decode steps; it never blocks either side.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from strata.engine.json_schema import Node
from strata.engine.sampler import PENALTY_LAST_N
from strata.serve.tools import StrictCalls, StrictXmlCalls

FINISH_REASONS = ("stop", "length", "cancelled", "error")
MAX_TOP_LOGPROBS = 20  # the most alternatives a token's logprobs list (OpenAI's limit)

_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Sampling:
    """How to pick tokens and when to stop. `top_k=0`, `top_p=1` and the penalties 0 mean off;
    `temperature=0` is greedy; `stop` strings end the text before they appear. The penalties
    (OpenAI's presence and frequency, -2..2; llama.cpp's repeat, 1 = off) look at the sequence's
    last `repeat_last_n` tokens (PENALTY_LAST_N unless a request says)."""

    max_tokens: int
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
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), -100..100
    logprobs: int | None = None  # None: none; n: each token's log-probability and the n best
    json_object: bool = False  # the text is one JSON object (response_format json_object)
    json_schema: Node | None = None  # with json_object: the schema it follows (None: any)
    strict_calls: StrictCalls | StrictXmlCalls | None = None  # strict tools hold its calls
    # a thinking model's reasoning, counted into `FinishEvent.n_reasoning`: its (open, close)
    # tag token ids (None: not counted, e.g. tags of several tokens); `reasoning_open`: the
    # prompt opened the block, so the first token is already inside it
    reasoning_ids: tuple[int, int] | None = None
    reasoning_open: bool = False
    # at most this many reasoning tokens (Anthropic's thinking.budget_tokens): where the block
    # is still open at the last of them, the closing tag is that token (with reasoning_ids)
    reasoning_budget: int | None = None

    @property
    def host_sampled(self) -> bool:
        """Whether the host must pick this sequence's tokens: it reads their logits (logprobs)
        or constrains them (a JSON object, strict tool calls), which the device sampler does
        not."""
        return self.logprobs is not None or self.json_object or self.strict_calls is not None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0.0 < self.repeat_penalty <= 10.0:
            raise ValueError(f"repeat_penalty must be in (0, 10], got {self.repeat_penalty}")
        if self.reasoning_budget is not None and self.reasoning_budget < 1:
            raise ValueError(f"reasoning_budget must be at least 1, got {self.reasoning_budget}")
        if self.repeat_last_n < 0:
            raise ValueError(f"repeat_last_n must be >= 0, got {self.repeat_last_n}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}")
        if any(not -100.0 <= b <= 100.0 for _, b in self.logit_bias):
            raise ValueError("logit_bias values must be in [-100, 100]")
        if self.json_schema is not None and not self.json_object:
            raise ValueError("json_schema needs json_object")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability under the model, and the most likely tokens at
    its position with theirs (most likely first; as many as the request asked)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class TextEvent:
    """Newly decoded text (never splits a UTF-8 character, never holds part of a stop string).
    `logprobs`: where the job asked for them, one per token generated since the last event
    (text a token adds may come with a later event: a stop string is held back until it is
    ruled out); the tokens of a stop string that ends the text, and a stop token, have none."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class PromptEvent:
    """The prompt has run: its length and how many of its tokens were found in K/V, not
    computed (a finished request's, or a running one's prompt). Sent once, before the first
    text; a job that ends before its prompt runs sends none."""

    n_prompt: int
    n_cached: int = 0


@dataclass(frozen=True, slots=True)
class FinishEvent:
    """The job is over: why, the token counts, and the stop string that ended it, if one did."""

    reason: str
    n_prompt: int
    n_completion: int
    stop_sequence: str | None = None
    error: str | None = None
    n_cached: int = 0  # of n_prompt: tokens whose KV a finished request left (not computed)
    n_reasoning: int = 0  # of n_completion: a thinking model's reasoning (`count_reasoning`)

    def __post_init__(self) -> None:
        if self.reason not in FINISH_REASONS:
            raise ValueError(f"finish reason {self.reason!r} is not one of {FINISH_REASONS}")


Event = TextEvent | PromptEvent | FinishEvent


def count_reasoning(tokens: Sequence[int], sampling: Sampling) -> int:
    """How many of the generated `tokens` are reasoning (`Sampling.reasoning_ids`): those
    through the closing tag, or all of them where the block never closed; none where no block
    was open (neither the prompt nor the first token opened one)."""
    if sampling.reasoning_ids is None or not tokens:
        return 0
    open_id, close_id = sampling.reasoning_ids
    if not (sampling.reasoning_open or tokens[0] == open_id):
        return 0
    for i, t in enumerate(tokens):
        if t == close_id:
            return i + 1
    return len(tokens)


class Job:
    """A queued or running generation. `sink` is called from the worker thread with each event
    and must be thread-safe and non-blocking."""

    def __init__(self, prompt: Sequence[int], sampling: Sampling,
                 sink: Callable[[Event], None]):
        if not prompt:
            raise ValueError("a job needs at least one prompt token")
        self.id = next(_ids)
        self.prompt: tuple[int, ...] = tuple(int(t) for t in prompt)
        self.sampling = sampling
        self._sink = sink
        self._cancel = threading.Event()
        self.end_reason = "cancelled"  # what the worker finishes a job it drops with (`end`)
        self.t_submit = time.monotonic()
        self.n_steps_after_cancel = 0  # decode steps run while the flag was set (bound: <= 1)

    def cancel(self) -> None:
        """Ask the worker to stop this job: a queued job never runs, a running one is dropped
        before the next decode step."""
        self._cancel.set()

    def end(self) -> None:
        """Ask the worker to end this job as a stop ends it (finish reason "stop", not
        "cancelled"): its reader has all it wants (a one-call answer's call is complete)."""
        if not self._cancel.is_set():
            self.end_reason = "stop"
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def emit(self, event: Event) -> None:
        self._sink(event)
