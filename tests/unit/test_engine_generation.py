"""The generation loop's stopping rules, streaming and logits, on a scripted engine (the loop is
backend-independent; the real engines are checked against references elsewhere), and the backend
registry."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from strata.engine import BackendError, Engine, Sampler, SamplingParams, generate, select_backend
from strata.engine import backends
from strata.gguf import ModelShape

N_VOCAB = 12


class ScriptedEngine(Engine):
    """Logits whose arg-max is the next token of `script`; records what it was fed."""

    backend = "scripted"

    def __init__(self, script, max_context=64):
        self.script = list(script)
        self.max_context = max_context
        self.shape = ModelShape(
            arch="test", n_layer=0, n_embd=1, n_head=1, n_head_kv=1, head_dim=1, n_expert=1,
            n_expert_used=1, n_ff_expert=1, n_vocab=N_VOCAB, n_ctx_train=max_context,
            rope_freq_base=1.0, rms_norm_eps=1e-6, global_tensors=(), layers=(), file_bytes=0)
        self.fed: list[int] = []
        self._n_past = 0
        self._step = 0

    @property
    def n_past(self):
        return self._n_past

    def reset(self):
        self._n_past = 0
        self._step = 0

    def _logits(self):
        z = np.zeros(N_VOCAB, np.float32)
        z[self.script[self._step]] = 1.0 + self._step
        self._step += 1
        return z

    def prefill(self, tokens):
        ids = self.check_tokens(tokens)
        self.fed += ids.tolist()
        self._n_past += ids.size
        return self._logits()

    def decode_step(self, token):
        return self.prefill([token])


class PickingEngine(ScriptedEngine):
    """A ScriptedEngine that picks its tokens itself, as the CUDA engine does on the device
    (`device_tokens`): it feeds each token before the caller has read it, and undoes that when
    the caller stops there."""

    def __init__(self, script, max_context=64):
        super().__init__(script, max_context)
        self.closed = 0

    @staticmethod
    def picks(sampling):
        return sampling.temperature == 0

    def device_tokens(self, sampling, limit):
        assert sampling.temperature == 0 and limit >= 1
        n_read = fed = 0
        try:
            while True:
                tok = self.script[self._step - 1]  # the arg-max of the current logits
                more = n_read + 1 < limit and self._n_past < self.max_context
                if more:
                    self.decode_step(tok)
                    fed += 1
                n_read += 1
                yield tok
                if not more:
                    return
        finally:
            self.closed += 1
            if fed == n_read:
                self._n_past -= 1
                self.fed.pop()


class Letters:
    """A text stream that spells token t as chr(ord('a') + t), holding token 11 back until the
    next token (like half of a UTF-8 character)."""

    def __init__(self):
        self.held = ""

    def push(self, t):
        out, self.held = self.held, ""
        if t == 11:
            self.held = "!"
            return out
        return out + chr(ord("a") + t)

    def flush(self):
        out, self.held = self.held, ""
        return out


GREEDY = SamplingParams(temperature=0)


def test_stops_at_a_stop_token_which_adds_no_text():
    eng = ScriptedEngine([1, 2, 9, 3])
    pieces = []
    g = generate(eng, [4, 5], n_predict=10, sampler=Sampler(GREEDY), stop_ids={9},
                 text=Letters(), on_text=pieces.append)
    assert g.tokens == [1, 2, 9] and g.stop_reason == "stop"
    assert g.text == "bc" and pieces == ["b", "c"]
    assert eng.fed == [4, 5, 1, 2]  # the stop token is never decoded


def test_stops_after_n_predict_tokens_and_keeps_each_choosing_row():
    eng = ScriptedEngine([1, 11, 3, 4, 5])
    g = generate(eng, [0], n_predict=3, sampler=Sampler(GREEDY), text=Letters(), keep_logits=True)
    assert g.tokens == [1, 11, 3] and g.stop_reason == "length"
    assert g.text == "b!d"  # the held piece comes out with the next token
    assert g.logits.shape == (3, N_VOCAB) and g.logits.dtype == np.float32
    assert np.argmax(g.logits, axis=1).tolist() == g.tokens
    assert g.prompt_tokens == 1 and g.prefill_s >= 0 and g.decode_s >= 0


def test_stops_when_the_context_is_full():
    eng = ScriptedEngine([1, 2, 3, 4, 5, 6], max_context=4)
    g = generate(eng, [7, 8], n_predict=10, sampler=Sampler(GREEDY))
    # positions 0..3 hold the prompt and two decoded tokens; the third token comes from them
    assert g.tokens == [1, 2, 3] and g.stop_reason == "context"
    assert eng.n_past == 4


def test_a_reused_engine_starts_a_fresh_sequence():
    eng = ScriptedEngine([1, 2, 3])
    generate(eng, [0], n_predict=2, sampler=Sampler(GREEDY))
    g = generate(eng, [0], n_predict=2, sampler=Sampler(GREEDY))
    assert g.tokens == [1, 2] and eng.n_past == 2


def test_the_prompt_feeds_the_repeat_penalty():
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0))
    generate(ScriptedEngine([1, 2]), [5, 6], n_predict=2, sampler=s)
    assert list(s.recent) == [5, 6, 1, 2]


def test_n_predict_must_be_positive():
    with pytest.raises(ValueError, match="n_predict must be at least 1"):
        generate(ScriptedEngine([1]), [0], n_predict=0, sampler=Sampler(GREEDY))


def _fake_backend(monkeypatch, name, reason):
    """Register a backend module `name` whose unavailable_reason() is `reason`."""
    mod = types.ModuleType(name)
    mod.unavailable_reason = lambda: reason
    mod.engine_factory = lambda model, **kw: (lambda: ("engine of", name))
    monkeypatch.setitem(sys.modules, name, mod)
    return mod


@pytest.fixture
def registry(monkeypatch):
    """A registry of: a GPU backend without a GPU, one absent from the build, the real CPU."""
    _fake_backend(monkeypatch, "fake_gpu_backend", "no CUDA GPU is visible to numba")
    monkeypatch.setattr(backends, "BACKENDS", (
        backends.Backend("cuda", "fake_gpu_backend", "the CUDA engine (GPU)"),
        backends.Backend("tpu", "strata.engine.no_such_backend", "the TPU engine"),
        backends.Backend("cpu", "strata.engine.cpu", "the CPU engine (numba)"),
    ))


def test_auto_takes_the_first_backend_that_can_run(registry, monkeypatch):
    assert select_backend("auto")[0] == "cpu"
    assert select_backend("cpu")[0] == "cpu"
    _fake_backend(monkeypatch, "fake_gpu_backend", None)  # now a GPU is there
    name, mod = select_backend("auto")
    assert name == "cuda" and mod.engine_factory(None)() == ("engine of", "fake_gpu_backend")


def test_a_backend_that_cannot_run_is_a_clear_error(registry):
    with pytest.raises(BackendError, match=r"--backend cuda: no CUDA GPU is visible to numba; "
                                           r"available here: cpu"):
        select_backend("cuda")
    with pytest.raises(BackendError, match=r"--backend tpu: the TPU engine is not available in "
                                           r"this build of strata; available here: cpu"):
        select_backend("tpu")
    with pytest.raises(BackendError, match="unknown backend 'gpu'"):
        select_backend("gpu")


def test_the_cli_offers_every_registered_backend():
    import argparse

    from strata.cli import generate as cli

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    choices = next(a.choices for a in p._actions if a.dest == "backend")
    assert tuple(choices) == backends.CHOICES == ("auto", "cuda", "cpu")


@pytest.mark.parametrize("how", ["stop", "length", "context"])
def test_a_picking_engine_stops_where_the_host_loop_does(how):
    """Each stopping rule with the engine choosing the tokens: the same tokens, text, reason,
    tokens fed and n_past as the host choosing from the same logits."""
    kw = dict(stop={"stop_ids": {9}}, length={"n_predict": 3}, context={})[how]
    n_predict = kw.pop("n_predict", 10)
    results = []
    for cls in (ScriptedEngine, PickingEngine):
        eng = cls([1, 11, 9, 3, 4, 5, 6], max_context=5 if how == "context" else 64)
        s = Sampler(SamplingParams(temperature=0, repeat_penalty=1.5))
        g = generate(eng, [7, 8], n_predict=n_predict, sampler=s, text=Letters(), **kw)
        results.append((g.tokens, g.text, g.stop_reason, eng.fed, eng.n_past, list(s.recent)))
        if cls is PickingEngine:
            assert eng.closed == 1
    assert results[0] == results[1]
    assert results[0][2] == how


def test_kept_logits_are_the_hosts_choice():
    eng = PickingEngine([1, 2, 3])
    g = generate(eng, [0], n_predict=2, sampler=Sampler(GREEDY), keep_logits=True)
    assert g.tokens == [1, 2] and g.logits.shape == (2, N_VOCAB) and eng.closed == 0


def test_the_host_samples_what_the_engine_would_not_pick_alike():
    eng = PickingEngine([1, 2, 3])
    s = Sampler(SamplingParams(temperature=0.7, top_k=0, seed=1))  # PickingEngine: greedy only
    g = generate(eng, [0], n_predict=2, sampler=s)
    assert len(g.tokens) == 2 and eng.closed == 0


def test_a_constrained_sampler_is_never_left_to_the_device():
    """Greedy the engine would pick itself, but under a constraint only the host keeps: every
    token comes from the host's sampler (the constraint refuses the script's token 2)."""
    class NoTwo:
        def allows(self, token):
            return token != 2

        def advance(self, token):
            assert token != 2

    eng = PickingEngine([1, 2, 3])
    g = generate(eng, [0], n_predict=3, sampler=Sampler(SamplingParams(temperature=0), NoTwo()))
    assert eng.closed == 0 and 2 not in g.tokens and len(g.tokens) == 3


def test_the_cuda_engine_picks_only_what_it_draws_as_the_host_does():
    from strata.cuda_kernels.sampling import THREADS  # the penalty window the block holds
    from strata.engine.cuda.engine import CudaEngine
    assert CudaEngine.picks(None) and CudaEngine.picks(SamplingParams(temperature=0, top_k=0))
    assert CudaEngine.picks(SamplingParams(temperature=0.8, top_k=40))
    assert CudaEngine.picks(SamplingParams(temperature=0.8, top_k=256, repeat_penalty=1.1,
                                           repeat_last_n=THREADS))
    # top-k 0: every token, drawn on the device without a cut; with one, left to the host
    assert CudaEngine.picks(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0))
    assert CudaEngine.picks(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                           repeat_penalty=1.3, repeat_last_n=THREADS))
    assert not CudaEngine.picks(SamplingParams(temperature=1.0, top_k=0))  # top-p 0.95
    assert not CudaEngine.picks(SamplingParams(temperature=1.0, top_k=0, top_p=1.0))  # min-p
    assert not CudaEngine.picks(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                               repeat_penalty=1.3, repeat_last_n=THREADS + 1))
    assert not CudaEngine.picks(SamplingParams(temperature=1.0, top_k=257))
    assert not CudaEngine.picks(SamplingParams(temperature=1.0, repeat_penalty=1.1,
                                               repeat_last_n=THREADS + 1))
    assert CudaEngine.picks(SamplingParams(temperature=1.0, repeat_last_n=THREADS + 1))  # off
    # greedy and the presence / frequency penalties keep to the window the block holds too
    assert not CudaEngine.picks(SamplingParams(temperature=0, repeat_penalty=1.3,
                                               repeat_last_n=THREADS + 1))
    assert CudaEngine.picks(SamplingParams(temperature=0, presence_penalty=0.5,
                                           repeat_last_n=THREADS))
    assert not CudaEngine.picks(SamplingParams(temperature=0.8, frequency_penalty=0.5,
                                               repeat_last_n=THREADS + 1))
    # a logit bias goes in the device's table (the sampler's, even greedy: the argmax kernel
    # has none), up to MAX_BIAS entries; past that the host samples it
    from strata.cuda_kernels.sampling import MAX_BIAS
    from strata.engine.cuda.batch import CudaBatchEngine
    from strata.engine.cuda.run_ahead import may_fall_back, step_mode
    for p in (SamplingParams(temperature=0, logit_bias=((5, 1.0),)),
              SamplingParams(temperature=0.8, top_k=40, logit_bias=((5, -100.0),)),
              SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                             logit_bias=((5, 2.0),))):
        assert CudaEngine.picks(p) and CudaBatchEngine.picks(p) and step_mode(p) == "sample"
        assert not may_fall_back(p)
    cut = SamplingParams(temperature=1.0, top_k=0, logit_bias=((5, 2.0),))  # top-p 0.95
    assert not CudaEngine.picks(cut) and may_fall_back(cut)
    many = tuple((t, 1.0) for t in range(MAX_BIAS + 1))
    for p in (SamplingParams(temperature=0, logit_bias=many),
              SamplingParams(temperature=1.0, top_k=0, logit_bias=many)):
        assert not CudaEngine.picks(p) and not may_fall_back(p)
    assert CudaEngine.picks(SamplingParams(temperature=0, logit_bias=many[:MAX_BIAS]))


def test_greedy_with_a_penalty_runs_the_sampler_not_the_argmax():
    """The argmax kernel sees the logits as they are: a penalised greedy sequence is the
    sampler's (temperature 0: the arg-max of the penalised logits), as the host's would be."""
    from strata.engine.cuda.run_ahead import step_mode
    assert step_mode(None) == "greedy" and step_mode(SamplingParams(temperature=0)) == "greedy"
    assert step_mode(SamplingParams(temperature=0, repeat_last_n=0, repeat_penalty=2.0)) == "greedy"
    for kw in (dict(repeat_penalty=1.1), dict(presence_penalty=0.5),
               dict(frequency_penalty=-0.5)):
        assert step_mode(SamplingParams(temperature=0, **kw)) == "sample", kw
    assert step_mode(SamplingParams(temperature=0.7)) == "sample"
