"""`POST /infill`: llama.cpp's server route for editors' code completion (llama.vscode,
llama.vim), over the model's fill-in-the-middle tokens.

The body: `input_prefix` and `input_suffix` (the code before and after the cursor),
`input_extra` (other files, `[{"filename", "text"}]`, put before them in the repository form
where the vocabulary has it: `FimTokens.infill`), `prompt` (text the answer continues, after the
middle tag), and llama.cpp's sampling fields with its defaults (temperature 0.8, top_k 40,
top_p 0.95, min_p 0.05; `n_predict` -1: as much as fits; `seed` -1: drawn). A prompt longer than
the context is cut (other files first, then the prefix's start and the suffix's end) and the
answer says `truncated`, as llama.cpp cuts it for an editor that sends whole files.
`n_indent` ends the answer at a line (after its first) indented less than so many spaces or
tabs, that line left out; `t_max_predict_ms` ends it once so many milliseconds of generation
have passed and it holds a newline: both as llama.cpp's server does, `stop_type` "limit".
`n_probs` (at most 20) adds llama.cpp's `completion_probabilities`: each generated token's
log-probability under the model and the `n_probs` most likely tokens at its position (a streamed
event carries those of the tokens generated since the one before); a line `n_indent` leaves out
keeps the entries of its tokens generated before the answer ended there. Probabilities
after the sampler chain (`post_sampling_probs`) are a 400.
`cache_prompt` (the prefix cache is always on unless the server says `--no-prefix-cache`),
`id_slot`, `response_fields` (every field is returned), `t_max_prompt_ms` and the `samplers`
order (a list of llama.cpp's sampler names; the order here is fixed) are checked and not acted
on. The answer is llama.cpp's: `content`, `stop`, `stop_type`, `tokens_predicted`,
`tokens_evaluated`, `tokens_cached`, `truncated`, `timings`; streamed as `data:` events, the
last with `stop` true and the counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from strata.serve.errors import ApiError, bad_request
from strata.serve.fields import Fields, join
from strata.serve.generation import Generation, Prepared, fit_max_tokens
from strata.serve.job import MAX_TOP_LOGPROBS, PromptEvent, Sampling
from strata.serve.logprobs import llama_probs
from strata.serve.openai_request import parse_stop
from strata.serve.sse import event_stream, sse, unless_disconnected
from strata.serve.state import ServerState

SAMPLERS = frozenset({"dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature",
                      "penalties", "infill", "top_n_sigma"})
MAX_FILES = 256


@dataclass(frozen=True, slots=True)
class InfillRequest:
    prefix: str
    suffix: str
    files: tuple[tuple[str, str], ...]  # (filename, text)
    middle: str  # `prompt`: after the middle tag
    n_predict: int | None  # None: as much as fits
    sampling: dict  # `Sampling` keywords but max_tokens
    stream: bool
    n_indent: int
    t_max_predict_ms: int


def parse_infill(f: Fields) -> InfillRequest:
    files = []
    extra = f.list("input_extra") or []
    if len(extra) > MAX_FILES:
        raise bad_request(f"input_extra: at most {MAX_FILES} files, got {len(extra)}",
                          "input_extra")
    for i, item in enumerate(extra):
        chunk = Fields(item, join("input_extra", i))
        files.append((chunk.str("filename", default=""), chunk.str("text", required=True)))
    samplers = f.list("samplers") or []
    for i, name in enumerate(samplers):
        if name not in SAMPLERS:
            raise bad_request(f"samplers[{i}]: {name!r} is not one of llama.cpp's samplers "
                              f"({', '.join(sorted(SAMPLERS))})", f"samplers[{i}]")
    n_probs = f.int("n_probs", default=0, minimum=0, maximum=MAX_TOP_LOGPROBS)
    if f.bool("post_sampling_probs"):
        raise bad_request("post_sampling_probs: probabilities after the sampler chain are not "
                          "returned; leave it false for the model's (`logprob`)",
                          "post_sampling_probs")
    f.bool("cache_prompt", default=True)
    f.int("id_slot", minimum=-1)
    f.int("t_max_prompt_ms", minimum=-1)
    f.list("response_fields")
    n_predict = f.int("n_predict", default=-1, minimum=-2)
    seed = f.int("seed", default=-1, minimum=-1, maximum=(1 << 64) - 1)
    temperature = f.number("temperature", default=0.8, minimum=0.0, maximum=10.0)
    top_p = f.number("top_p", default=0.95, minimum=0.0, maximum=1.0)
    if top_p == 0.0:  # nothing kept but the best: greedy, as /v1/completions reads it
        temperature, top_p = 0.0, 1.0
    return InfillRequest(
        prefix=f.str("input_prefix", default=""), suffix=f.str("input_suffix", default=""),
        files=tuple(files), middle=f.str("prompt", default=""),
        n_predict=n_predict if n_predict > 0 else None,
        sampling={"temperature": temperature,
                  "top_k": f.int("top_k", default=40, minimum=0, maximum=1 << 20),
                  "top_p": top_p,
                  "min_p": f.number("min_p", default=0.05, minimum=0.0, maximum=1.0),
                  "repeat_penalty": f.number("repeat_penalty", default=1.0, minimum=1e-6,
                                             maximum=10.0),
                  "repeat_last_n": f.int("repeat_last_n", default=64, minimum=0,
                                         maximum=1 << 20),
                  "seed": None if seed == -1 else seed, "stop": parse_stop(f, "stop"),
                  "logprobs": n_probs or None},
        stream=f.bool("stream"), n_indent=f.int("n_indent", default=0, minimum=0),
        t_max_predict_ms=max(0, f.int("t_max_predict_ms", default=0, minimum=-1)))


class LineLimits:
    """`n_indent` and `t_max_predict_ms` over the answer's text as it comes: `feed` returns
    the text that may go out (a line after the first is held until its indentation shows) and
    whether the answer ends there."""

    def __init__(self, n_indent: int, t_max_ms: int):
        self.n_indent, self.t_max_ms = n_indent, t_max_ms
        self.t0 = time.perf_counter()
        self._held = ""  # from the last newline on, while its line shows no indentation yet
        self.has_new_line = False

    def feed(self, text: str) -> tuple[str, bool]:
        out, end = "", False
        if self.n_indent <= 0:
            out = text
            self.has_new_line = self.has_new_line or "\n" in text
        else:
            for ch in text:
                if not self._held and ch != "\n":
                    out += ch
                    continue
                self._held += ch
                self.has_new_line = True
                before, line = self._held.rsplit("\n", 1)
                if line.strip(" \t"):  # its first character that is not indentation
                    if len(line) - len(line.lstrip(" \t")) < self.n_indent:
                        self._held = ""
                        return out + before, True  # the line left out, with its newline
                    out, self._held = out + self._held, ""
        late = (time.perf_counter() - self.t0) * 1e3 > self.t_max_ms
        if self.t_max_ms > 0 and self.has_new_line and late:
            end = True
        return out, end

    def rest(self) -> str:
        """What is still held when the answer ends by itself."""
        held, self._held = self._held, ""
        return held


async def infill(request: Request, state: ServerState, body: dict) -> Response:
    req = parse_infill(Fields(body))
    model = state.model
    # the room the answer is given before the prompt is cut to fit: what it asks, or (-1: as
    # much as fits) a quarter of the context, at most 256 tokens
    want = req.n_predict or min(256, max(1, model.max_context // 4))
    prompt, truncated = await run_in_threadpool(
        model.encode_infill, req.prefix, req.suffix, list(req.files), req.middle,
        model.max_context - want)
    max_tokens = fit_max_tokens(len(prompt), req.n_predict, max_context=model.max_context,
                                limit=state.max_tokens_limit, param="input_prefix")
    prepared = Prepared(prompt=tuple(prompt), sampling=Sampling(max_tokens=max_tokens,
                                                                **req.sampling),
                        requested_max_tokens=req.n_predict)
    gen = Generation(state.worker, prepared)
    limits = LineLimits(req.n_indent, req.t_max_predict_ms)
    t = {"start": time.perf_counter(), "prompt": None}
    ended = {"limit": False}

    async def pieces() -> AsyncIterator[str]:
        async for item in gen.items(prompt=True):
            if isinstance(item, PromptEvent):
                t["prompt"] = limits.t0 = time.perf_counter()
                continue
            if ended["limit"] or not isinstance(item, str):
                continue
            text, end = limits.feed(item)
            if text:
                yield text
            if end:
                ended["limit"] = True
                gen.job.end()  # the worker stops it at its next step, as a stop
        if not ended["limit"] and (rest := limits.rest()):
            yield rest

    def final(content: str) -> dict[str, Any]:
        f = gen.finish
        now = time.perf_counter()
        t_prompt = t["prompt"] or now
        prompt_ms, predicted_ms = (t_prompt - t["start"]) * 1e3, (now - t_prompt) * 1e3
        n_new = f.n_prompt - f.n_cached
        stop_type = ("limit" if ended["limit"] or f.reason == "length" else
                     "word" if f.stop_sequence is not None else "eos")
        return {"index": 0, "content": content, "id_slot": 0, "stop": True,
                "model": model.name, "tokens_predicted": f.n_completion,
                "tokens_evaluated": f.n_prompt, "tokens_cached": f.n_cached,
                "truncated": truncated, "stop_type": stop_type,
                "stopping_word": f.stop_sequence or "", "has_new_line": limits.has_new_line,
                "timings": {"prompt_n": n_new, "prompt_ms": prompt_ms,
                            "prompt_per_token_ms": prompt_ms / max(n_new, 1),
                            "prompt_per_second": n_new / max(prompt_ms, 1e-9) * 1e3,
                            "predicted_n": f.n_completion, "predicted_ms": predicted_ms,
                            "predicted_per_token_ms": predicted_ms / max(f.n_completion, 1),
                            "predicted_per_second":
                                f.n_completion / max(predicted_ms, 1e-9) * 1e3}}

    def with_probs(fields: dict[str, Any]) -> dict[str, Any]:
        """The entries since the last event (all of them, unstreamed), where asked for."""
        if prepared.sampling.logprobs is not None:
            fields["completion_probabilities"] = llama_probs(model, gen.take_logprobs())
        return fields

    if req.stream:
        async def chunks() -> AsyncIterator[bytes]:
            async for text in pieces():
                yield sse(with_probs({"index": 0, "content": text, "stop": False,
                                      "id_slot": 0}))
            if gen.finish.reason == "error":
                yield sse({"error": {"code": 500, "type": "server_error",
                                     "message": f"generation failed: {gen.finish.error}"}})
                return
            yield sse(with_probs(final("")))
        return event_stream(chunks(), gen.cancel, prepared.headers)

    async def collect() -> str:
        return "".join([text async for text in pieces()])

    content = await unless_disconnected(request, collect(), gen.cancel)
    if gen.finish.reason == "error":
        raise ApiError(500, f"generation failed: {gen.finish.error}")
    return JSONResponse(with_probs(final(content)), headers=prepared.headers)
