"""`Worker`: the one thread that drives the engine. HTTP handlers never touch it directly.

Jobs wait in a FIFO queue. Whenever a slot is free the next job is admitted (its prompt is
prefilled); then every running sequence advances one token in one batched `decode` call.
Where the engine picks tokens itself (`decode_picked`, the CUDA batch engine), each sequence whose
settings it draws as the host `Sampler` would (`picks`) gets its token from the step instead of
logits: nothing is sampled for it on the host, and one token crosses the bus; the others' logits
come back for the host to sample.
Cancelled jobs are dropped before each step, so a client that goes away frees its slot within
one decode step, a job cancelled while queued is never prefilled, and one cancelled during its
prompt stops at the prompt's next chunk (`strata.engine.interrupt`).

Where every running sequence is picked on the device and none is at its budget's last token,
the next step is enqueued before this one's tokens are read (`begin_picked` fed on the device),
so the GPU computes while the host reads, samples stops and sends text. A sequence that ends at
a token (a stop, a cancel) simply has the step run ahead of it discarded: the tokens and text
are those of stepping one at a time.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from strata.engine.interrupt import PrefillInterrupted, interruptible
from strata.engine.sampler import SamplingParams, token_logprobs
from strata.serve.batch import BatchEngine
from strata.serve.errors import ApiError
from strata.serve.job import (FinishEvent, Job, PromptEvent, Sampling, TextEvent, TokenLogprob,
                              count_reasoning)
from strata.serve.metrics import Metrics
from strata.serve.stops import StopMatcher

log = logging.getLogger("strata.serve")
# seconds a client refused by a full queue is told to wait (Retry-After): a guess, since how
# soon a place frees depends on the answers ahead; clients back off further on their own
RETRY_AFTER_S = 1


def _dropped_in(reason: str, where: str) -> str | None:
    """Where a job the worker dropped was cancelled (for the metrics), None where its reader
    ended it (`Job.end`: a stop, not a cancel)."""
    return where if reason == "cancelled" else None


class TextStream(Protocol):
    """Token ids in, text out, never splitting a UTF-8 character."""

    def push(self, token: int) -> str: ...

    def flush(self) -> str: ...


class Decoding(Protocol):
    """What the worker needs from the model besides the engine."""

    stop_token_ids: frozenset[int]

    def sampler(self, sampling: Sampling) -> Callable[[np.ndarray], int]: ...

    def text_stream(self, after: int) -> TextStream:
        """A fresh decoder for text that follows token `after` (the prompt's last)."""
        ...


@dataclass(slots=True)
class _Seq:
    job: Job
    slot: int
    sample: Callable[[np.ndarray], int]
    text: TextStream
    stops: StopMatcher
    last_token: int = -1
    n_generated: int = 0
    done: bool = field(default=False)
    device: SamplingParams | None = None  # how the engine picks its tokens; None: the host
    tokens: list[int] = field(default_factory=list)  # generated, in order
    n_cached: int = 0  # prompt tokens the engine found in its KV
    logprobs: list[TokenLogprob] = field(default_factory=list)  # not yet sent with text
    # its reasoning block (`Sampling.reasoning_ids`): open now, and the tokens it holds so far
    # (as `count_reasoning` counts them: the tags included); a closed block never reopens
    thinking: bool = False
    n_thought: int = 0


def _count_thought(seq: _Seq, token: int) -> None:
    """Follow `seq`'s reasoning block through its next token (`_Seq.thinking`)."""
    ids = seq.job.sampling.reasoning_ids
    if ids is None:
        return
    if seq.thinking:
        seq.n_thought += 1
        seq.thinking = token != ids[1]
    elif seq.n_generated == 0 and token == ids[0]:
        seq.thinking, seq.n_thought = True, 1  # the answer opened the block


def _budget_close(seq: _Seq) -> int | None:
    """The closing tag where `seq`'s next token is the last its reasoning budget allows and
    the block is still open (the tag is that token: the answer follows), else None. Where a
    constraint holds the tokens, only if it allows the tag there."""
    p = seq.job.sampling
    if p.reasoning_budget is None or p.reasoning_ids is None or not seq.thinking:
        return None
    if seq.n_thought + 1 < p.reasoning_budget:
        return None
    close = p.reasoning_ids[1]
    constraint = getattr(seq.sample, "constraint", None)
    return close if constraint is None or constraint.allows(close) else None


def _budget_near(seq: _Seq) -> bool:
    """Whether `seq`'s token after the next may be its budget's closing tag (or the next is):
    the step after this one must then be fed by the host, not run ahead on the device's pick.
    One token of margin for a block the next token may open."""
    p = seq.job.sampling
    return (p.reasoning_budget is not None and p.reasoning_ids is not None
            and (seq.thinking or seq.n_generated == 0)
            and seq.n_thought + 2 >= p.reasoning_budget)


class Worker:
    """Owns the engine; `submit()` is safe from any thread."""

    def __init__(self, engine: BatchEngine, decoding: Decoding, metrics: Metrics, *,
                 max_queue: int = 256, run_ahead: bool = True, prefix_cache: bool = True):
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        self.engine = engine
        self.decoding = decoding
        self.metrics = metrics
        self.max_queue = max_queue
        self._queue: deque[Job] = deque()
        self._cv = threading.Condition()
        self._free = list(range(engine.n_slots - 1, -1, -1))
        self._active: list[_Seq] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        # a step enqueued before the one before it was read (`begin_picked` without tokens):
        # (its engine step, its sequences); only where the engine begins and ends steps apart
        self.run_ahead = run_ahead and hasattr(engine, "begin_picked")
        self._ahead: tuple[tuple[str, object], list[_Seq]] | None = None
        # a finished sequence's tokens handed to the engine with its slot, so a prompt that
        # starts the same (a chat's next turn) is computed only past what they share
        self.prefix_cache = prefix_cache and getattr(engine, "keeps_prefix", False)
        # and a prompt shared with a running sequence (`n` choices) is copied, not computed:
        # an engine that does so is told not to where reuse is off
        self._prefill_kw = ({} if self.prefix_cache or not getattr(engine, "keeps_prefix", False)
                            else {"reuse": False})
        metrics.set_load(queue_depth=0, active=0, n_slots=engine.n_slots)

    # -- the HTTP side ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="strata-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Queue a job; a 503 when the queue is full or the worker is stopping."""
        self.submit_all([job])

    def submit_all(self, jobs: list[Job]) -> None:
        """Queue jobs together (a request's `n` choices), all or none: a 503 when the queue
        has no room for all of them or the worker is stopping, and nothing queued then (so
        nothing is cancelled or counted). More jobs than the queue holds are a ValueError:
        the caller refuses such a request first (`Choices`), since a retry could never fit."""
        for job in jobs:
            need = len(job.prompt) + job.sampling.max_tokens - 1  # the last is never decoded
            if need > self.engine.max_context:
                raise ValueError(f"job {job.id} needs {need} positions but the context holds "
                                 f"{self.engine.max_context}: clamp max_tokens before "
                                 f"submitting")
        if len(jobs) > self.max_queue:
            raise ValueError(f"{len(jobs)} jobs at once, but the queue holds {self.max_queue}")
        with self._cv:
            if self._stopping:
                raise ApiError(503, "the server is shutting down")
            if len(self._queue) + len(jobs) > self.max_queue:
                asked = f", {len(jobs)} more asked" if len(jobs) > 1 else ""
                raise ApiError(503, f"the request queue is full ({len(self._queue)} of "
                                    f"{self.max_queue} waiting{asked}); retry later",
                               headers={"retry-after": str(RETRY_AFTER_S)})
            self._queue.extend(jobs)
            self._publish_load()
            self._cv.notify()

    @property
    def alive(self) -> bool:
        """The engine thread is running (False before `start()` and after it died)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def n_active(self) -> int:
        return len(self._active)

    # -- the engine thread -----------------------------------------------------------------

    def _publish_load(self) -> None:
        self.metrics.set_load(queue_depth=len(self._queue), active=len(self._active),
                              n_slots=self.engine.n_slots)

    def _run(self) -> None:
        reason, error = "cancelled", None
        try:
            self._loop()
        except Exception as e:  # a bug outside any one job: no job may wait forever on it
            log.exception("the engine thread failed")
            reason, error = "error", f"the engine thread failed: {e}"
        with self._cv:
            self._stopping = True  # later submits get a 503, not a queue nobody reads
            queued, self._queue = list(self._queue), deque()
        for seq in list(self._active):
            self._finish(seq, reason, error=error,
                         cancelled_in="running" if reason == "cancelled" else None)
        for job in queued:
            self.metrics.record_finish(reason, 0,
                                       cancelled_in="queued" if reason == "cancelled" else None)
            job.emit(FinishEvent(reason, len(job.prompt), 0, error=error))

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not self._queue and not self._active:
                    self._cv.wait()
                if self._stopping:
                    return
            self._admit()
            self._drop_cancelled()
            if self._active:
                self._decode_step()
            self._publish_load()

    def _next_job(self) -> Job | None:
        with self._cv:
            return self._queue.popleft() if self._queue else None

    def _admit(self) -> None:
        while self._free:
            job = self._next_job()
            if job is None:
                return
            if job.cancelled:
                reason = job.end_reason
                self.metrics.record_finish(reason, 0, cancelled_in=_dropped_in(reason, "queued"))
                job.emit(FinishEvent(reason, len(job.prompt), 0))
                continue
            slot = self._free.pop()
            seq = _Seq(job=job, slot=slot, sample=self.decoding.sampler(job.sampling),
                       text=self.decoding.text_stream(job.prompt[-1]),
                       stops=StopMatcher(job.sampling.stop),
                       thinking=job.sampling.reasoning_open)
            if hasattr(seq.sample, "accept"):  # the penalties' window holds the prompt too,
                seq.sample.accept(job.prompt)  # as the engine's token history does
            # logprobs and a JSON constraint read the logits: the host samples such a sequence
            seq.device = (None if job.sampling.host_sampled
                          else self._device_sampling(seq.sample))
            self._active.append(seq)
            self._publish_load()
            t0 = time.perf_counter()
            try:
                with interruptible(lambda job=job: job.cancelled):
                    logits = self.engine.prefill(slot, job.prompt, **self._prefill_kw)
            except PrefillInterrupted:  # its client went away: the GPU is the next job's
                self._finish(seq, job.end_reason,
                             cancelled_in=_dropped_in(job.end_reason, "prefill"))
                continue
            except Exception as e:  # an engine failure ends this job, never the server
                log.exception("prefill failed for job %d", job.id)
                self._finish(seq, "error", error=f"prefill failed: {e}")
                continue
            seq.n_cached = int(getattr(self.engine, "n_reused", 0)) if self.prefix_cache else 0
            self.metrics.record_prefill(len(job.prompt), time.perf_counter() - t0,
                                        cached=seq.n_cached)
            job.emit(PromptEvent(len(job.prompt), seq.n_cached))
            self._accept(seq, logits)

    def _device_sampling(self, sampler) -> SamplingParams | None:
        """The settings the engine picks a sequence's tokens by, where it can draw them as the
        host `sampler` would (a sampled sequence gets a seed from the sampler's generator, so
        a request's own seed still fixes its tokens); None: the host samples."""
        params = getattr(sampler, "params", None)
        picks = getattr(self.engine, "picks", None)
        if (params is None or picks is None or not hasattr(self.engine, "decode_picked")
                or not picks(params)):
            return None
        if params.seed is None and not params.greedy:
            params = dataclasses.replace(params, seed=int(sampler.rng.integers(1 << 62)))
        return params

    def _drop_cancelled(self) -> None:
        for seq in list(self._active):
            if seq.job.cancelled:
                reason = seq.job.end_reason
                self._finish(seq, reason, cancelled_in=_dropped_in(reason, "running"))

    def _decode_step(self) -> None:
        ahead, self._ahead = self._ahead, None
        batch = ahead[1] if ahead is not None else list(self._active)
        t0 = time.perf_counter()
        try:
            step = ahead[0] if ahead is not None else self._begin(batch)
            if self._may_run_ahead(batch):  # the GPU runs the next step while this one is read
                self._ahead = (("picked", self.engine.begin_picked(
                    [s.slot for s in batch], None, [s.device for s in batch])), batch)
            out = self._end(step)
        except Exception as e:
            log.exception("decode step failed for %d sequences", len(batch))
            for seq in batch:
                self._finish(seq, "error", error=f"decode failed: {e}")
            self._ahead = None
            if hasattr(self.engine, "drop_picked"):
                self.engine.drop_picked()
            return
        # the sequences still running: one may have ended while a step run ahead of it ran
        # (a cancel, or a stop at the step before), and that step's token for it is dropped
        live = [(s, o) for s, o in zip(batch, out) if not s.done]
        n_device = sum(s.device is not None and not isinstance(o, np.ndarray) for s, o in live)
        self.metrics.record_decode(len(live), time.perf_counter() - t0, n_device_picked=n_device)
        for seq, item in live:
            if seq.job.cancelled:
                seq.job.n_steps_after_cancel += 1
            # logits where the engine hands a sequence's choice back (a cut past its reach)
            self._accept(seq, item, picked=not isinstance(item, np.ndarray))

    def _begin(self, batch: list[_Seq]) -> tuple[str, object]:
        """Start a step of `batch` fed the tokens the host holds (what `_end` reads). The
        engine picks the tokens it can; the host samples the others from their logits."""
        slots, tokens = [s.slot for s in batch], [s.last_token for s in batch]
        if not any(s.device is not None for s in batch):
            return "logits", self.engine.decode(slots, tokens)
        sampling = [s.device for s in batch]
        if self.run_ahead:
            return "picked", self.engine.begin_picked(slots, tokens, sampling)
        return "done", self.engine.decode_picked(slots, tokens, sampling)

    def _end(self, step: tuple[str, object]) -> list:
        """A step's results: each sequence's token (picked) or logits, in its batch's order."""
        kind, value = step
        return self.engine.end_picked(value) if kind == "picked" else list(value)

    def _may_run_ahead(self, batch: list[_Seq]) -> bool:
        """Whether the step after this one may be enqueued now, fed this step's picks on the
        device: every sequence picked on the device (none whose token the engine may hand
        back to the host), none cancelled, and each one's budget
        past the token this step picks (so no step feeds a token past it: its positions are
        what `submit` reserved)."""
        falls_back = getattr(self.engine, "may_fall_back", None)
        return self.run_ahead and bool(batch) and all(
            s.device is not None and not s.done and not s.job.cancelled
            and not (falls_back is not None and falls_back(s.device))
            and s.n_generated + 1 < s.job.sampling.max_tokens
            and not _budget_near(s) for s in batch)

    def _accept(self, seq: _Seq, item, *, picked: bool = False) -> None:
        """Take the next token of `seq` (`item`: its logits to sample, or with `picked` the
        token the engine chose) and send what it decides. A failure here (sampling, decoding
        text) ends that sequence with an error; the others and the thread go on."""
        try:
            close = _budget_close(seq)
            n_top = seq.job.sampling.logprobs
            if picked:
                token = int(item)
                if token < 0:  # the engine's sign that the step's logits held a NaN
                    raise ValueError("logits contain NaN: the engine produced invalid values")
                token = token if close is None else close  # fed to the next step by the host
                if hasattr(seq.sample, "accept"):  # its repeat window, should the host go on
                    seq.sample.accept([token])
                entry = None
            elif close is not None:  # the sampler's window and constraint take it as drawn
                token = close
                if hasattr(seq.sample, "accept"):
                    seq.sample.accept([token])
                if getattr(seq.sample, "constraint", None) is not None:
                    seq.sample.constraint.advance(token)
                entry = (None if n_top is None
                         else TokenLogprob(token, *token_logprobs(item, token, n_top)))
            else:
                token = int(seq.sample(item))
                entry = (None if n_top is None
                         else TokenLogprob(token, *token_logprobs(item, token, n_top)))
            _count_thought(seq, token)
            self._advance(seq, token, entry)
        except Exception as e:
            log.exception("sampling failed for job %d", seq.job.id)
            self._finish(seq, "error", error=f"sampling failed: {e}")

    def _advance(self, seq: _Seq, token: int, entry: TokenLogprob | None = None) -> None:
        """Take `token` (and its `entry` of log-probabilities, where the job asked for them):
        its text goes out once no stop string can start in it, each entry with the first text
        sent after it; a stop token's entry, and those of the tokens a stop string ends, are
        dropped with their text."""
        seq.n_generated += 1
        seq.tokens.append(token)
        if token in self.decoding.stop_token_ids:
            self._emit_text(seq, seq.text.flush())
            self._finish(seq, "stop")
            return
        if entry is not None:
            seq.logprobs.append(entry)
        piece, hit = seq.stops.feed(seq.text.push(token))
        if piece:
            self._send(seq, piece)
        if hit is not None:
            self._finish(seq, "stop", stop_sequence=hit)
        elif seq.n_generated >= seq.job.sampling.max_tokens:
            self._emit_text(seq, seq.text.flush())
            self._finish(seq, "length")
        else:
            seq.last_token = token

    def _emit_text(self, seq: _Seq, tail: str) -> None:
        """The text a decoder and the stop matcher held, at the end (and the log-probabilities
        still waiting, unless a stop string ended the text)."""
        piece, hit = seq.stops.feed(tail)
        piece += "" if hit is not None else seq.stops.flush()
        if piece or (seq.logprobs and hit is None):
            self._send(seq, piece)

    def _send(self, seq: _Seq, piece: str) -> None:
        seq.job.emit(TextEvent(piece, tuple(seq.logprobs)))
        seq.logprobs.clear()

    def _finish(self, seq: _Seq, reason: str, *, stop_sequence: str | None = None,
                error: str | None = None, cancelled_in: str | None = None) -> None:
        if seq.done:
            return
        seq.done = True
        self._active.remove(seq)
        try:
            if self.prefix_cache and reason != "error":  # an error's KV is not trusted
                self.engine.release(seq.slot, tokens=list(seq.job.prompt) + seq.tokens)
            else:
                self.engine.release(seq.slot)
        except Exception:
            log.exception("releasing slot %d failed", seq.slot)
        self._free.append(seq.slot)
        self.metrics.record_finish(reason, seq.n_generated, cancelled_in=cancelled_in)
        seq.job.emit(FinishEvent(reason, len(seq.job.prompt), seq.n_generated,
                                 stop_sequence=stop_sequence, error=error,
                                 n_cached=seq.n_cached,
                                 n_reasoning=count_reasoning(seq.tokens, seq.job.sampling)))
        self._publish_load()
