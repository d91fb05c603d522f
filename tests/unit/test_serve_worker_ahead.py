"""The worker running one step ahead (`begin_picked` fed on the device, as the CUDA batch
engine allows): the same texts and finishes as stepping one at a time, no step fed past a
request's reserved positions, steps run ahead only while every sequence is picked on the device,
and a failed step ends its requests and leaves the engine usable."""

from __future__ import annotations

import pytest

from helpers.serve_fakes import encode
from strata.engine.engine import ContextFullError
from strata.engine.sampler import SamplingParams
from strata.serve.job import Sampling
from strata.serve.metrics import Metrics
from strata.serve.worker import Worker
from test_serve_worker_picks import PickingEngine, SamplingModel
from test_serve_worker_picks import run as run_jobs


class AheadEngine(PickingEngine):
    """`PickingEngine` with the CUDA batch engine's split step: `begin_picked` (tokens None:
    fed the last step's picks, allowed only after a step of the same slots, every one picked,
    nothing prefilled or released since), `end_picked` in order, at most two open,
    `drop_picked`. Positions fed per slot are counted against `max_context` as the engine's
    KV would be."""

    def __init__(self, script, **kw):
        super().__init__(script, **kw)
        self.open: list[tuple[object, list]] = []
        self.chain: list[int] | None = None
        self.positions: dict[int, int] = {}
        self.fed_on_device = 0
        self.fail_end_after: int | None = None  # steps ended before end_picked raises
        self.n_ended = 0
        self.dropped = 0

    def prefill(self, slot, tokens):
        self.chain = None
        self.positions[slot] = len(tokens)
        return super().prefill(slot, tokens)

    def release(self, slot):
        self.chain = None
        super().release(slot)

    def decode(self, slots, tokens):
        self.chain = None
        return super().decode(slots, tokens)

    def begin_picked(self, slots, tokens, params):
        if len(self.open) == 2:
            raise RuntimeError("two picked steps are open")
        if tokens is None:
            if self.chain != list(slots):
                raise ValueError(f"fed on the device after {self.chain}, got {list(slots)}")
            self.fed_on_device += 1
        for s in slots:
            self.positions[s] += 1
            if self.positions[s] > self.max_context:
                raise ContextFullError(f"slot {s}: past the context")
        out = self.decode_picked(slots, [0] * len(slots) if tokens is None else tokens, params)
        self.chain = list(slots) if all(p is not None for p in params) else None
        handle = object()
        self.open.append((handle, out))
        return handle

    def end_picked(self, handle):
        assert self.open and self.open[0][0] is handle, "steps end in the order begun"
        _, out = self.open.pop(0)
        if self.fail_end_after is not None and self.n_ended >= self.fail_end_after:
            raise RuntimeError("scripted failure reading a step")
        self.n_ended += 1
        return out

    def drop_picked(self):
        self.open.clear()
        self.chain = None
        self.dropped += 1


def run(engine, jobs, **worker_kw):
    """(text, finish reason, completion tokens) of each job, run on a fresh worker."""
    return [(s.text, s.finish.reason, s.finish.n_completion)
            for s in run_jobs(engine, jobs, **worker_kw)]


JOBS = [("a", Sampling(max_tokens=50, temperature=0.0)),                   # ends at its stop
        ("bb", Sampling(max_tokens=4, temperature=0.0)),                   # ends at its budget
        ("c", Sampling(max_tokens=50, temperature=1.0, seed=3, stop=("lo w",))),
        ("d", Sampling(max_tokens=50, temperature=0.0, top_k=7))]          # the host samples


def test_the_same_answers_one_step_ahead_as_step_by_step():
    script = {"a": "hello world", "bb": "abcdefgh", "c": "hello world", "d": "xy"}
    want = run(AheadEngine(lambda p: script[p], n_slots=2), JOBS, run_ahead=False)
    engine = AheadEngine(lambda p: script[p], n_slots=2)
    got = run(engine, JOBS)
    assert got == want
    assert [r for _, r, _ in got] == ["stop", "length", "stop", "stop"]
    assert engine.fed_on_device > 0  # steps really ran ahead
    assert not engine.open and engine.dropped == 0


def test_no_step_feeds_a_position_the_request_did_not_reserve():
    """The context holds exactly prompt + max_tokens - 1 positions (what `submit` checks): a
    step run ahead of the budget's last token would need one more, and the engine refuses it."""
    engine = AheadEngine(lambda p: "abcdefghijkl", max_context=1 + 6 - 1)
    ((text, reason, n),) = run(engine, [("a", Sampling(max_tokens=6, temperature=0.0))])
    assert (text, reason, n) == ("abcdef", "length", 6)
    assert engine.fed_on_device > 0 and max(engine.positions.values()) <= engine.max_context


def test_a_sequence_sampled_on_the_host_stops_the_run_ahead():
    engine = AheadEngine(lambda p: "xyzxyz", n_slots=1)
    ((text, reason, _),) = run(engine, [("d", Sampling(max_tokens=50, temperature=0.0, top_k=7))])
    assert (text, reason) == ("xyzxyz", "stop")
    assert engine.fed_on_device == 0


@pytest.mark.parametrize("fail_after", [0, 2])
def test_a_failed_step_ends_its_requests_and_the_engine_goes_on(fail_after):
    engine = AheadEngine(lambda p: "abcdefgh", n_slots=1)
    engine.fail_end_after = fail_after
    ((text, reason, _),) = run(engine, [("a", Sampling(max_tokens=50, temperature=0.0))])
    assert reason == "error" and len(text) == 1 + fail_after
    assert engine.dropped == 1 and not engine.open
    engine.fail_end_after = None
    ((text, reason, _),) = run(engine, [("a", Sampling(max_tokens=50, temperature=0.0))])
    assert (text, reason) == ("abcdefgh", "stop")


def test_the_fake_refuses_what_the_cuda_engine_refuses():
    """The stand-in holds the engine's contract (its checks are what the tests above lean on;
    the CUDA engine's own are tests/unit/test_serve_batch_cuda_sim.py's)."""
    engine = AheadEngine(lambda p: "ab", n_slots=2)
    engine.prefill(0, encode("a"))
    p = [SamplingParams(temperature=0.0)]
    with pytest.raises(ValueError, match="fed on the device"):
        engine.begin_picked([0], None, p)
    first = engine.begin_picked([0], [1], p)
    second = engine.begin_picked([0], None, p)
    with pytest.raises(RuntimeError, match="two picked steps"):
        engine.begin_picked([0], None, p)
    with pytest.raises(AssertionError, match="order begun"):
        engine.end_picked(second)
    assert engine.end_picked(first) == [ord("b")]
    engine.release(0)
    with pytest.raises(ValueError, match="fed on the device"):
        engine.begin_picked([0], None, p)


def test_a_token_the_engine_hands_back_is_sampled_on_the_host_and_never_run_ahead():
    """Settings the engine may hand back (`may_fall_back`: a top-p cut over every token, past
    its candidates): the rows it hands back come as logits, which the host samples; no step is
    run ahead of such a sequence, and only the tokens the device chose count as its."""

    class FallingBack(AheadEngine):
        may_fall_back = staticmethod(lambda p: p.top_k == 0 and p.top_p < 1.0)

        def decode_picked(self, slots, tokens, params):
            out = super().decode_picked(slots, tokens, params)
            return [self._logits(s) if p is not None and self.may_fall_back(p) and
                    self._pos[s] % 2 else o for s, o, p in zip(slots, out, params)]

    engine, metrics = FallingBack(lambda p: "abcdef", n_slots=2), Metrics()
    sinks = run_jobs(engine, [("a", Sampling(max_tokens=50, temperature=0.8, top_p=0.9, seed=1)),
                              ("b", Sampling(max_tokens=50, temperature=0.0))], metrics)
    assert [s.text for s in sinks] == ["abcdef", "abcdef"]
    assert engine.fed_on_device == 0  # the top-p sequence ran beside the greedy one throughout
    handed = 3  # of the top-p sequence's 6 decode steps (after "a"), every other one
    assert metrics.decode_tokens - metrics.device_picked == handed


def test_a_finished_requests_tokens_go_back_with_its_slot():
    """With an engine that keeps a released row's KV (`keeps_prefix`), the worker hands back
    what each finished request fed (its prompt, then its tokens), not after an error, and the
    prompt tokens the engine reused count in the metrics."""

    class Keeping(AheadEngine):
        keeps_prefix = True

        def __init__(self, script, **kw):
            super().__init__(script, **kw)
            self.kept: list[tuple[int, list[int] | None]] = []
            self.n_reused = 0
            self.reuse: list[bool] = []  # each prefill's `reuse`

        def release(self, slot, tokens=None):
            self.kept.append((slot, tokens))
            super().release(slot)

        def prefill(self, slot, tokens, reuse=True):
            self.reuse.append(reuse)
            self.n_reused = 2 if len(tokens) > 2 and reuse else 0
            return super().prefill(slot, tokens)

    engine, metrics = Keeping(lambda p: "xy"), Metrics()
    greedy = Sampling(max_tokens=50, temperature=0.0)
    sinks = run_jobs(engine, [("ab", greedy), ("abxy?", greedy)], metrics)
    assert [s.text for s in sinks] == ["xy", "xy"]
    eot = next(iter(SamplingModel().stop_token_ids))
    assert engine.kept[0] == (0, encode("ab") + encode("xy") + [eot])
    assert metrics.prompt_cached_tokens == 2 and "strata_prompt_cached_tokens_total 2" in \
        metrics.render()
    assert [s.finish.n_cached for s in sinks] == [0, 2]  # what the request's usage reports
    engine.fail_end_after = 0  # a failed step: its KV is not handed back
    (sink,) = run_jobs(engine, [("ab", greedy)], metrics)
    assert sink.finish.reason == "error"
    assert engine.kept[-1] == (0, None)
    off = Worker(engine, SamplingModel(), Metrics(), prefix_cache=False)
    assert not off.prefix_cache
    assert engine.reuse == [True] * 3  # on: the engine takes what K/V it holds
    # off: the engine is told to compute every prompt whole (nor copy a running one's), and
    # is handed no tokens to keep
    (sink,) = run_jobs(engine, [("abxy?", greedy)], prefix_cache=False)
    assert engine.reuse[-1] is False and engine.kept[-1] == (0, None)
    assert sink.finish.n_cached == 0


class FeedRecording(AheadEngine):
    """AheadEngine recording each token the host fed (None: fed on the device)."""

    def __init__(self, script, **kw):
        super().__init__(script, **kw)
        self.fed: list[int | None] = []

    def begin_picked(self, slots, tokens, params):
        self.fed.extend([None] * len(slots) if tokens is None else list(tokens))
        self.beginning = True
        try:
            return super().begin_picked(slots, tokens, params)
        finally:
            self.beginning = False

    def decode_picked(self, slots, tokens, params):
        if not getattr(self, "beginning", False):
            self.fed.extend(tokens)
        return super().decode_picked(slots, tokens, params)

    def decode(self, slots, tokens):
        self.fed.extend(tokens)
        return super().decode(slots, tokens)


@pytest.mark.parametrize("top_k, run_ahead", [(0, True), (0, False), (7, True)])
def test_a_reasoning_budget_closes_the_block_at_its_last_token(top_k, run_ahead):
    """`Sampling.reasoning_budget` (Anthropic's thinking.budget_tokens): the block's tokens
    ('<' opens, '>' closes: the character vocabulary's stand-ins for Qwen3's one-token tags)
    stop at the budget, whose last is the closing tag whatever the model would have said
    there, picked on the device (the host feeds the tag: no step runs ahead across it) or
    sampled on the host alike; the answer follows, and the reasoning counted is the budget."""
    engine = FeedRecording(lambda p: "<abcdefgh>answer", n_slots=1)
    sampling = Sampling(max_tokens=50, temperature=0.0, top_k=top_k,
                        reasoning_ids=(ord("<"), ord(">")), reasoning_budget=5)
    (sink,) = run_jobs(engine, [("q", sampling)], run_ahead=run_ahead)
    # the script goes on from where it was (the fake ignores what it is fed)
    assert sink.text == "<abc>efgh>answer" and sink.finish.reason == "stop"
    assert sink.finish.n_reasoning == 5
    assert engine.fed[4] == ord(">")  # the tag, fed by the host to the step after it
    unbounded = Sampling(max_tokens=50, temperature=0.0, top_k=top_k,
                         reasoning_ids=(ord("<"), ord(">")))
    (sink,) = run_jobs(FeedRecording(lambda p: "<abcdefgh>answer"), [("q", unbounded)],
                       run_ahead=run_ahead)
    assert sink.text == "<abcdefgh>answer" and sink.finish.n_reasoning == 10


def test_a_budget_the_block_stays_within_changes_nothing_and_runs_ahead():
    engine = FeedRecording(lambda p: "<ab>answer and more", n_slots=1)
    sampling = Sampling(max_tokens=50, temperature=0.0, reasoning_ids=(ord("<"), ord(">")),
                        reasoning_budget=12)
    (sink,) = run_jobs(engine, [("q", sampling)])
    assert sink.text == "<ab>answer and more" and sink.finish.n_reasoning == 4
    assert engine.fed_on_device > 5  # held back only while the budget was near
