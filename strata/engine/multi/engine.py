"""`SplitEngine`: one sequence through the stages of a `SplitModel`.

Each stage is the single-GPU engine's own machinery over its layer range — `DecodeStep` (a CUDA
graph per mode, replayed per token) and `PromptRun` (chunks, the ring, the loan) — and the engine
threads them: a step (or a prompt chunk) runs stage 0, its hidden state is handed to stage 1 and
so on; the last stage owns the head and the sampler, and the token it picks is handed back to
stage 0's history for the next step. Every stage keeps its own sequence length, advanced by its
own kernels. Every stage's prompt use passes its own plan's runtime contract. A short prompt
(up to `prompt_steps` tokens) runs as decode steps through the stages instead
(`strata.engine.cuda.prompt_steps`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np

from strata.engine.cuda import prompt_steps
from strata.engine.cuda.decode import DecodeStep
from strata.engine.cuda.prefill import PromptRun
from strata.engine.cuda.run_ahead import (TokenRing, clear_nan, device_params, nan_error, picks,
                                          put_params, run_ahead, step_mode)
from strata.engine.engine import ContextFullError, Engine, kept_positions
from strata.engine.interrupt import checkpoint
from strata.engine.multi.model import SplitModel, _null, _sim
from strata.engine.multi.tiers import TierDecodeStep
from strata.engine.sampler import SamplingParams
from strata.experts import DecodeHits, PrefillTraffic
from strata.plan import check_runtime_use, runtime_use


def _on(device: int):
    from numba import cuda
    return _null() if _sim() else cuda.gpus[device]


class SplitEngine(Engine):
    """qwen3moe over several GPUs, one stage each, exactly within each stage's plan."""

    backend = "cuda-split"

    def __init__(self, sm: SplitModel, *, use_graph: bool = True):
        self.sm = sm
        self.shape = sm.shape
        self.max_context = sm.plan.kv.max_context
        self.stages = sm.stages
        self.steps = []
        for m, dev, tiers in zip(self.stages, sm.devices, sm.tiers):
            with _on(dev):
                self.steps.append(DecodeStep(m, use_graph=use_graph) if tiers is None else
                                  TierDecodeStep(m, tiers, use_graph=use_graph))
        self.traffic = PrefillTraffic()
        # prompts up to this many tokens run as decode steps through every stage
        # (`prompt_steps`: the estimate sums the stages' prompt and step costs)
        self.prompt_steps = prompt_steps.limit(self.stages[0].options.prompt_steps,
                                               *(m.plan for m in self.stages))
        self.n_step_prompts = 0  # prompts that ran as decode steps
        self._n_past = 0
        self._logits = np.zeros(sm.shape.n_vocab, np.float32)  # [n_vocab] f32 host copy
        self.reset()

    @property
    def n_past(self) -> int:
        return self._n_past

    @property
    def last(self):
        return self.stages[-1]

    def _each(self):
        for g, (m, dev) in enumerate(zip(self.stages, self.sm.devices)):
            with _on(dev):
                yield g, m

    def reset(self) -> None:
        self._n_past = 0
        self._set_lengths(0, 0)

    def rewind(self, n_keep: int) -> None:
        """Keep the sequence's first `n_keep` positions on every stage; the next prefill appends
        after them (each stage's KV is positional: what lay past them is overwritten as it is
        recomputed). What lets serve's slot keep a finished turn's KV for the next
        (`PerSlotEngines`)."""
        self._n_past = kept_positions(n_keep, self._n_past)
        self._set_lengths(self._n_past, self._n_past)

    def _set_lengths(self, seq_len: int, n_tokens: int, *, seq: bool = True) -> None:
        for _, m in self._each():
            if seq:
                m.acts["seq_len"].copy_to_device(np.array([seq_len], np.int32), stream=m.stream)
            m.acts["n_tokens"].copy_to_device(np.array([n_tokens], np.int32), stream=m.stream)

    def _hand_on(self, g: int, src, dst) -> None:
        """Stage g's output into stage g+1's input (ordered after stage g's work)."""
        self.sm.links[g].copy(dst, src)

    # -- prompt ------------------------------------------------------------------------------

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        ids = self.check_tokens(tokens)
        if ids.size <= self.prompt_steps:
            return self._prefill_steps(ids)
        uses = [check_runtime_use(m.plan, runtime_use(m.plan, int(ids.size),
                                                      device=m.plan.devices[0].device.index))
                for m in self.stages]
        if len({u.chunk for u in uses}) != 1:
            raise RuntimeError(f"the stages' prompt chunks differ: {[u.chunk for u in uses]}")
        chunk = uses[0].chunk
        runs: list[PromptRun] = []
        try:
            for g, m in self._each():
                if uses[g].mode == "borrowed":
                    m.cache.lend(uses[g].lend_slots)
                P, R = m.arena.prompt_views(uses[g])
                runs.append(PromptRun(m, P, R, chunk, self.traffic))
            for off in range(0, ids.size, chunk):
                if off:
                    checkpoint()  # a cancelled request's prompt stops here (`interrupt`)
                part = ids[off:off + chunk]
                n = int(part.size)
                for g, _ in self._each():
                    if g:
                        self._hand_on(g - 1, runs[g - 1].P["hidden"][:n], runs[g].P["hidden"][:n])
                    runs[g].chunk_step(part, self._n_past)
                self._n_past += n
        finally:
            for _, m in self._each():
                m.cache.refill()
        self._set_lengths(self._n_past, self._n_past, seq=False)
        return self._read_logits()

    def _prefill_steps(self, ids: np.ndarray) -> np.ndarray:
        """A short prompt as decode steps (`prompt_steps`): its tokens into the histories the
        steps read (stage 0's embedding, the last stage's sampler), then one step a token."""
        arr = ids.astype(np.int32)  # [n] i32
        p, n = self._n_past, int(arr.size)
        for g, m in self._each():
            if g in (0, len(self.stages) - 1):
                m.acts["history"][0][p:p + n].copy_to_device(arr, stream=m.stream)
        for _ in range(n):
            self._step("logits")
        self._n_past += n
        self.n_step_prompts += 1
        self._set_lengths(self._n_past, self._n_past, seq=False)
        return self._read_logits()

    def _read_logits(self) -> np.ndarray:
        with _on(self.sm.devices[-1]):
            self.last.acts["logits"][0].copy_to_host(self._logits, stream=self.last.stream)
            self.last.stream.synchronize()
        return self._logits.copy()

    # -- decode --------------------------------------------------------------------------------

    def _step(self, mode: str) -> None:
        """One token through every stage (its input token is in stage 0's history)."""
        for g, _ in self._each():
            if g:
                self._hand_on(g - 1, self.stages[g - 1].acts["hidden"],
                              self.stages[g].acts["hidden"])
            self.steps[g].run(mode)

    def decode_step(self, token: int) -> np.ndarray:
        self.check_tokens([token])
        p = self._n_past
        one = np.array([token], np.int32)
        for g, m in self._each():
            if g in (0, len(self.stages) - 1):  # the embedding reads it, the sampler's history
                m.acts["history"][0][p:p + 1].copy_to_device(one, stream=m.stream)
        self._set_lengths(0, p + 1, seq=False)
        self._step("logits")
        self._n_past += 1
        return self._read_logits()

    picks = staticmethod(picks)  # the samplings `device_tokens` draws as the host does

    def device_tokens(self, sampling: SamplingParams | None, limit: int) -> Iterator[int]:
        """`CudaEngine.device_tokens` over the stages: each token picked on the last stage's
        GPU, read back from there one step behind, and handed back to stage 0 for its step."""
        if self._n_past == 0:
            raise ValueError("device_tokens needs a prefilled sequence")
        last, first_m, dev = self.last, self.stages[0], self.sm.devices[-1]
        hist, start = last.acts["history"][0], self._n_past
        nan = self.steps[-1].nan_flag
        with _on(dev):
            mode = _set_sampling(last, sampling)
            ring = TokenRing()  # pinned in the last GPU's context
            clear_nan(nan, last.stream)

        def first():
            with _on(dev):
                self.steps[-1].pick(mode, last.stream)
                return ring.fetch(hist, start, 0, last.stream, nan)

        def step(i):
            p = self._n_past
            if len(self.stages) > 1:
                self.sm.back.copy(first_m.acts["history"][0][p:p + 1], hist[p:p + 1])
            self._step(mode)
            self._n_past += 1
            with _on(dev):
                return ring.fetch(hist, start + i + 1, i + 1, last.stream, nan)

        def read(i, event):
            with _on(dev):
                return ring.read(i, event)

        def finish(undo):
            self._n_past -= int(undo)
            self._set_lengths(self._n_past, self._n_past)
            self.synchronize()

        return run_ahead(limit=limit, first=first, step=step, read=read, finish=finish,
                         can_step=lambda: self._n_past < self.max_context)

    def decode_tokens(self, n: int, sampling: SamplingParams | None = None) -> list[int]:
        """`n` tokens picked on the last stage's GPU, each handed back to stage 0 for the next
        step; read back once (see `CudaEngine.decode_tokens`)."""
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        if self._n_past == 0:
            raise ValueError("decode_tokens needs a prefilled sequence")
        if self._n_past + n - 1 > self.max_context:
            raise ContextFullError(f"{n} tokens after {self._n_past} exceed the context of "
                                   f"{self.max_context}")
        last, first = self.last, self.stages[0]
        nan = self.steps[-1].nan_flag
        with _on(self.sm.devices[-1]):
            mode = _set_sampling(last, sampling)
            clear_nan(nan, last.stream)
            self.steps[-1].pick(mode, last.stream)
        start = self._n_past
        for _ in range(n - 1):
            p = self._n_past
            if len(self.stages) > 1:
                self.sm.back.copy(first.acts["history"][0][p:p + 1],
                                  last.acts["history"][0][p:p + 1])
            self._step(mode)
            self._n_past += 1
        out, seen = np.zeros(n, np.int32), np.zeros(1, np.uint64)
        with _on(self.sm.devices[-1]):
            last.acts["history"][0][start:start + n].copy_to_host(out, stream=last.stream)
            nan.copy_to_host(seen, stream=last.stream)
            last.stream.synchronize()
        self._set_lengths(0, self._n_past, seq=False)
        self.synchronize()
        if seen[0]:
            raise nan_error(f"one of {n} steps")
        return [int(t) for t in out]

    # -- accounting ----------------------------------------------------------------------------

    def hits(self) -> DecodeHits:
        """Every stage's per-layer decode hit/miss counters, summed (each counts its own
        layers)."""
        total = np.zeros((self.shape.n_layer, 2), np.int64)
        for _, m in self._each():
            out = np.zeros((self.shape.n_layer, 2), np.int64)
            m.acts["hit_counts"].copy_to_host(out, stream=m.stream)
            m.stream.synchronize()
            total += out
        return DecodeHits(total)

    def tier_hits(self) -> np.ndarray:
        """[n_layer, n_stages] int64: decode hits served by the helper tier on each stage's card
        (counted by the stage whose layer it is; `hits()` counts them as hits too)."""
        total = np.zeros((self.shape.n_layer, len(self.stages)), np.int64)
        for g, m in self._each():
            t = self.sm.tiers[g]
            if t is not None:
                out = np.zeros_like(total)
                t.counts.copy_to_host(out, stream=m.stream)
                m.stream.synchronize()
                total += out
        return total

    def close(self) -> None:
        """Drain every stage, drop the decode graphs, then close the model (idempotent; see
        `SplitModel.close` for the order)."""
        if self.sm._closed:
            return
        self.synchronize()
        self.steps = []
        self.sm.close()

    def synchronize(self) -> None:
        for _, m in self._each():
            m.stream.synchronize()


def _set_sampling(m, sampling: SamplingParams | None) -> str:
    """The sampler's parameters on the stage that samples; returns the step mode."""
    if step_mode(sampling) == "greedy":
        return "greedy"
    seed = sampling.seed if sampling.seed is not None else time.time_ns()
    put_params(m.acts, 0, device_params(sampling, seed, m.shape.n_vocab), m.stream)
    return "sample"
