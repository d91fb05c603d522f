"""The engine worker: FIFO admission, batched decode, stop handling, cancellation."""

from __future__ import annotations

import threading
import time

import pytest

from helpers.serve_fakes import FakeModel, ScriptedEngine, encode
from strata.serve.errors import ApiError
from strata.serve.job import FinishEvent, Job, PromptEvent, Sampling, TextEvent
from strata.serve.metrics import Metrics
from strata.serve.worker import Worker


class Sink:
    def __init__(self):
        self.events = []
        self.done = threading.Event()

    def __call__(self, event):
        self.events.append(event)
        if isinstance(event, FinishEvent):
            self.done.set()

    @property
    def text(self) -> str:
        assert self.done.wait(10), "the job never finished"
        return "".join(e.text for e in self.events if isinstance(e, TextEvent))

    @property
    def finish(self) -> FinishEvent:
        assert self.done.wait(10), "the job never finished"
        return self.events[-1]


def make(script, *, n_slots=1, max_queue=256):
    engine = ScriptedEngine(script, n_slots=n_slots)
    metrics = Metrics()
    return engine, Worker(engine, FakeModel(), metrics, max_queue=max_queue), metrics


def job(prompt: str, max_tokens: int = 50, stop=()) -> tuple[Job, Sink]:
    sink = Sink()
    return Job(encode(prompt), Sampling(max_tokens=max_tokens, stop=tuple(stop)), sink), sink


def wait_until(cond, timeout=10.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "condition never became true"
        time.sleep(0.002)


def test_jobs_run_in_arrival_order_and_decode_together():
    engine, worker, metrics = make(lambda p: f"answer to {p}", n_slots=2)
    jobs = [job(f"q{i}") for i in range(3)]
    for j, _ in jobs:
        worker.submit(j)
    worker.start()
    try:
        for i, (_, sink) in enumerate(jobs):
            assert sink.text == f"answer to q{i}"
            assert sink.finish.reason == "stop"
            assert sink.finish.n_prompt == 2
            assert sink.finish.n_completion == len(f"answer to q{i}") + 1  # + the end token
            # the prompt's event first (Anthropic's message_start waits for it), once
            prompts = [e for e in sink.events if isinstance(e, PromptEvent)]
            assert sink.events[0] == prompts[0] == PromptEvent(2, 0) and len(prompts) == 1
    finally:
        worker.stop()
    assert engine.prefills == ["q0", "q1", "q2"]
    assert max(len(b) for b in engine.decode_batches) == 2  # two sequences share a step
    assert len(engine.released) == 3 and set(engine.released) == {0, 1}
    assert metrics.completion_tokens == sum(s.finish.n_completion for _, s in jobs)


def test_max_tokens_ends_with_length():
    engine, worker, _ = make(lambda p: "abcdefghij")
    j, sink = job("x", max_tokens=4)
    worker.submit(j)
    worker.start()
    try:
        assert sink.finish.reason == "length"
        assert sink.finish.n_completion == 4
        assert sink.text == "abcd"
    finally:
        worker.stop()


def test_stop_string_split_across_tokens_is_never_sent():
    engine, worker, _ = make(lambda p: "hello END world")
    j, sink = job("x", stop=["END"])
    worker.submit(j)
    worker.start()
    try:
        assert sink.finish.reason == "stop"
        assert sink.finish.stop_sequence == "END"
        assert sink.text == "hello "
        assert all("E" not in e.text for e in sink.events if isinstance(e, TextEvent))
    finally:
        worker.stop()


def test_job_cancelled_while_queued_never_runs():
    engine, worker, metrics = make(lambda p: "x" * 30)
    engine.gate = threading.Semaphore(0)
    first, first_sink = job("first")
    second, second_sink = job("second")
    worker.submit(first)
    worker.submit(second)
    worker.start()
    try:
        wait_until(lambda: engine.prefills == ["first"])
        second.cancel()
        for _ in range(40):
            engine.gate.release()
        assert first_sink.finish.reason == "stop"
        assert second_sink.finish.reason == "cancelled"
        assert second_sink.finish.n_completion == 0
        assert engine.prefills == ["first"]
        assert metrics.cancelled["queued"] == 1
    finally:
        worker.stop()


def test_cancelled_sequence_leaves_within_one_decode_step():
    engine, worker, metrics = make(lambda p: "y" * 100, n_slots=2)
    engine.gate = threading.Semaphore(2)
    doomed, doomed_sink = job("doomed", max_tokens=90)
    other, other_sink = job("other", max_tokens=20)
    worker.submit(doomed)
    worker.submit(other)
    worker.start()
    try:
        wait_until(lambda: len(engine.decode_batches) == 2)
        doomed.cancel()  # the worker is now blocked inside step 3
        for _ in range(40):
            engine.gate.release()
        assert doomed_sink.finish.reason == "cancelled"
        assert doomed.n_steps_after_cancel <= 1
        assert doomed_sink.finish.n_completion <= 4  # first token + at most 3 steps
        assert other_sink.finish.reason == "length"  # the other sequence carried on
        slot = engine.decode_batches[3:]
        assert all(len(b) == 1 for b in slot)  # the freed slot was not decoded again
        assert metrics.cancelled["running"] == 1
    finally:
        worker.stop()


def test_engine_failure_ends_that_job_only():
    engine, worker, _ = make(lambda p: "fine")
    engine.fail_prefill_on = "boom"
    bad, bad_sink = job("boom")
    good, good_sink = job("ok")
    worker.submit(bad)
    worker.submit(good)
    _only_that_job_fails(worker, bad_sink, good_sink, "scripted prefill failure")


def _only_that_job_fails(worker, bad_sink, good_sink, error):
    """Start the worker: the bad job ends with `error`, the good one answers, the thread lives."""
    worker.start()
    try:
        assert bad_sink.finish.reason == "error"
        assert error in bad_sink.finish.error
        assert good_sink.text == "fine"
        assert worker.alive
    finally:
        worker.stop()


def test_a_sampling_failure_ends_that_job_only():
    engine, worker, _ = make(lambda p: "fine")

    def sampler(sampling):  # the second job's draws fail, as NaN probabilities once did
        if sampling.seed == 7:
            def fail(logits):
                raise ValueError("probabilities contain NaN")
            return fail
        return lambda logits: int(logits.argmax())

    worker.decoding.sampler = sampler
    bad_sink, good_sink = Sink(), Sink()
    worker.submit(Job(encode("a"), Sampling(max_tokens=5, seed=7), bad_sink))
    worker.submit(Job(encode("b"), Sampling(max_tokens=5), good_sink))
    _only_that_job_fails(worker, bad_sink, good_sink, "probabilities contain NaN")
    assert engine.released == [0, 0]  # the failed job's slot went back


def test_a_failed_engine_thread_fails_every_job_and_refuses_new_ones():
    engine, worker, metrics = make(lambda p: "fine", n_slots=1)
    engine.gate = threading.Semaphore(0)
    first, first_sink = job("first")
    queued, queued_sink = job("queued")
    worker.submit(first)
    worker.submit(queued)

    def broken():
        raise RuntimeError("a bug between steps")

    worker.start()
    wait_until(lambda: engine.prefills == ["first"])
    worker._drop_cancelled = broken  # the next pass of the loop fails outside any job
    engine.gate.release()
    try:
        for sink in (first_sink, queued_sink):
            assert sink.finish.reason == "error"
            assert "a bug between steps" in sink.finish.error
        wait_until(lambda: not worker.alive)
        with pytest.raises(ApiError) as e:
            worker.submit(job("late")[0])
        assert e.value.status == 503
        assert metrics.finished["error"] == 2
    finally:
        worker.stop()


def test_full_queue_is_a_503():
    _, worker, _ = make(lambda p: "", max_queue=1)
    worker.submit(job("a")[0])
    with pytest.raises(ApiError) as e:
        worker.submit(job("b")[0])
    assert e.value.status == 503
    assert "queue is full" in e.value.message


def test_job_that_cannot_fit_is_refused_before_queueing():
    engine, worker, _ = make(lambda p: "")
    engine.max_context = 10
    with pytest.raises(ValueError, match="clamp max_tokens"):
        worker.submit(job("abcdef", max_tokens=8)[0])


def test_a_job_cancelled_during_its_prompt_stops_at_the_next_chunk():
    """A client that leaves while its long prompt is computed (Claude Code's Esc): the prompt
    stops at its next chunk (`strata.engine.interrupt`), the job ends "cancelled" with nothing
    generated, its slot and KV are dropped, and the job queued behind it runs at once."""
    engine, worker, metrics = make(lambda p: "ok")
    long_job, long_sink = job("LONG prompt of many chunks")
    next_job, next_sink = job("next")
    worker.submit(long_job)
    worker.submit(next_job)
    worker.start()
    try:
        assert engine.in_prompt.wait(10)
        long_job.cancel()
        engine.go_on.set()
        assert long_sink.finish.reason == "cancelled" and long_sink.finish.n_completion == 0
        assert next_sink.text == "ok" and next_sink.finish.reason == "stop"
    finally:
        worker.stop()
    assert engine.chunks_run == 1  # of 26: stopped at the first checkpoint
    assert engine.prefills == ["next"] and engine.released.count(0) == 2
    assert metrics.cancelled == {"prefill": 1}
    assert not [e for e in long_sink.events if isinstance(e, (TextEvent, PromptEvent))]


def test_a_prompt_not_cancelled_runs_every_chunk():
    engine, worker, metrics = make(lambda p: "fine")
    j, sink = job("LONG but wanted")
    engine.go_on.set()
    worker.submit(j)
    worker.start()
    try:
        assert sink.text == "fine" and sink.finish.reason == "stop"
    finally:
        worker.stop()
    assert engine.chunks_run == len("LONG but wanted") and not metrics.cancelled
