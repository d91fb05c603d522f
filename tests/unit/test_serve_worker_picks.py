"""The worker with an engine that picks tokens itself (`picks` / `decode_picked`, as the CUDA
batch engine): which steps go to the device, what settings and seeds it gets, and that stops,
budgets and failures behave as on the host path."""

from __future__ import annotations

import numpy as np

from helpers.serve_fakes import FakeModel, ScriptedEngine, encode
from strata.engine.sampler import Sampler, SamplingParams
from strata.serve.job import Job, Sampling
from strata.serve.metrics import Metrics
from strata.serve.worker import Worker
from test_serve_worker import Sink


class PickingEngine(ScriptedEngine):
    """Picks the scripted token itself for settings it `picks` (any but top-k 7); records
    every step's kind and the settings it was given."""

    def __init__(self, script, **kw):
        super().__init__(script, **kw)
        self.steps: list[str] = []
        self.given: list[list[SamplingParams]] = []
        self.fail = False
        self.nan_slots: set[int] = set()  # slots whose logits "hold a NaN": -1

    @staticmethod
    def picks(params: SamplingParams) -> bool:
        return params.top_k != 7

    def decode(self, slots, tokens):
        self.steps.append("logits")
        return super().decode(slots, tokens)

    def decode_picked(self, slots, tokens, params):
        if self.fail:
            raise RuntimeError("scripted device failure")
        self.steps.append("picked")
        self.given.append(list(params))
        rows = super().decode(slots, tokens)
        return [r if p is None else -1 if s in self.nan_slots else int(np.argmax(r))
                for s, r, p in zip(slots, rows, params)]


class ScriptSampler(Sampler):
    """The host `Sampler` of the request's settings (its params and generator), whose own
    draws take the one-hot script's token (the prompt's first token, host steps)."""

    def __call__(self, logits):
        token = int(np.argmax(logits))
        self.accept([token])
        return token


class SamplingModel(FakeModel):
    def sampler(self, sampling: Sampling):
        return ScriptSampler(SamplingParams(temperature=sampling.temperature,
                                            top_k=sampling.top_k, top_p=sampling.top_p,
                                            min_p=0.0, seed=sampling.seed))


def run(engine, jobs, metrics=None, **worker_kw):
    """Each (prompt, Sampling) of `jobs` queued on a fresh worker, run until all finish; their
    sinks."""
    worker = Worker(engine, SamplingModel(), metrics or Metrics(), **worker_kw)
    sinks = []
    for prompt, sampling in jobs:
        sink = Sink()
        worker.submit(Job(encode(prompt), sampling, sink))
        sinks.append(sink)
    worker.start()
    try:
        for s in sinks:
            s.finish  # noqa: B018 - waits for the job
    finally:
        worker.stop()
    return sinks


def test_every_step_is_picked_on_the_device_where_the_engine_draws_the_settings():
    engine = PickingEngine(lambda p: "hello world", n_slots=2)
    sinks = run(engine, [("a", Sampling(max_tokens=50, temperature=0.0)),
                         ("b", Sampling(max_tokens=50, temperature=1.0, seed=42)),
                         ("c", Sampling(max_tokens=5, temperature=0.7, top_k=40, stop=("wor",)))])
    assert [s.text for s in sinks] == ["hello world", "hello world", "hello"]
    assert [s.finish.reason for s in sinks] == ["stop", "stop", "length"]
    assert sinks[0].finish.n_completion == len("hello world") + 1  # + the end token, picked
    assert engine.steps and set(engine.steps) == {"picked"}
    given = [p for step in engine.given for p in step]
    assert any(p.greedy for p in given)
    assert {p.seed for p in given if p.temperature == 1.0} == {42}  # the request's own seed
    drawn = [p for p in given if p.temperature == 0.7]
    assert drawn and drawn[0].seed is not None and len({p.seed for p in drawn}) == 1


def test_a_sequence_the_device_cannot_draw_gets_its_logits_in_the_same_step():
    """One request the engine cannot draw (top-k 7 here) beside one it can: each step picks the
    second's token on the device and hands back the first's logits, which the host samples;
    both answers come out whole."""
    engine, metrics = PickingEngine(lambda p: "xyz", n_slots=2), Metrics()
    sinks = run(engine, [("a", Sampling(max_tokens=50, temperature=0.0)),
                         ("b", Sampling(max_tokens=50, temperature=0.0, top_k=7))], metrics)
    assert [s.text for s in sinks] == ["xyz", "xyz"]
    assert engine.steps and set(engine.steps) == {"picked"}
    mixed = [g for g in engine.given if len(g) == 2]
    assert mixed and all(sum(p is None for p in g) == 1 for g in mixed)
    # each step's tokens counted by where they were chosen: "xyz" + the end token after the
    # prompt's first, for each request
    assert (metrics.device_picked, metrics.decode_tokens - metrics.device_picked) == (3, 3)


def test_a_failed_device_step_fails_its_jobs_with_the_reason():
    engine = PickingEngine(lambda p: "abc")
    engine.fail = True
    (sink,) = run(engine, [("a", Sampling(max_tokens=50, temperature=0.0))])
    assert sink.finish.reason == "error" and "scripted device failure" in sink.finish.error
    assert sink.text == "a"  # the first token, from the prompt's logits, is the host's


def test_an_engine_without_picks_keeps_the_host_path():
    engine = ScriptedEngine(lambda p: "ok")
    (sink,) = run(engine, [("a", Sampling(max_tokens=50, temperature=0.0))])
    assert sink.text == "ok" and sink.finish.reason == "stop"


def test_a_sequence_whose_logits_held_a_nan_ends_alone_with_the_reason():
    """-1 from `decode_picked` (the device saw a NaN in that row's logits): that request ends
    with an error naming it; the one beside it finishes normally."""
    engine = PickingEngine(lambda p: "abcdef", n_slots=2)
    engine.nan_slots = {1}  # the second admitted sequence's slot (slots are handed out 0, 1)
    sinks = run(engine, [("a", Sampling(max_tokens=50, temperature=0.0)),
                         ("b", Sampling(max_tokens=50, temperature=0.0))])
    done = {s.finish.reason: s for s in sinks}
    assert set(done) == {"stop", "error"}
    assert done["stop"].text == "abcdef" and "logits contain NaN" in done["error"].finish.error
